"""Which buffered calls an update keeps under ``policies.X.max_staleness``, and the figures it reports."""

from masrl.worker.updater.batching import Sample
from masrl.worker.updater.updater import fresh_samples


def _sample(i: int, version: int) -> Sample:
    return Sample(f"c{i}", "p", [1, 2], [3], [-0.5], 1.0, {}, version=version)


def test_calls_older_than_the_bound_leave_the_update_and_are_counted():
    samples = [_sample(0, 5), _sample(1, 4), _sample(2, 3), _sample(3, 3), _sample(4, 1)]
    keep, stats = fresh_samples(samples, 5, max_staleness=2)
    assert [s.call_id for s in keep] == ["c0", "c1", "c2", "c3"]
    assert stats["stale_dropped"] == 1.0 and stats["staleness_max"] == 4.0
    assert stats["staleness_mean"] == (0 + 1 + 2 + 2 + 4) / 5
    assert (stats["staleness_0"], stats["staleness_2"], stats["staleness_4"]) == (1.0, 2.0, 1.0)
    every, unbounded = fresh_samples(samples, 5, max_staleness=None)
    assert every == samples and unbounded["stale_dropped"] == 0.0
    assert fresh_samples([], 5, 0) == ([], {"staleness_mean": 0.0, "staleness_max": 0.0, "stale_dropped": 0.0})

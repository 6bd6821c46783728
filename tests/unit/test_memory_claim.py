"""Which host answers for a device's peak: the newest enrolled, until it closes; a finished run's host
that is still referenced never silences the next run's (it did, in the GPU suite)."""

from masrl.worker.model import memory


class Host:
    pass


def test_the_newest_host_reports_the_peak_and_a_closed_one_hands_it_on():
    old, new, other = Host(), Host(), Host()
    memory.enroll({"cuda:7", "cpu"}, old)
    assert memory.claim("cuda:7", old)
    memory.enroll({"cuda:7"}, new)
    assert memory.claim("cuda:7", new) and not memory.claim("cuda:7", old)  # old is still alive, yet silent
    memory.unclaim(new)
    assert memory.claim("cuda:7", other) and not memory.claim("cuda:7", new)  # nobody held it: the first to ask
    assert "cpu" not in memory._OWNERS
    memory.unclaim(other)

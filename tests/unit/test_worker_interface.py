"""One worker interface: every kind of host implements all of it, with the interface's signatures,
and the Ray proxy and the data-parallel fan-out are generated from it."""

import inspect
import subprocess
import sys

import pytest

from masrl.config import EngineConfig
from masrl.driver.placement.hosts import RankedHost, RemoteHost
from masrl.errors import MasrlError
from masrl.policies import PolicySpec
from masrl.worker.endpoint import EndpointHost
from masrl.worker.interface import METHODS, PolicyHost
from masrl.worker.policy_worker import PolicyWorker

KINDS = [PolicyWorker, RemoteHost, RankedHost, EndpointHost]


@pytest.mark.parametrize("cls", KINDS, ids=lambda c: c.__name__)
def test_every_kind_of_host_implements_every_method_with_its_signature(cls):
    assert issubclass(cls, PolicyHost) and not cls.__abstractmethods__
    for name in METHODS:
        declared = inspect.signature(getattr(PolicyHost, name))
        own = getattr(cls, name)
        if getattr(own, "__qualname__", "").startswith(("RemoteHost.", "RankedHost.")) and \
                own.__code__.co_varnames[:2] == ("self", "args"):
            continue  # generated: forwards *args, **kwargs as the interface takes them
        got = inspect.signature(own)
        # ray.remote(PolicyWorker), once any Ray test has run, adds its tracing keyword to the class's methods
        params = [p for p in got.parameters if p != "_ray_trace_ctx"]
        assert params == list(declared.parameters), (cls.__name__, name, got, declared)


def test_a_host_missing_a_method_cannot_be_built():
    class Partial(PolicyHost):
        def generate(self, calls):
            return []

    with pytest.raises(TypeError, match="abstract"):
        Partial()


class Rank:
    """A stand-in rank: records what it was asked (the real ranks are Ray actors, tested in
    tests/integration/test_data_parallel.py)."""

    def __init__(self, i):
        self.i, self.name, self.seen = i, f"h-rank{i}", []
        self.specs, self.policy_names, self.trainable_names = {}, ["p"], ["p"]

    def __getattr__(self, method):
        def call(*args, **kwargs):
            self.seen.append((method, args, kwargs))
            return {"generate": lambda: [f"r{self.i}:{c}" for c in args[0]],
                    "commit_rewards": lambda: len(args[0]),
                    "train_step": lambda: {"p": {"n_seqs": 2.0, "loss": float(self.i)}},
                    "advantages": lambda: {f"c{self.i}": 0.5},
                    "get_step": lambda: 7 + self.i,
                    "where": lambda: [{"name": self.name}],
                    "take_traffic": lambda: {"generate": [1, 10, 20, 0.5]}}.get(method, lambda: None)()

        return call


def test_the_data_parallel_fan_out_follows_the_interface():
    ranks = [Rank(0), Rank(1), Rank(2)]
    group = RankedHost(ranks)
    assert group.name == "h"
    assert group.generate(["a", "b", "c", "d"]) == ["r0:a", "r0:b", "r1:c", "r1:d"]  # split, in order
    assert ranks[2].seen == []  # an empty share is not sent
    assert group.commit_rewards({"a": 1.0}) == 3  # every rank; summed
    assert group.train_step(None) == {"p": {"n_seqs": 6.0, "loss": 0.0}}  # counts add up, the rest is rank 0's
    assert group.advantages() == {"c0": 0.5, "c1": 0.5, "c2": 0.5}
    assert group.get_step() == 7 and all(m[0] != "get_step" for r in ranks[1:] for m in r.seen)  # rank 0 answers
    assert [w["name"] for w in group.where()] == ["h-rank0", "h-rank1", "h-rank2"]
    assert group.take_traffic() == {"generate": [3, 30, 60, 1.5]}
    group.save("/tmp/x")
    assert all(("save", ("/tmp/x",), {}) in r.seen for r in ranks)
    with pytest.raises(MasrlError, match="rewarded: a data-parallel policy's calls are spread over its ranks"):
        group.rewarded(["p"])
    group.close()


def test_an_endpoint_host_answers_the_whole_interface():
    eng = EngineConfig(base_url="http://127.0.0.1:9/v1", model="m")
    h = EndpointHost(PolicySpec("judge", "m", trainable=False, engine=eng), eng)
    assert h.get_tokenizer() is None and h.train_step() == {} and h.commit_rewards({"x": 1.0}) == 0
    assert h.take_traffic() == {} and h.where()[0]["url"] == "http://127.0.0.1:9/v1/chat/completions"
    with h.evaluating():
        pass
    with pytest.raises(MasrlError, match="an endpoint gives no logprobs"):
        h.score("judge", [])
    h.close()


def test_the_driver_side_imports_no_torch():
    code = ("import sys; import masrl.driver.rollout.controller, masrl.driver.run.loop, masrl.driver.builder, "
            "masrl.driver.placement.hosts, masrl.worker.interface; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_memory_rows_are_summed_per_process_and_gpu():
    from masrl.driver.observe.metrics import memory_summary

    one = [{"device": "cuda:0", "process": 7, "weights": 1.0, "optimizer": 2.0, "peak_gib": 5.0, "reserved_gib": 6.0},
           {"device": "cuda:0", "process": 7, "weights": 0.5, "engine_kv": 1.5}]
    got = memory_summary(one)
    assert list(got) == ["cuda:0"] and got["cuda:0"]["weights"] == 1.5 and got["cuda:0"]["engine_kv"] == 1.5
    assert got["cuda:0"]["peak_gib"] == 5.0 and got["cuda:0"]["optimizer"] == 2.0
    two = one + [{"device": "cuda:0", "process": 8, "weights": 3.0, "peak_gib": 4.0, "reserved_gib": 4.5}]
    assert sorted(memory_summary(two)) == ["cuda:0@7", "cuda:0@8"]  # Ray actors each see their GPU as cuda:0


def test_paged_pools_report_their_fullest_point_and_preemptions_in_the_step():
    """Two paged hosts on one GPU: pre-emptions add up, the fullest pool counts, and the step's line says
    which setting to raise when calls were pre-empted."""
    from masrl.driver.observe.metrics import memory_summary, step_line

    rows = [{"device": "cuda:0", "process": 7, "engine_kv": 2.0, "engine_preemptions": 3.0, "engine_pool_peak": 0.97},
            {"device": "cuda:0", "process": 7, "engine_kv": 2.0, "engine_preemptions": 1.0, "engine_pool_peak": 0.40},
            {"device": "cuda:0", "process": 7, "weights": 1.0, "peak_gib": 9.0}]
    got = memory_summary(rows)["cuda:0"]
    assert got["engine_preemptions"] == 4.0 and got["engine_pool_peak"] == 0.97 and got["engine_kv"] == 4.0
    rec = {"rollout": {"outcome": 0.5, "reward": 0.5}, "rollout_s": 1.0, "update_s": 1.0, "gpu_peak_gib": 9.0,
           "memory": {"cuda:0": got}}
    assert "kv pool 97%, 4 pre-empted (raise rollout.gpu_memory_utilization)" in step_line(1, 2, rec)
    got["engine_preemptions"] = 0.0
    line = step_line(1, 2, rec)
    assert "kv pool 97%" in line and "pre-empted" not in line
    assert "kv pool" not in step_line(1, 2, {**rec, "memory": {"cuda:0": memory_summary(rows[2:])["cuda:0"]}})

"""Infrastructure failures are recorded on the trace and excluded from training."""

import asyncio

from masrl.config import load_config
from masrl.runtime.loop import Trainer
from tinycfg import tiny_config


class Flaky:
    """A math_solver that raises on some tasks and stalls on others."""

    name = "flaky"

    def __init__(self):
        from masrl.workflows.math_solver import MathSolver

        self.inner = MathSolver()

    def roles(self):
        return self.inner.roles()

    async def run(self, task, ctx):
        await self.inner.run(task, ctx)
        if ctx.trace.sample_idx == 1:
            raise RuntimeError("bug in user code")
        if ctx.trace.sample_idx == 2:
            await asyncio.sleep(30)

    def score(self, trace, task):
        return self.inner.score(trace, task)


def test_failed_traces_are_recorded_and_their_calls_dropped(tmp_path, monkeypatch):
    import masrl.workflows as wf

    monkeypatch.setitem(wf.REGISTRY, "flaky", Flaky)
    data = tiny_config("math_solver", tmp_path, steps=1)
    data["workflow"] = {"name": "flaky"}
    data["rollout"].update(samples_per_task=3, trace_timeout_s=3)
    cfg = load_config(data=data)
    tr = Trainer(cfg, run_dir=tmp_path)
    tr.prepare(resume=False)
    rec = asyncio.run(tr.train_step())
    traces = tr._last_traces
    by_sample = {k: [t for t in traces if t.sample_idx == k] for k in range(3)}
    assert all(t.error is None for t in by_sample[0])
    assert all("RuntimeError: bug in user code" in t.error for t in by_sample[1])
    assert all("timed out" in t.error for t in by_sample[2])
    assert rec["rollout"]["failed"] == 4 and rec["rollout"]["traces"] == 6
    # only the two good traces' calls reached the update
    assert rec["policies"]["solver"]["n_seqs"] == 2
    assert "first_error" in rec["rollout"]
    asyncio.run(tr.rt.controller.aclose())


def test_call_timeout_is_an_infrastructure_failure(tmp_path):
    data = tiny_config("math_solver", tmp_path, steps=1)
    data["rollout"].update(call_timeout_s=0.001)
    cfg = load_config(data=data)
    tr = Trainer(cfg, run_dir=tmp_path)
    tr.prepare(resume=False)
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["failed"] == rec["rollout"]["traces"]
    assert "timed out after" in tr._last_traces[0].error
    assert rec["policies"] == {}
    asyncio.run(tr.rt.controller.aclose())

"""Infrastructure failures are recorded and excluded from training (and too many stop the run);
a bug in a workflow, parser, scorer or reward stops the run at once with its traceback and task."""

import asyncio

import pytest
from tinycfg import tiny_config

from masrl.config import load_config
from masrl.driver.run.loop import Trainer
from masrl.errors import ConfigError, InfraError, MasrlError, WorkflowBug


class Flaky:
    """A math_solver whose infrastructure fails on some samples and stalls on others."""

    name = "flaky"

    def __init__(self):
        from masrl.families.math.solver import MathSolver

        self.inner = MathSolver()

    def roles(self):
        return self.inner.roles()

    async def run(self, task, ctx):
        await self.inner.run(task, ctx)
        if ctx.trace.sample_idx == 1:
            raise InfraError("the retrieval backend went away")
        if ctx.trace.sample_idx == 2:
            await asyncio.sleep(30)

    def score(self, trace, task):
        return self.inner.score(trace, task)


class Buggy(Flaky):
    name = "buggy"

    def __init__(self, bug: str = "run"):
        super().__init__()
        self.bug = bug

    async def run(self, task, ctx):
        if self.bug == "agent":
            await ctx.call("solvr", [{"role": "user", "content": task.question}])  # a misspelled agent
        await self.inner.run(task, ctx)

    def score(self, trace, task):
        if self.bug == "score":
            return {"outcome": 1.0 / 0}
        if self.bug == "no_outcome":
            return {"accuracy": 1.0}
        return self.inner.score(trace, task)


def test_failed_traces_are_recorded_and_their_calls_dropped(tmp_path, monkeypatch):
    import masrl.families as fam

    monkeypatch.setitem(fam.WORKFLOWS, "flaky", Flaky)
    data = tiny_config("math/solver", tmp_path, steps=1)
    data["workflow"] = {"name": "flaky"}
    data["rollout"].update(samples_per_task=3, trace_timeout_s=3)
    cfg = load_config(data=data)
    tr = Trainer(cfg, run_dir=tmp_path)
    tr.prepare(resume=False)
    rec = asyncio.run(tr.train_step())
    traces = tr.last_traces
    by_sample = {k: [t for t in traces if t.sample_idx == k] for k in range(3)}
    assert all(t.error is None for t in by_sample[0])
    assert all("retrieval backend went away" in t.error for t in by_sample[1])
    assert all("timed out" in t.error for t in by_sample[2])
    assert rec["rollout"]["failed"] == 4 and rec["rollout"]["traces"] == 6
    # only the two good traces' calls reached the update
    assert rec["policies"]["solver"]["n_seqs"] == 2
    assert "first_error" in rec["rollout"]
    # 4 of 6 is over the default limit of half: the run stops and lists the first errors
    with pytest.raises(MasrlError, match=r"4 of 6 traces failed .*\n  - .*(backend went away|timed out)"):
        tr._check_failures(rec["rollout"], traces)
    asyncio.run(tr.rt.controller.aclose())


@pytest.mark.parametrize("bug,needle", [("agent", "KeyError: .*the workflow called agent 'solvr'"),
                                        ("score", "ZeroDivisionError")])
def test_a_bug_stops_the_run_with_its_traceback_and_task(tmp_path, monkeypatch, bug, needle):
    import masrl.families as fam

    monkeypatch.setitem(fam.WORKFLOWS, "buggy", Buggy)
    data = tiny_config("math/solver", tmp_path, steps=1)
    data["workflow"] = {"name": "buggy", "options": {"bug": bug}}
    tr = Trainer(load_config(data=data), run_dir=tmp_path)
    tr.prepare(resume=False)
    with pytest.raises((WorkflowBug, KeyError), match=needle) as info:
        asyncio.run(tr.train_step())
    if info.type is WorkflowBug:
        assert "task arith-" in str(info.value) and "Traceback" in str(info.value)
    asyncio.run(tr.rt.controller.aclose())


def test_a_reward_that_cannot_read_the_score_fails_every_trace_and_the_run_stops_naming_it(tmp_path, monkeypatch):
    """The outcome reward over a score() without 'outcome': reward code fails its traces (issue 60), every one
    here, so the run stops with the allocator's message rather than training on nothing."""
    import masrl.families as fam

    monkeypatch.setitem(fam.WORKFLOWS, "buggy", Buggy)
    data = tiny_config("math/solver", tmp_path, steps=1)
    data["workflow"] = {"name": "buggy", "options": {"bug": "no_outcome"}}
    tr = Trainer(load_config(data=data), run_dir=tmp_path)
    tr.prepare(resume=False)
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["failed"] == rec["rollout"]["traces"]
    with pytest.raises(MasrlError, match=r"reward allocator 'outcome' on task arith-.*returned \['accuracy'\]"):
        tr._check_failures(rec["rollout"], tr.last_traces)
    asyncio.run(tr.rt.controller.aclose())


def test_reward_options_a_type_does_not_use_are_config_errors():
    base = {"policies": {"p": {}}, "agents": {"solver": {"policy": "p"}}, "workflow": {"name": "math_solver"}}
    with pytest.raises(ConfigError, match="per_agent only apply to the format reward, not 'outcome'"):
        load_config(data=dict(base, rewards=[{"type": "outcome", "per_agent": {"solver": 2.0}}]))
    with pytest.raises(ConfigError, match="penalty only apply to the format reward"):
        load_config(data=dict(base, rewards=[{"type": "turn_delta", "penalty": 0.1}]))
    load_config(data=dict(base, rewards=[{"type": "format", "per_agent": {"solver": 2.0}, "penalty": 0.1}]))


def test_call_timeout_is_an_infrastructure_failure(tmp_path):
    data = tiny_config("math/solver", tmp_path, steps=1)
    data["rollout"].update(call_timeout_s=0.001)
    cfg = load_config(data=data)
    tr = Trainer(cfg, run_dir=tmp_path)
    tr.prepare(resume=False)
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["failed"] == rec["rollout"]["traces"]
    assert "timed out after" in tr.last_traces[0].error and "rollout.call_timeout_s" in tr.last_traces[0].error
    assert rec["policies"] == {}
    asyncio.run(tr.rt.controller.aclose())


def test_an_evaluation_whose_traces_fail_stops_instead_of_reporting_an_accuracy(tmp_path, monkeypatch):
    """96 of 96 held-out traces failed on a GPU host (out of memory) and the run printed
    "accuracy 0.000" as a result; past rollout.max_failed_fraction an evaluation stops like a step."""
    import masrl.families as fam

    monkeypatch.setitem(fam.WORKFLOWS, "flaky", Flaky)
    data = tiny_config("math/solver", tmp_path, steps=0)
    data["workflow"] = {"name": "flaky"}
    data["rollout"].update(trace_timeout_s=3)
    data["eval"] = {"samples_per_task": 3, "temperature": 0.7}
    tr = Trainer(load_config(data=data), run_dir=tmp_path)
    tr.prepare(resume=False)
    with pytest.raises(MasrlError, match=r"evaluation \(eval\): 6 of 9 traces failed .*no held-out figures"):
        asyncio.run(tr.evaluate())
    data["rollout"]["max_failed_fraction"] = 0.7  # 6 of 9 is within it: the figures are reported
    tr = Trainer(load_config(data=data), run_dir=tmp_path / "b")
    tr.prepare(resume=False)
    summary = asyncio.run(tr.evaluate())
    assert summary["failed"] == 6 and summary["traces"] == 9


def test_a_retriever_keeps_jax_off_the_gpu():
    import os
    import subprocess
    import sys

    code = "import os, masrl.tools.retrieval.index; print(os.environ.get('JAX_PLATFORMS'))"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "cpu", out.stderr
    env["JAX_PLATFORMS"] = "cuda"  # the user's own choice stands
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "cuda", out.stderr


def test_an_update_out_of_gpu_memory_stops_the_run_naming_the_settings_that_bound_it(tmp_path, monkeypatch):
    """No GPU here: torch's own CUDA out-of-memory error is raised where the update would raise it;
    the worker, the trainer and the message are the real ones."""
    import torch

    from masrl.worker.updater.training import Learner

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 46.00 MiB. GPU 0 has a total capacity of "
                                     "139.80 GiB of which 29.75 MiB is free.\nmore torch text")

    data = tiny_config("math/solver", tmp_path, steps=1)
    data["algorithm"]["micro_batch_tokens"] = 16384
    tr = Trainer(load_config(data=data), run_dir=tmp_path)
    tr.prepare(resume=False)
    monkeypatch.setattr(Learner, "train", out_of_memory)
    with pytest.raises(MasrlError) as info:
        asyncio.run(tr.train_step())
    msg = str(info.value)
    assert "the update of policy 'solver' ran out of GPU memory" in msg and "this was its first update" in msg
    assert "algorithm.micro_batch_tokens=16384" in msg and "e.g. algorithm.micro_batch_tokens=4096" in msg
    assert "algorithm.activation_checkpointing=true" in msg and "rollout.gpu_memory_utilization" in msg
    assert "torch said: CUDA out of memory. Tried to allocate 46.00 MiB" in msg and "more torch text" not in msg
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)
    asyncio.run(tr.rt.controller.aclose())


@pytest.mark.parametrize("said, stops", [
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
    ("Expected mha_graph.execute(handle, variant_pack, workspace_ptr.get()).is_good() to be true", False),
    ("shape '[4, 8]' is invalid for input of size 30", False)])
def test_an_update_that_cublas_cannot_allocate_for_says_so_and_other_errors_stay_themselves(said, stops, tmp_path,
                                                                                            monkeypatch):
    """cuBLAS's words for an empty device get the memory message; a cuDNN failure only on a nearly full
    device (this CPU run has none, so it stays torch's error), and any other error is left as it was."""
    from masrl.worker.updater.training import Learner

    def fails(*args, **kwargs):
        raise RuntimeError(said)

    tr = Trainer(load_config(data=tiny_config("math/solver", tmp_path, steps=1)), run_dir=tmp_path)
    tr.prepare(resume=False)
    monkeypatch.setattr(Learner, "train", fails)
    with pytest.raises(MasrlError if stops else RuntimeError) as info:
        asyncio.run(tr.train_step())
    if stops:
        assert "ran out of GPU memory" in str(info.value) and "CUBLAS_STATUS_ALLOC_FAILED" in str(info.value)
    else:
        assert not isinstance(info.value, MasrlError) and str(info.value) == said
    asyncio.run(tr.rt.controller.aclose())

"""Asynchronous rollouts on this CPU with tiny-random: episodes keep running through updates, groups
are whole, every finished call trains once, calls carry their weights' version, and a run killed
with SIGKILL resumes."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from tinycfg import prepared_trainer, run_async, tiny_config

from masrl.driver.run import rundir as ckpt

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]


def _data(run_dir, steps=3, **rollout):
    data = tiny_config("math/team_shared", run_dir, steps=steps)
    data["rollout"].update(mode="async", **rollout)
    return data


def test_async_updates_train_whole_groups_once_each_and_tag_versions(tmp_path):
    tr, workers, before = prepared_trainer(_data(tmp_path), tmp_path)
    w = workers["shared"]

    recs, traces = run_async(tr, 3)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(r["async"]["episodes_running_at_update"] > 0 for r in recs)  # episodes ran on through updates
    assert all(r["rollout"]["traces"] == 2 * 3 for r in recs)  # every update took tasks_per_step whole groups
    assert all(n == 3 for n in Counter(t.task_id for t in traces).values())
    trained = sum(r["policies"]["shared"]["n_seqs"] for r in recs)
    assert trained == sum(len(t.calls) for t in traces)  # every finished call trained once, none lost
    assert max(c.policy_version for t in traces for c in t.calls) >= 1  # later episodes sampled newer weights
    assert any(r["policies"]["shared"]["staleness_max"] >= 1 for r in recs[1:])  # and some were a version behind
    assert not w.sampler.buffer  # what was still running was dropped with the episodes
    assert w.fingerprint("shared") != before["shared"]


@pytest.mark.parametrize("bound", [0, 1])
def test_max_staleness_bounds_how_far_episodes_run_ahead_and_drops_what_is_older(tmp_path, bound):
    """With max_staleness s no task starts beyond ``(updates + s + 1) x tasks_per_step``: with 0 the loop
    never runs ahead (every call is fresh); with 1 calls are at most a version old but for a slow
    group overtaken by later ones, and whatever is older is dropped and counted."""
    data = _data(tmp_path, steps=4, overlap_update=True)
    data["policies"]["shared"]["max_staleness"] = bound
    tr, _, _ = prepared_trainer(data, tmp_path)

    def within_bound(rollouts):
        assert rollouts.next_task <= (tr.step + bound + 1) * 2  # tasks_per_step 2

    recs, _ = run_async(tr, 4, within_bound)
    m = [r["policies"]["shared"] for r in recs]
    ages = {}
    for x in m:
        for k, v in x.items():
            if k.startswith("staleness_") and k[10:].isdigit():
                ages[int(k[10:])] = ages.get(int(k[10:]), 0) + v
    too_old = sum(v for a, v in ages.items() if a > bound)
    assert sum(x["stale_dropped"] for x in m) == too_old  # exactly what was past the bound was dropped
    assert too_old <= 0.1 * sum(ages.values())
    if bound == 0:
        assert set(ages) == {0} and all(r["async"]["calls_during_update"] == 0 for r in recs)
    else:
        assert ages.get(1, 0) > 0  # it did run ahead


def test_an_async_run_killed_with_sigkill_resumes_to_the_end(tmp_path):
    run_dir = tmp_path / "run"
    data = _data(run_dir, steps=4)
    data["train"].update(save_every=1, keep_last=2)
    cfg = tmp_path / "async.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-m", "masrl.cli", "train", str(cfg)], cwd=tmp_path, text=True,
                            env=dict(env, MASRL_FAULT_POINT="update:3", MASRL_FAULT_MARKER=str(marker)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate()[1][-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    latest = ckpt.latest_checkpoint(run_dir / "checkpoints")
    assert json.loads((latest / "state.json").read_text())["step"] == 2  # the episodes in flight were all it lost
    out = subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg), "--resume"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"rollout"' in x]
    assert steps == [1, 2, 3, 4]  # each step once: what the killed run logged past its checkpoint was redone
    assert ckpt.latest_checkpoint(run_dir / "checkpoints").name == "step_000004"


def test_an_evaluation_in_async_mode_never_lends_its_weights_to_training_calls(tmp_path):
    """Evaluation swaps a policy's EMA weights in; with async rollouts, training episodes are still
    running then. None of their calls may sample while the EMA is in (before the fix, they did)."""
    data = _data(tmp_path, steps=2, max_in_flight=8)
    data["policies"]["shared"]["schedule"] = {"ema": 0.5}
    data["data"]["eval"]["n"] = 4
    tr, workers, _ = prepared_trainer(data, tmp_path)
    w = workers["shared"]
    seen = {"in_eval": False, "training_during_eval": 0, "training": 0, "eval_calls": 0}
    real_generate, real_begin, real_end = w.generate, w.begin_eval, w.end_eval

    def generate(calls):
        n = sum(c.record for c in calls)
        seen["training"] += n
        if seen["in_eval"]:
            seen["training_during_eval"] += n
            seen["eval_calls"] += len(calls) - n
        return real_generate(calls)

    def begin():
        real_begin()
        seen["in_eval"] = True

    def end():
        seen["in_eval"] = False
        real_end()

    (batcher,) = tr.rt.controller.batchers  # it calls the worker's generate: what reaches the engine
    batcher.run_batch, w.begin_eval, w.end_eval = generate, begin, end

    async def go():
        rollouts = tr.async_rollouts()
        for _ in range(2):
            await tr.async_step(rollouts)
            running = len(rollouts.running)
            await tr.evaluate("mid-run")  # as the loop's eval_every does, with episodes still running
        await rollouts.stop()
        await tr.rt.controller.aclose()
        return running

    import asyncio

    running = asyncio.run(go())
    tr.rt.close()
    assert running > 0 and seen["eval_calls"] > 0  # the evaluation ran while training episodes were in flight
    assert seen["training"] > 0 and seen["training_during_eval"] == 0

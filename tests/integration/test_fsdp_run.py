"""policies.X.fsdp as it ships: a config with data_parallel 2 and fsdp under runtime.placement ray
(two actors, gloo on 127.0.0.1) trains like the same config unsharded, and a run killed with
SIGKILL resumes from its sharded checkpoint to the uninterrupted run's numbers."""

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from test_kill_resume import config as kill_config  # noqa: E402
from test_kill_resume import metrics, run  # noqa: E402
from tinycfg import prepared_trainer, tiny_config  # noqa: E402

from masrl.driver.run import rundir as ckpt  # noqa: E402

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)


def _data(run_dir, fsdp: bool, steps: int = 2) -> dict:
    data = tiny_config("math/team_shared", run_dir, steps=steps, threads=1, seed=0)
    data["runtime"] = {"placement": "ray", "address": "local"}
    data["policies"]["shared"].update(data_parallel=2, fsdp=fsdp)
    data["algorithm"]["share_prefix"] = False  # a sharded pass runs padded rows: the same arithmetic on both sides
    return data


def _train(run_dir, fsdp: bool):
    tr, workers, before = prepared_trainer(_data(run_dir, fsdp), run_dir)
    try:
        recs = [asyncio.run(tr.train_step()) for _ in range(2)]
        saved = tr.save_checkpoint()
        ranks = [r.fingerprint("shared") for r in tr.rt.workers[0].ranks]
        asyncio.run(tr.rt.controller.aclose())
    finally:
        tr.rt.close()
    return recs, before["shared"], ranks, saved


def test_an_fsdp_policy_trains_like_the_same_ranks_unsharded(tmp_path):
    plain, b0, r0, _ = _train(tmp_path / "plain", fsdp=False)
    sharded, b1, r1, saved = _train(tmp_path / "fsdp", fsdp=True)
    pol = lambda recs, k: [r["policies"]["shared"][k] for r in recs]  # noqa: E731
    print("loss", pol(plain, "loss"), pol(sharded, "loss"), "\nweights", r0, r1,
          "\nweight sync s", pol(sharded, "weight_sync_s"))
    assert b0 == b1 and r1[0] == r1[1]
    assert [r["rollout"]["reward"] for r in sharded] == [r["rollout"]["reward"] for r in plain]
    assert pol(sharded, "loss") == pytest.approx(pol(plain, "loss"), abs=1e-6)
    assert r1[0] != b1 and r1[0] == pytest.approx(r0[0], rel=1e-5)
    assert (saved / "shared" / "fsdp" / ".metadata").is_file() and (saved / "shared" / "model.safetensors").is_file()
    # what eval --checkpoint and serve do: fresh sharded ranks load the weights alone from the shards
    tr, _, fresh = prepared_trainer(_data(tmp_path / "again", fsdp=True), tmp_path / "again")
    try:
        tr.rt.workers[0].load(str(saved), with_optimizer=False)
        loaded = [r.fingerprint("shared") for r in tr.rt.workers[0].ranks]
    finally:
        tr.rt.close()
    assert fresh["shared"] == b1 and loaded == r1


def _numbers(run_dir) -> dict:
    """Each step's reward (sampled from the weights so far) and update figures, to 7 significant digits."""
    out = metrics(run_dir)
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "rollout" in r:
            m = r["policies"]["shared"]
            out[r["step"]].update({k: float(f"{m[k]:.7g}") for k in ("loss", "grad_norm", "pg_loss")})
    return out


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    parent = {}
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _fsdp_config(run_dir):
    """test_kill_resume's run (4 steps, a checkpoint each) with its policy sharded over two Ray actors."""
    import yaml

    path = kill_config(run_dir)
    data = yaml.safe_load(path.read_text())
    data["runtime"] = {"placement": "ray", "address": "local"}
    data["policies"]["shared"].update(data_parallel=2, fsdp=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_killed_fsdp_run_resumes_from_its_shards_to_the_uninterrupted_numbers(tmp_path):
    whole = tmp_path / "whole"
    run(_fsdp_config(whole))
    reference = _numbers(whole)
    run_dir = tmp_path / "run"
    cfg = _fsdp_config(run_dir)
    marker = tmp_path / "marker"
    proc = run(cfg, env_extra={"MASRL_FAULT_POINT": "update:3", "MASRL_FAULT_MARKER": str(marker)}, wait=False)
    deadline = time.time() + 300
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), f"the run never reached update 3: {proc.communicate()[1][-2000:]}"
    cluster = _descendants(proc.pid)  # the local Ray cluster it started: orphaned by the kill, stopped below
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    for pid in cluster:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    latest = ckpt.latest_checkpoint(run_dir / "checkpoints")
    assert latest is not None and (latest / "shared" / "fsdp" / ".metadata").is_file()
    run(cfg, "--resume")
    print("uninterrupted", reference, "\nresumed", _numbers(run_dir))
    assert _numbers(run_dir) == reference and len(reference) == 4


def test_async_rollouts_with_an_fsdp_policy(tmp_path):
    """rollout.mode async: calls are sampled on both ranks while the sharded update runs; each
    update (a collective, then the gather into each rank's engine copy) trains every finished call once."""
    from tinycfg import run_async

    data = _data(tmp_path, fsdp=True, steps=3)
    data["rollout"].update(mode="async", tasks_per_step=2, samples_per_task=2)
    tr, workers, before = prepared_trainer(data, tmp_path)
    try:
        recs, traces = run_async(tr, 3)
        ranks = [r.fingerprint("shared") for r in tr.rt.workers[0].ranks]
    finally:
        tr.rt.close()
    assert sum(r["policies"]["shared"]["n_seqs"] for r in recs) == sum(len(t.calls) for t in traces)
    assert max(c.policy_version for t in traces for c in t.calls) >= 1
    assert ranks[0] == ranks[1] != before["shared"]
    assert all(r["policies"]["shared"]["weight_sync_gb"] > 0 for r in recs)

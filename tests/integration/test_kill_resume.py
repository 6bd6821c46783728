"""kill -9 at several points of a run, then --resume: at most one step is lost, the checkpoint is
never corrupt or missing, and the resumed run reproduces the uninterrupted run's numbers (sampling
seeds depend on the step, not on any process state)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tinycfg import tiny_config

from masrl.driver.run import rundir as ckpt

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def config(run_dir: Path) -> Path:
    data = tiny_config("math/team_shared", run_dir, steps=STEPS)
    data["train"].update(save_every=1, keep_last=2)
    data["threads"] = 1
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(cfg: Path, *extra: str, env_extra: dict | None = None, wait: bool = True):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]), **(env_extra or {}))
    proc = subprocess.Popen([sys.executable, "-m", "masrl.cli", "train", str(cfg), *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cfg.parent)
    if wait:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    return proc


def metrics(run_dir: Path) -> dict[int, dict]:
    lines = [r for x in (run_dir / "metrics.jsonl").read_text().split("\n") if x and "rollout" in (r := json.loads(x))]
    return {r["step"]: {"reward": r["rollout"]["reward"], "outcome": r["rollout"].get("outcome"),
                        "loss": {p: round(m["loss"], 6) for p, m in r["policies"].items()}} for r in lines}


RUN_SECONDS: list[float] = []


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    t0 = time.perf_counter()
    run(config(run_dir))
    RUN_SECONDS.append(time.perf_counter() - t0)  # how long a whole run takes here: the random kills fall within it
    return metrics(run_dir)


def test_the_same_seed_gives_the_same_numbers_run_to_run(tmp_path, reference):
    run_dir = tmp_path / "again"
    run(config(run_dir))
    assert metrics(run_dir) == reference


@pytest.mark.parametrize("point", ["rollout:3", "update:3", "checkpoint:3"])
def test_kill_9_then_resume_loses_at_most_a_step(tmp_path, reference, point):
    run_dir = tmp_path / "run"
    cfg = config(run_dir)
    marker = tmp_path / "marker"
    proc = run(cfg, env_extra={"MASRL_FAULT_POINT": point, "MASRL_FAULT_MARKER": str(marker)}, wait=False)
    deadline = time.time() + 300
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), f"the run never reached {point}: {proc.communicate()[1][-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    latest = ckpt.latest_checkpoint(run_dir / "checkpoints")
    assert latest is not None and json.loads((latest / "state.json").read_text())["step"] >= 2  # at most one step lost
    run(cfg, "--resume")
    assert metrics(run_dir) == reference
    assert ckpt.latest_checkpoint(run_dir / "checkpoints").name == f"step_{STEPS:06d}"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000003", "step_000004"]


KILLS = int(os.environ.get("KILL_POINTS", "3"))  # 20 to do the count locally (about 10 minutes)
KILL_SEED = 0 if os.environ.get("FUZZ_DERANDOMIZE") else int(os.environ.get("KILL_SEED", random.randrange(10**6)))


@pytest.mark.slow
@pytest.mark.parametrize("k", range(KILLS))
def test_kill_9_at_a_random_moment_then_resume_reproduces_the_run(tmp_path, reference, k):
    """SIGKILL at a moment drawn at random over a whole run's length (loading, a rollout, an update, a checkpoint,
    an append), sometimes with a log's last line torn as a kill mid-write leaves it; then `masrl resume RUN`:
    the run ends with the uninterrupted run's numbers and every log line whole."""
    rng = random.Random(f"{KILL_SEED}-{k}")
    run_dir = tmp_path / "run"
    proc = run(config(run_dir), wait=False)
    time.sleep(rng.uniform(0.5, RUN_SECONDS[0]))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    tear = rng.choice(["metrics.jsonl", "traces.jsonl", None])
    if tear and (run_dir / tear).is_file():  # a kill mid-append: the line being written is cut short
        line = json.dumps({"step": 99, "rollout": {"reward": 0.5, "agents": {}}}).encode()
        with (run_dir / tear).open("ab") as f:
            f.write(line[: rng.randrange(1, len(line))])
    if not (run_dir / "config.yaml").is_file():  # killed before the run wrote anything: start it again
        run(config(run_dir))
    else:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
        r = subprocess.run([sys.executable, "-m", "masrl.cli", "resume", str(run_dir)], env=env, capture_output=True,
                           text=True, cwd=run_dir.parent, timeout=600)
        assert r.returncode == 0, f"KILL_SEED={KILL_SEED} k={k}: {r.stderr[-3000:]}"
    assert metrics(run_dir) == reference, f"KILL_SEED={KILL_SEED} k={k}"
    for name in ("metrics.jsonl", "traces.jsonl"):
        for line in (run_dir / name).read_text().split("\n")[:-1]:
            json.loads(line)

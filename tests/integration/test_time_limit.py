"""train.time_limit_s: a run with a wall-clock budget stops its steps in time and ends as a finished run
(checkpoint, held-out evaluation, best weights scored), where an outside kill would lose all of that."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tinycfg import tiny_config

from masrl.config import load_config
from masrl.driver.run.budget import TimeBudget
from masrl.errors import ConfigError

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]


def test_the_budget_stops_before_a_step_that_would_end_past_it():
    now = [0.0]
    b = TimeBudget(100.0, clock=lambda: now[0])
    now[0] = 10.0  # the evaluation before training took 10 s
    b.steps_begin()
    ends = []
    for step in range(1, 11):
        now[0] += 25.0  # 25 s a step
        ends.append(b.over(step, 10))
    # after step 3 (85 s spent, 25 a step) one more would end at 110 s > 100
    assert ends[:2] == [None, None] and "stopped after step 3 of 10" in ends[2]
    assert TimeBudget(None).over(1, 10) is None
    last = TimeBudget(0.001)
    assert last.over(10, 10) is None  # the last step: nothing to stop
    with pytest.raises(ConfigError, match="time_limit_s"):
        load_config(data={**tiny_config("math/solver", Path("/tmp/x")), "train": {"steps": 2, "time_limit_s": 0}})


def test_a_run_out_of_time_checkpoints_evaluates_and_exits_zero(tmp_path):
    run = tmp_path / "run"
    data = tiny_config("math/solver", run, steps=5)
    data["train"].update(keep_best={"n": 4, "every": 4}, eval_after=True, save_every=0, time_limit_s=0.001,
                         progress_every_s=0.001)  # output to a pipe: progress as lines, not a live bar
    data["data"]["eval"]["n"] = 3
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump(data))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    out = subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg_file)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "train.time_limit_s=0.001: stopped after step 1 of 5" in out.stdout + out.stderr
    assert " done after 0m0" in out.stdout + out.stderr  # e.g. "  eval: 1/3 done after 0m00s"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in lines if "rollout" in r) == 1
    assert any("time_limited" in r for r in lines)
    # a finished run's ending, at the step reached: its checkpoint, the held-out evaluation, the best weights
    assert (run / "checkpoints" / "step_000001" / "state.json").is_file()
    after = [r for r in lines if r.get("eval") == "after"]
    assert len(after) == 1 and after[0]["step"] == 1
    assert [r["step"] for r in lines if r.get("eval") == "validation"] == [1]  # validated though not due (every 4)
    assert json.loads((run / "eval_best.json").read_text())["best_step"] == 1

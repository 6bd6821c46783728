"""A run records its collapse alarms in every step record, and the report lists them."""

import json

from tinycfg import tiny_config

from masrl.cli.report import collect
from masrl.config import load_config
from masrl.driver.run.loop import train


def test_alarms_reach_metrics_and_the_report(tmp_path, capsys):
    run = tmp_path / "run"
    train(load_config(data=tiny_config("math_team_shared", run, steps=2)))
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"rollout"' in x]
    assert [s["step"] for s in steps] == [1, 2] and all(isinstance(s["alarms"], list) for s in steps)
    assert all("zero_var_groups" in a for a in steps[0]["rollout"]["agents"].values())
    assert steps[0]["alarms"] == []  # the first step is its own baseline
    # a collapsed step, as the H200 run of the math team had: the report lists it by step
    late = dict(steps[-1], step=3, alarms=["finalizer: distinct-2 0.00 (was 0.80 at step 1)"])
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps(late) + "\n")
    data = collect(run)
    assert data["steps"][-1]["alarms"] == ["finalizer: distinct-2 0.00 (was 0.80 at step 1)"]
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("step 2/2"))
    assert ("ALARM" in line) == bool(steps[1]["alarms"])

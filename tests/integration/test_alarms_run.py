"""A run records its collapse alarms in every step record, and the report lists them."""

import json

from tinycfg import tiny_config

from masrl.cli.report import collect
from masrl.config import load_config
from masrl.driver.run.loop import train


def test_alarms_reach_metrics_and_the_report(tmp_path, capsys):
    run = tmp_path / "run"
    train(load_config(data=tiny_config("math/team_shared", run, steps=2)))
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"rollout"' in x]
    assert [s["step"] for s in steps] == [1, 2] and all(isinstance(s["alarms"], list) for s in steps)
    assert all("zero_var_groups" in a for a in steps[0]["rollout"]["agents"].values())
    for pol in steps[0]["policies"].values():  # the sequences the rewards taught nothing, for the stuck rule
        assert 0 <= pol["zero_adv_seqs"] <= pol["n_seqs"] and pol["n_seqs"] > 0
    assert steps[0]["alarms"] == []  # the first step is its own baseline
    # a collapsed step, as the H200 run of the math team had: the report lists it by step
    late = dict(steps[-1], step=3, alarms=["finalizer: distinct-2 0.00 (was 0.80 at step 1)"])
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps(late) + "\n")
    data = collect(run)
    assert data["steps"][-1]["alarms"] == ["finalizer: distinct-2 0.00 (was 0.80 at step 1)"]
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("step 2/2"))
    assert ("ALARM" in line) == bool(steps[1]["alarms"])


def test_a_run_with_nothing_to_learn_ends_early_says_why_and_fails_the_command(tmp_path, capsys):
    import yaml

    from masrl.cli import main

    run = tmp_path / "run"
    data = tiny_config("math/solver", run, steps=12)
    data["rewards"] = [{"type": "outcome"}]  # random weights never answer: every group's rewards are equal (0)
    data["train"].update(stop_when_stuck=3, save_every=0, eval_after=True)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    assert main(["train", str(cfg)]) == 3
    err = capsys.readouterr().err
    assert "run ended at step 3 of 12" in err and "stuck" in err and "solver 100%" in err
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records if "rollout" in r) == 3
    assert any("stopped" in r for r in records)
    assert (run / "checkpoints" / "step_000003").is_dir() and (run / "eval_after.json").is_file()  # nothing lost
    data["train"]["stop_when_stuck"] = 0  # off: the same run goes on to its last step
    cfg.write_text(yaml.safe_dump({**data, "output_dir": str(tmp_path / "run2"), "train": {**data["train"], "steps": 4}}))
    assert main(["train", str(cfg)]) == 0

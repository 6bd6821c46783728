"""Loggers (JSONL, TensorBoard event files, Weights & Biases offline) and held-out evaluation during
training with pass@k and maj@k."""

import json

import pytest
from tinycfg import tiny_config

from masrl.config import load_config
from masrl.driver.observe.metrics import pass_at_k, sample_metrics
from masrl.driver.run.loop import train
from masrl.trace import Trace


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(4, 4, 1) == 1.0 and pass_at_k(3, 1, 3) == 1.0


def test_majority_vote_and_pass_at_k_over_samples():
    def tr(task, k, answer, ok):
        return Trace(f"t{task}{k}", task, k, final_answer=answer, metrics={"outcome": float(ok)})

    traces = [tr("a", 0, "4", 1), tr("a", 1, "5", 0), tr("a", 2, "5", 0),  # majority wrong, one right
              tr("b", 0, "7", 1), tr("b", 1, "7", 1), tr("b", 2, "1", 0)]  # majority right
    m = sample_metrics(traces)
    assert m["k"] == 3 and m["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert m["pass@3"] == 1.0 and m["maj@3"] == 0.5


def test_loggers_and_evaluation_during_training(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    data = tiny_config("math/solver", tmp_path / "run", steps=2)
    data["train"].update(loggers=["jsonl", "tensorboard", "wandb"], eval_every=1, eval_before=True, eval_after=True,
                         wandb_mode="offline")
    data["eval"] = {"samples_per_task": 3, "temperature": 0.7}
    train(load_config(data=data))
    run = tmp_path / "run"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval"]) for r in lines if "eval" in r]
    assert evals == [(0, "before"), (1, "held_out"), (2, "after")]
    assert all("pass@3" in r and "maj@3" in r and r["k"] == 3 for r in lines if "eval" in r)
    # each evaluation's first eval.log_traces traces, with its step and label, every call's prompt and reply
    written = [json.loads(x) for x in (run / "eval_traces.jsonl").read_text().splitlines()]
    n = min(32, 3 * data["data"]["eval"]["n"])
    assert [(r["step"], r["eval"]) for r in written] == [(0, "before")] * n + [(1, "held_out")] * n + [(2, "after")] * n
    assert all(r["calls"] and r["calls"][0]["messages"] and "final_answer" in r for r in written)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"rollout/reward", "policies/solver/loss", "eval/pass@3"} <= tags
    assert [e.step for e in acc.Scalars("rollout/reward")] == [1, 2]
    offline = list((run / "wandb").glob("offline-run-*"))
    assert offline and any(p.suffix == ".wandb" for p in offline[0].iterdir())


def test_unknown_logger_packages_and_factories_are_config_errors(tmp_path):
    from masrl.errors import ConfigError

    data = tiny_config("math/solver", tmp_path / "run", steps=1)
    data["train"]["loggers"] = ["jsonl", "nosuchmodule:make"]
    with pytest.raises(ConfigError, match="cannot import module 'nosuchmodule'"):
        train(load_config(data=data))


def test_held_out_tasks_of_several_levels_are_also_reported_per_level(tmp_path):
    from masrl.driver.run.loop import evaluate
    from masrl.families.math import arithmetic

    data = tiny_config("math/solver", tmp_path / "run", steps=1)
    data["data"]["eval"] = {"source": "arithmetic", "n": 6, "seed": 2, "levels": [1, 3]}
    data["eval"] = {"log_traces": 4}
    out = tmp_path / "out" / "eval.json"
    summary = evaluate(load_config(data=data), out=out)
    assert len((tmp_path / "out" / "eval_traces.jsonl").read_text().splitlines()) == 4
    assert json.loads(out.read_text())["traces"] == summary["traces"]
    evaluate(load_config(data=data), out=out)  # again into the same folder: its traces replace the first ones
    assert len((tmp_path / "out" / "eval_traces.jsonl").read_text().splitlines()) == 4
    want: dict[str, int] = {}
    for t in arithmetic.generate(6, seed=2, levels=[1, 3]):
        want[str(t.meta["level"])] = want.get(str(t.meta["level"]), 0) + 1
    assert {lvl: b["traces"] for lvl, b in summary["by_level"].items()} == want
    total = sum(b["outcome"] * b["traces"] for b in summary["by_level"].values())
    assert total == pytest.approx(summary["outcome"] * summary["traces"])

"""A config's tasks exported as verl trains on them: the same prompts masrl sends, and verl's reward function paying
what masrl's config pays (issue 74's learning curves train both on one parquet)."""

from __future__ import annotations

import asyncio

import pyarrow.parquet as pq
import pytest

from masrl.cli import main
from masrl.config import load_config
from masrl.driver.checks import check_run
from masrl.driver.serving.verl_data import compute_score, first_call, replayed
from masrl.errors import ConfigError
from masrl.families import build_tasks, config_path
from masrl.rewards.base import combine_all

OVERRIDES = ["model=tiny-random", "data.train.n=6", "data.eval.n=4"]


def test_export_writes_verls_layout_with_masrls_own_prompts_and_its_reward(tmp_path, capsys):
    out = tmp_path / "train.parquet"
    assert main(["data", "export", "math/solver", *OVERRIDES, "--out", str(out)]) == 0, capsys.readouterr().err
    rows = pq.read_table(out).to_pylist()
    cfg = load_config(config_path("math/solver"), OVERRIDES)
    plan, (train, _) = check_run(cfg), build_tasks(cfg)
    assert len(rows) == len(train) == 6
    for row, task in zip(rows, train):
        assert row["data_source"] == "arithmetic" and row["extra_info"]["task_id"] == task.id
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(task.answer)}
        agent, messages = first_call(plan.workflow, task)  # what the solver is sent in a masrl run
        assert agent == "solver" and row["prompt"] == messages and messages[-1]["content"] == task.question
    # verl's reward function pays what the config's rewards pay (outcome + format) for the same reply
    row, task = rows[0], train[0]
    right = f"<solution>it is {task.answer}</solution><answer>{task.answer}</answer>"
    wrong = f"<solution>no</solution><answer>{int(task.answer) + 1}</answer>"
    args = (row["data_source"], row["reward_model"]["ground_truth"])
    got = {name: compute_score(*args[:1], text, args[1], row["extra_info"]) for name, text in
           (("right", right), ("wrong", wrong), ("blank", ""))}
    for name, text in (("right", right), ("wrong", wrong), ("blank", "")):
        trace = replayed(plan.workflow, task, text)
        assert got[name] == combine_all([(trace, task)], plan.allocators)[0][trace.calls[0].call_id]
    assert got["right"] > got["wrong"] > got["blank"]


def test_a_workflow_of_several_calls_is_refused_by_name(tmp_path):
    cfg = load_config(config_path("math/team_shared"), OVERRIDES)
    plan, (train, _) = check_run(cfg), build_tasks(cfg)
    with pytest.raises(ConfigError, match="after its first call; verl's rollout samples one reply per prompt"):
        replayed(plan.workflow, train[0], "<answer>1</answer>")


def test_the_reward_function_runs_inside_a_running_event_loop_too(tmp_path):
    # an asynchronous reward manager calls it from a coroutine: the same reward as from plain code
    out = tmp_path / "eval.jsonl"
    assert main(["data", "export", "math/solver", *OVERRIDES, "--split", "eval", "--out", str(out)]) == 0
    import json

    row = json.loads(out.read_text().splitlines()[0])
    text = f"<answer>{row['reward_model']['ground_truth']}</answer>"
    plain = compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"])

    async def inside():
        return compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"])
    assert asyncio.run(inside()) == plain and row["extra_info"]["split"] == "eval" and len(out.read_text().splitlines()) == 4


def test_export_refuses_an_output_it_cannot_write(tmp_path, capsys):
    assert main(["data", "export", "math/solver", *OVERRIDES, "--out", str(tmp_path / "rows.csv")]) == 2
    assert "name a .parquet (verl's format) or .jsonl file" in capsys.readouterr().err

"""User reward code runs under a time limit, and what it returns is checked: an allocator that hangs, raises
or returns NaN fails its own traces with a message that names it, counted like other failed traces; the run
stops loudly when every trace fails, and finishes when only some do (issue 60, items 13-15)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from masrl.cli import main
from masrl.families import config_path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(config_path("math/solver"))


def _train(tmp_path, reward: str, *extra: str):
    run = tmp_path / "run"
    args = ["train", CONFIG, "model=tiny-random", "train.steps=1", "train.eval_before=false", "train.eval_after=false",
            "train.save_every=0", "rollout.tasks_per_step=2", "rollout.samples_per_task=2",
            "agents.solver.max_new_tokens=8", "rollout.reward_timeout_s=1", f"output_dir={run}",
            f"rewards=[{{type: outcome}}, {{type: '{reward}'}}]", *extra]
    t0 = time.perf_counter()
    rc = main(args)
    return rc, time.perf_counter() - t0, run


def _steps(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_an_allocator_that_hangs_on_every_trace_stops_the_run_within_its_time_limit(tmp_path, capsys):
    rc, took, _ = _train(tmp_path, "bad_rewards:Hang", "rewards.1.options={every: true}")
    err = capsys.readouterr().err
    assert rc != 0 and took < 60, took  # before: alive until killed at 240 s
    assert "reward allocator 'hang'" in err and "did not return within 1 s (rollout.reward_timeout_s)" in err, err


def test_an_allocator_that_hangs_on_some_traces_fails_those_alone(tmp_path, capsys):
    rc, _, run = _train(tmp_path, "bad_rewards:Hang", "rollout.max_failed_fraction=0.9")
    assert rc == 0, capsys.readouterr().err
    rollout = next(s for s in _steps(run) if s.get("step") == 1)["rollout"]
    assert rollout["traces"] == 4 and rollout["failed"] == 2  # the even samples' traces; the odd ones trained
    traces = [json.loads(x) for x in (run / "traces.jsonl").read_text().splitlines() if x.strip()]
    failed = [t for t in traces if t.get("error")]
    assert failed and all("reward allocator 'hang'" in t["error"] for t in failed)


def test_a_nan_reward_fails_the_trace_and_names_the_allocator_and_the_call(tmp_path, capsys):
    rc, _, _ = _train(tmp_path, "bad_rewards:NotANumber")
    err = capsys.readouterr().err
    assert rc != 0  # every trace failed: the run stops instead of training on NaN (before: loss=nan, exit 0)
    assert "reward allocator 'nan' on task" in err and "the reward nan; a reward must be a finite number" in err, err


def test_an_allocator_that_raises_is_named_with_the_task_above_its_traceback(tmp_path, capsys):
    rc, _, _ = _train(tmp_path, "bad_rewards:Raises")
    err = capsys.readouterr().err
    assert rc != 0
    head = next(line for line in err.splitlines() if "reward allocator 'raises'" in line)
    assert "on task arith-" in head and "raised KeyError: \"a bug in the user's reward\"" in head, head
    assert err.count("Traceback (most recent call last)") == 1  # once per allocator, not once per trace
    assert err.index(head) < err.index("Traceback (most recent call last)")

"""`make demo`'s script as it ships: the arms train through the CLI in their own processes, and the
side-by-side table it prints holds what the runs wrote. The model and the sizes are made small
(tiny-random, one step, two held-out questions); the arms' configs and their own overrides are the
script's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model=tiny-random", "data.eval.n=2", "rollout.samples_per_task=2", "algorithm.micro_batch_size=4",
         "data.world.docs=40", "data.train.n=40", "train.keep_best.n=4"]
BEST = r"([\d.]+) \((\d+)\)"  # the best-by-validation column: held-out score (its step)


def test_the_demo_script_trains_both_arms_and_prints_them_side_by_side(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(ROOT / "scripts" / "cpu_team_vs_agent.py"), "--family", "search", "--seed", "3",
           "--steps", "1", "--out", str(out), "--memory-gb", "10", *SMALL]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {m.group(1): m for m in re.finditer(r"^\| (search team|one search agent) \| ([\d.]+) -> \*\*([\d.]+)\*\* \| "
                                               r"[\d.]+ \| " + BEST + r" \| (\d+) \| ([\d.]+) \|", r.stdout, re.M)}
    assert set(rows) == {"search team", "one search agent"}, r.stdout[-2000:]
    for arm, folder in (("search team", "team-seed3"), ("one search agent", "agent-seed3")):
        after = json.loads((out / folder / "eval_after.json").read_text())
        assert float(rows[arm].group(3)) == round(after["outcome"], 3)
        best = json.loads((out / folder / "eval_best.json").read_text())  # validated at the last step: its weights
        assert float(rows[arm].group(4)) == round(best["outcome"], 3) and int(rows[arm].group(5)) == best["best_step"] == 1
        steps = [json.loads(x) for x in (out / folder / "metrics.jsonl").read_text().splitlines() if '"rollout"' in x]
        assert len(steps) == 1
        calls = sum(a["calls"] for a in steps[0]["rollout"]["agents"].values())
        assert int(rows[arm].group(6)) == calls > 0
    team_calls = float(rows["search team"].group(7))
    assert 2 < team_calls <= 6  # the team: planner and answerer, then searcher, summarizer, updater per turn
    assert "The trained team is" in r.stdout and "single agent" in r.stdout
    # as many arms at once as the cores and the memory hold (5 GB an arm): every line shown with its arm's name
    cores = os.cpu_count() or 1
    at_once = min(2, cores)
    assert f"{at_once} at a time" in r.stdout and "peak RSS GB" in r.stdout
    for arm, folder in (("search team", "team-seed3"), ("one search agent", "agent-seed3")):
        log = (out / folder / "train.log").read_text()
        assert "step 1/1" in log and f"[{arm}] " + log.splitlines()[0] in r.stdout
        assert f"threads={max(1, cores // at_once)}" in (out / folder / "config.yaml").read_text().replace(": ", "=")
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.count("(done before)") == 2  # a finished arm is not run again


def test_an_arm_that_fails_stops_the_demo_with_its_name_and_log_while_the_other_trains(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    # an option only the team's workflow takes: the single agent's config is rejected, the team's is not
    cmd = [sys.executable, str(ROOT / "scripts" / "cpu_team_vs_agent.py"), "--family", "search", "--seed", "3",
           "--steps", "1", "--side-by-side", "on", "--out", str(out), *SMALL, "workflow.options.max_turns=1"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "one search agent exited with" in r.stderr and str(out / "agent-seed3" / "train.log") in r.stderr
    assert "max_turns" in (out / "agent-seed3" / "train.log").read_text()  # the arm's own error, kept
    assert (out / "team-seed3" / "eval_after.json").is_file()  # the other arm was not cut short
    assert "search team exited" not in r.stderr
    fixed = [x for x in cmd if x != "workflow.options.max_turns=1"]  # run again: the failed arm trains, the other waits
    again = subprocess.run(fixed, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("(done before)") == 1 and (out / "agent-seed3" / "eval_after.json").is_file()


def test_the_demo_plans_its_memory_and_names_an_arm_the_kernel_killed():
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo", ROOT / "scripts" / "cpu_team_vs_agent.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.places(3, 2, 8.0, "auto") == 1 and demo.places(3, 16, 10.0, "auto") == 2  # 5 GB an arm
    assert demo.places(3, 1, 64.0, "auto") == 1 and demo.places(3, 16, 64.0, "auto") == 3
    assert demo.places(3, 2, 3.0, "on") == 3 and demo.places(3, 16, 64.0, "off") == 1
    said = demo.killed_message("team", -9, 7.4, Path("runs/demo/team-seed0/train.log"))
    assert "lack of memory" in said and "7.4 GB RSS" in said and "--side-by-side off" in said
    assert "continues where it stopped" in said
    assert demo.killed_message("team", 1, 1.0, Path("x")) == "team exited with 1 (its log: x)"


def test_the_default_demo_sets_the_chained_math_team_against_both_single_agents_at_about_equal_calls(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(ROOT / "scripts" / "cpu_team_vs_agent.py"), "--seed", "3", "--steps", "1",
           "--out", str(out), *SMALL]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    arms = {"chained-math team": "team-seed3", "one solver, a turn per event": "stepwise-seed3",
            "one solver, one expression": "agent-seed3"}
    rows = {m.group(1): m for m in re.finditer(r"^\| (" + "|".join(map(re.escape, arms)) + r") \| ([\d.]+) -> "
                                               r"\*\*([\d.]+)\*\* \| " + BEST + r" \| (\d+) \| ([\d.]+) \|", r.stdout, re.M)}
    assert set(rows) == set(arms), r.stdout[-2000:]
    assert "problems never trained on, accuracy" in r.stdout and "exact match" not in r.stdout
    for arm, folder in arms.items():
        assert float(rows[arm].group(3)) == round(json.loads((out / folder / "eval_after.json").read_text())["outcome"], 3)
        config = (out / folder / "config.yaml").read_text()
        assert config.count("math_chain") >= 2  # its workflow and its source
        assert "keep_best" in config and "n: 4" in config  # the script keeps the best; an override sets its size
        best = json.loads((out / folder / "eval_best.json").read_text())
        assert float(rows[arm].group(4)) == round(best["outcome"], 3) and int(rows[arm].group(5)) == best["best_step"] == 1
    assert "stepwise: true" in (out / "stepwise-seed3" / "config.yaml").read_text()
    # tiny-random's expressions rarely compute, which ends a chain early: a stepper per event reached, 1-4
    assert 1 <= float(rows["chained-math team"].group(7)) <= 4 and float(rows["one solver, one expression"].group(7)) == 1.0
    # the verdict is against the stronger single agent of the two
    strongest = max(["one solver, a turn per event", "one solver, one expression"], key=lambda k: float(rows[k].group(3)))
    assert f"the strongest trained single agent, {strongest} (" in r.stdout

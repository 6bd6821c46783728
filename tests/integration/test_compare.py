"""masrl compare: arms by config name, held-out accuracy against training compute, spread over seeds."""

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from tinycfg import tiny_config

from masrl.cli import main
from masrl.cli.compare import collect_runs
from masrl.config import load_config
from masrl.driver.run.loop import train

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    dirs = []
    for base, name in (("math/team_shared", "team"), ("math/solver", "solo")):
        for seed in (0, 1):
            data = tiny_config(base, root / f"{name}-{seed}", steps=2, name=name, seed=seed)
            data["train"].update(eval_before=True, eval_after=True, eval_every=1)
            train(load_config(data=data))
            dirs.append(root / f"{name}-{seed}")
    return dirs


def test_runs_group_into_arms_with_compute_and_the_spread_over_seeds(runs):
    data = collect_runs(runs)
    arms = {a["name"]: a for a in data["arms"]}
    assert set(arms) == {"team", "solo"} and all(a["summary"]["seeds"] == [0, 1] for a in arms.values())
    team = arms["team"]
    run = team["runs"][0]
    metrics = [json.loads(x) for x in open(os.path.join(run["dir"], "metrics.jsonl")) if '"rollout"' in x]
    calls = sum(a["calls"] for a in metrics[0]["rollout"]["agents"].values())
    assert run["steps"][0]["calls"] == calls and run["steps"][1]["calls"] > calls  # cumulative
    prompts = sum(a["calls"] * a["prompt_tokens"] for a in metrics[0]["rollout"]["agents"].values())
    assert prompts > 0 and run["steps"][0]["context"] == pytest.approx(prompts + run["steps"][0]["tokens"])
    assert team["summary"]["train_context"]["mean"] > team["summary"]["train_tokens"]["mean"]
    assert [e["label"] for e in run["evals"]] == ["before", "held_out", "after"]
    assert run["evals"][0]["calls"] == 0 and run["evals"][-1]["calls"] == run["steps"][-1]["calls"]
    s = team["summary"]
    finals = [r["evals"][-1]["accuracy"] for r in team["runs"]]
    assert s["heldout_last"]["values"] == finals and s["heldout_last"]["min"] == min(finals)
    assert s["calls_per_task_last"]["mean"] == 4.0  # the math team: four calls a task
    assert arms["solo"]["summary"]["calls_per_task_last"]["mean"] == 1.0


def test_the_compare_page_is_written_by_the_cli_and_draws_bands(runs, tmp_path, capsys):
    out = tmp_path / "pages" / "cmp.html"
    assert main(["compare", *map(str, runs), "--out", str(out)]) == 0
    assert "arms" in out.read_text()
    printed = capsys.readouterr().out.splitlines()  # the table in the terminal too
    assert printed[0].split()[:3] == ["arm", "seeds", "held-out"] and printed[1].startswith("---")
    team = next(x for x in printed if x.startswith("team "))
    last = collect_runs(runs)["arms"][0]["summary"]["heldout_last"]
    assert "0,1" in team and f"{last['mean']:.3f} ({last['min']:.3f}-{last['max']:.3f})" in team
    assert main(["compare", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    if not (CHROMIUM and DRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        driver.get(out.resolve().as_uri())
        chart = driver.find_element(By.CSS_SELECTOR, "svg[data-title='held-out accuracy vs training model calls']")
        assert {e.get_attribute("data-series") for e in chart.find_elements(By.CSS_SELECTOR, "polyline")} == {"team", "solo"}
        assert len(chart.find_elements(By.CSS_SELECTOR, "polygon")) == 2
        rows = driver.find_elements(By.CSS_SELECTOR, "#summary tr")
        assert len(rows) == 3 and "team" in rows[1].text + rows[2].text
    finally:
        driver.quit()


def test_each_arm_says_how_many_training_tasks_it_had_and_runs_on_other_held_out_sets_are_named(runs, tmp_path):
    data = collect_runs(runs)
    assert data["notes"] == []  # every run scored on the same held-out tasks
    for arm in data["arms"]:
        kept = [json.loads((Path(r["dir"]) / "data.json").read_text()) for r in arm["runs"]]
        s = arm["summary"]
        assert s["train_tasks"]["values"] == [k["train_tasks"] for k in kept]
        # 2 steps x 2 tasks a step (tiny_config), every task's samples one draw
        assert s["draws_per_task"]["values"] == [4 / k["train_tasks"] for k in kept]
    other = tmp_path / "other"
    shutil.copytree(runs[0], other)
    d = json.loads((other / "data.json").read_text())
    d["held_out_tasks"], d["held_out_mix"] = 5, {"1": 1.0}
    (other / "data.json").write_text(json.dumps(d))
    (note,) = collect_runs([runs[2], other])["notes"]
    assert "different held-out sets" in note and "team seed 0: 5 tasks, 1 100%" in note


def test_a_games_arms_agents_are_put_side_by_side_per_seat(tmp_path):
    pytest.importorskip("textarena")
    from masrl.cli.compare import build_compare

    dirs = []
    for seed in (0, 1):
        run = tmp_path / f"ttt-{seed}"
        assert main(["train", "games/tictactoe_selfplay", "model=tiny-random", "train.steps=1", "data.eval.n=4",
                     "rollout.tasks_per_step=1", "rollout.samples_per_task=2", "workflow.options.examples=0",
                     "train.save_every=0", f"seed={seed}", f"output_dir={run}"]) == 0
        dirs.append(run)
    (arm,) = collect_runs(dirs)["arms"]
    lasts = [[json.loads(x) for x in open(d / "metrics.jsonl") if '"eval"' in x][-1]["agents"]["player_0"] for d in dirs]
    got = arm["summary"]["agents_last"]["player_0"]
    assert set(got) == {"score", "seat0_score", "seat1_score", "win", "draw", "loss", "invalid", "lost_by_invalid"}
    for k in got:
        assert got[k]["values"] == [m[k] for m in lasts]
    page = build_compare(dirs, tmp_path / "cmp.html").read_text()
    assert '"agents_last"' in page and "seat1_score" in page
    if not (CHROMIUM and DRIVER):
        return
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 f"--user-data-dir={tmp_path / 'profile'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        driver.get((tmp_path / "cmp.html").resolve().as_uri())
        row = driver.find_element(By.CSS_SELECTOR, "#agents tr[data-agent='tictactoe_selfplay/player_0']")
        assert row.is_displayed() and len(row.find_elements(By.TAG_NAME, "td")) == 10
    finally:
        driver.quit()


def test_runs_of_one_name_trained_with_other_settings_are_arms_of_their_own(runs, tmp_path):
    """A run given another game or model on the command line keeps its config's name; compare files it apart,
    named by what differs, instead of as a seed of the arm."""
    other = tmp_path / "team-other"
    shutil.copytree(runs[0], other)
    cfg = yaml.safe_load((other / "config.yaml").read_text())
    cfg["model"], cfg["threads"] = "tiny-random-qwen2", 7  # another model; threads may differ between seeds
    (other / "config.yaml").write_text(yaml.safe_dump(cfg))
    names = {a["name"]: a["summary"]["seeds"] for a in collect_runs([runs[0], runs[1], other])["arms"]}
    assert names.pop("team") == [0, 1]
    assert names == {"team (model=tiny-random-qwen2)": [0]}

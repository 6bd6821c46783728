"""The HTML report of a real run, opened in a real headless Chromium (Debian's chromium and
chromedriver, driven by selenium): curves drawn, a trace picked and a call opened show that call's
completion, reward parts and advantage; a screenshot is taken."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tinycfg import tiny_config

from masrl.config import load_config
from masrl.driver.run.loop import train

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("report") / "run"
    data = tiny_config("math/team_shared", d, steps=3)
    data["train"].update(eval_before=True, eval_after=True, eval_every=1, log_traces=3)
    train(load_config(data=data))
    return d


def test_report_command_writes_one_self_contained_file(run_dir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    out = subprocess.run([sys.executable, "-m", "masrl.cli", "report", str(run_dir)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    html = (run_dir / "report.html").read_text()
    assert "http://" not in html.split("<script id=\"data\"")[0] and "<script src" not in html  # nothing fetched
    data = json.loads(html.split('type="application/json">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))
    assert [s["step"] for s in data["steps"]] == [1, 2, 3] and len(data["evals"]) == 4
    assert {t["view"] for t in data["traces"] if t["view"].startswith("step")} == {"step 1", "step 2", "step 3"}
    # the held-out traces too: every evaluation's (before, at each step, after), what was answered on unseen tasks
    views = {t["view"] for t in data["traces"] if t["view"].startswith("held-out")}
    assert views == {"held-out, before, step 0", "held-out, held_out, step 1", "held-out, held_out, step 2",
                     "held-out, after, step 3"}


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")
def test_the_report_opens_in_chromium_and_shows_a_call(run_dir, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from masrl.cli.report import build_report

    page = build_report(run_dir)
    traces = [json.loads(x) for x in (run_dir / "traces.jsonl").read_text().splitlines()]
    target = next(t for t in traces if t["step"] == 2)
    call = target["calls"][1]
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,2400"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        driver.get(page.resolve().as_uri())
        lines = driver.find_elements(By.CSS_SELECTOR, "svg polyline")
        assert len(lines) >= 10  # agents x 3 curves, the policy's 6, step times, held-out
        titles = {e.get_attribute("data-title") for e in driver.find_elements(By.CSS_SELECTOR, "svg[data-title]")}
        assert {"reward per agent", "loss per policy", "seconds per step", "held-out accuracy",
                "distinct-2 of completions per policy"} <= titles
        div = driver.find_element(By.CSS_SELECTOR, "svg[data-title='distinct-2 of completions per policy']")
        assert div.find_elements(By.CSS_SELECTOR, "polyline")  # a curve, not "no data"
        Select(driver.find_element(By.ID, "step-select")).select_by_value("step 2")
        Select(driver.find_element(By.ID, "task-select")).select_by_value(target["task_id"])
        box = driver.find_element(By.CSS_SELECTOR, f"[data-call='{call['call_id']}']")
        body = box.find_element(By.CSS_SELECTOR, ".body")
        assert not body.is_displayed()
        box.find_element(By.TAG_NAME, "h4").click()
        assert body.is_displayed()
        assert box.find_element(By.CSS_SELECTOR, "pre.completion").text.strip() == call["completion"].strip()
        header = box.find_element(By.TAG_NAME, "h4").text
        assert call["agent"] in header and f"reward {call['reward']:.3f}" in header
        assert ("advantage -" in header) if call["advantage"] is None else (f"advantage {call['advantage']:.3f}" in header)
        parts = box.find_element(By.CSS_SELECTOR, "table.reward-parts").text
        assert all(name in parts for name in call["reward_parts"])
        assert not driver.find_element(By.ID, "async-section").is_displayed()  # a synchronous run: every call age 0
        shot = tmp_path / "report.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
    finally:
        driver.quit()


def _browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,2400"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")
def test_an_async_run_reports_its_staleness_histogram_and_corrections(tmp_path):
    from selenium.webdriver.common.by import By

    from masrl.cli.report import build_report, collect

    d = tmp_path / "run"
    data = tiny_config("math/team_shared", d, steps=3)
    data["rollout"].update(mode="async", overlap_update=True)
    data["algorithm"]["mis"] = [0.5, 2.0]
    train(load_config(data=data))
    steps = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if '"rollout"' in x]
    hist = collect(d)["staleness"]["shared"]
    seen = sum(s["policies"]["shared"]["n_seqs"] + s["policies"]["shared"]["stale_dropped"] for s in steps)
    assert sum(hist.values()) == seen and max(hist) >= 1  # every trained call counted once, some a version old
    driver = _browser(tmp_path)
    try:
        driver.get(build_report(d).resolve().as_uri())
        assert driver.find_element(By.ID, "async-section").is_displayed()
        row = driver.find_element(By.CSS_SELECTOR, "#staleness-table tr[data-policy='shared']").text.split()
        assert [float(x) for x in row[1:]] == list(hist.values())
        titles = {e.get_attribute("data-title") for e in driver.find_elements(By.CSS_SELECTOR, "#async-charts svg")}
        assert {"mean staleness per policy", "share of tokens masked (MIS) per policy",
                "calls sampled during the update"} <= titles
        mis = driver.find_element(By.CSS_SELECTOR, "svg[data-title='share of tokens masked (MIS) per policy']")
        assert mis.find_elements(By.CSS_SELECTOR, "polyline")
    finally:
        driver.quit()


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")
def test_a_games_moves_and_winner_show_in_the_trace_browser(tmp_path):
    pytest.importorskip("textarena")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from masrl.cli.report import build_report

    d = tmp_path / "game"
    data = tiny_config("games/tictactoe_vs_random", d, steps=1)
    data["train"].update(log_traces=2)
    train(load_config(data=data))
    target = next(json.loads(x) for x in (d / "traces.jsonl").read_text().splitlines())
    page = build_report(d)
    driver = _browser(tmp_path)
    try:
        driver.get(page.resolve().as_uri())
        Select(driver.find_element(By.ID, "step-select")).select_by_value("step 1")
        Select(driver.find_element(By.ID, "task-select")).select_by_value(target["task_id"])
        sample = driver.find_element(By.CSS_SELECTOR, f"[data-trace='{target['trace_id']}']")
        moves = sample.find_element(By.CSS_SELECTOR, ".moves").text
        for m in target["state"]["moves"]:
            assert f"P{m['seat']} {m['agent']} {m['move'][:20]}" in moves
        assert target["state"]["reason"][:30] in moves
        assert target["final_answer"] in sample.text  # who won
    finally:
        driver.quit()

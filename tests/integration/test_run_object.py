"""A run directory is one object: eval, resume, serve and export read its own config.yaml, so a run
trained with overrides is used as it was trained; a config that does not fit its weights is refused in
one line before any model loads; nothing rewrites the run's config unless the run continues; an
interrupt says truthfully what is kept and the exact command that continues the run; a torn JSONL
line never stops a resume or a report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tinycfg import start_serve

from masrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["model=tiny-random", "data.train.n=8", "data.eval.n=2", "train.eval_before=false", "threads=1",
         "agents.solver.max_new_tokens=6"]


def cli(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out + out.err


def env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """math/solver trained two steps with overrides (another model than the config's)."""
    run = tmp_path_factory.mktemp("runs") / "ms"
    rc = main(["train", "math/solver", *TRAIN, "train.steps=2", f"output_dir={run}"])
    assert rc == 0
    return run


def test_eval_of_a_run_uses_its_own_config_and_writes_its_figures_into_it(trained, capsys):
    rc, out = cli(capsys, "eval", trained)
    assert rc == 0, out
    assert "loading tiny-random" in out and "evaluating" in out and "step_000002" in out
    got = json.loads((trained / "evals" / "step_000002.json").read_text())
    assert got["traces"] == 2 and got["checkpoint"].endswith("step_000002")
    rc, out = cli(capsys, "eval", trained, "--step", "7")
    assert rc == 2 and "no checkpoint of step 7 (steps kept: 2" in out


def test_the_old_form_with_a_config_that_does_not_fit_is_one_line_before_any_model_loads(trained, capsys):
    rc, out = cli(capsys, "eval", "math/solver", "--checkpoint", trained)
    assert rc == 2, out
    assert "loading" not in out and "Traceback" not in out and len(out.strip().splitlines()) == 1
    assert "full weights of tiny-random" in out and "full weights of smollm2-135m-instruct" in out
    assert f"masrl eval {trained}" in out
    # where it fits, the old form still works (and its figures go to the run whose weights they are)
    rc, out = cli(capsys, "eval", "math/solver", *TRAIN, "--checkpoint", trained)
    assert rc == 0, out
    assert (trained / "evals" / "step_000002-solver.json").is_file()


def test_a_failed_resume_leaves_the_runs_config_as_it_was(trained, capsys):
    before = (trained / "config.yaml").read_text()
    rc, out = cli(capsys, "train", "math/solver", f"output_dir={trained}", "--resume")  # the overrides dropped
    assert rc == 2 and f"masrl resume {trained}" in out and "model: 'tiny-random' in the run" in out, out
    rc, out = cli(capsys, "resume", trained, "model=smollm2-135m-instruct")  # another model on top
    assert rc == 2 and "loading" not in out and "full weights of tiny-random" in out, out
    rc, out = cli(capsys, "resume", trained, "output_dir=/tmp/elsewhere")
    assert rc == 2 and "a run's place is its folder" in out
    rc, out = cli(capsys, "train", trained)
    assert rc == 2 and f"masrl resume {trained}" in out
    assert (trained / "config.yaml").read_text() == before


def test_resume_continues_with_the_runs_config_and_survives_torn_lines(tmp_path, capsys):
    run = tmp_path / "torn"
    assert main(["train", "math/solver", *TRAIN, "train.steps=2", "train.log_traces=2", f"output_dir={run}"]) == 0
    for name in ("metrics.jsonl", "traces.jsonl", "eval_traces.jsonl"):  # what a kill -9 mid-write leaves
        with (run / name).open("a") as f:
            f.write('{"step": 3, "rollout": {"rew')
    rc, out = cli(capsys, "report", run)
    assert rc == 0, out
    rc, out = cli(capsys, "resume", run, "train.steps=3")
    assert rc == 0, out
    assert "resumed from" in out and "step_000002" in out and "loading tiny-random" in out
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().split("\n") if x.strip()]
    assert 3 in steps and all(x.strip() for x in (run / "traces.jsonl").read_text().split("\n")[:-1])
    for name in ("metrics.jsonl", "traces.jsonl", "eval_traces.jsonl"):  # every line whole again
        for line in (run / name).read_text().split("\n")[:-1]:
            json.loads(line)
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 3  # the run continued: its record says so


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_says_what_is_kept_and_the_command_that_continues_the_run(tmp_path, sig):
    run = tmp_path / "int"
    proc = subprocess.Popen([sys.executable, "-m", "masrl.cli", "train", "math/solver", *TRAIN, "train.steps=200",
                             "train.save_every=0", f"output_dir={run}"], env=env(), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, seen = time.time() + 240, []
    while time.time() < deadline:  # the first step has run: the run is under way, no checkpoint yet
        line = proc.stdout.readline()
        seen.append(line)
        if line.startswith("step 1/") or not line:
            break
    proc.send_signal(sig)
    out = "".join(seen) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out
    assert "No checkpoint was written yet" in out and f"masrl resume {run}" in out, out
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    # the command it printed continues this run (its model, its output_dir), from step 0
    r = subprocess.run([sys.executable, "-m", "masrl.cli", "resume", str(run), "train.steps=1"], env=env(),
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "loading tiny-random" in r.stdout and "starting at step 0" in r.stdout


def test_serve_a_run_as_it_was_trained(trained):
    from openai import OpenAI

    proc, base, seen = start_serve(trained)
    try:
        assert any("serving the weights of" in x and "step_000002" in x for x in seen), seen
        assert any("loading tiny-random" in x for x in seen)
        client = OpenAI(base_url=f"{base}/v1", api_key="unused")
        out = client.chat.completions.create(model="solver", messages=[{"role": "user", "content": "2 + 2?"}],
                                             max_tokens=3, temperature=0)
        assert out.usage.completion_tokens <= 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)

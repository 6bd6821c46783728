"""train.keep_best: a validation split from the training tasks picks the checkpoint; the held-out set
is scored at it beside the last step's, by the run, by `masrl eval` and by `masrl compare`."""

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
from masrl.driver.run.loop import Trainer, train

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]


def _data(run_dir: Path, steps: int = 4) -> dict:
    data = tiny_config("math/solver", run_dir, steps=steps)
    data["train"].update(keep_best={"n": 4, "every": 2}, eval_after=True, keep_last=1, save_every=1)
    data["data"]["eval"]["n"] = 3
    return data


def test_the_best_validation_checkpoint_is_kept_and_scored_on_held_out_tasks(tmp_path):
    run = tmp_path / "run"
    cfg = load_config(data=_data(run))
    tr = Trainer(cfg)
    assert len(tr.validation_tasks) == 4 and not {t.id for t in tr.validation_tasks} & {t.id for t in tr.train_tasks}
    assert not {t.question for t in tr.validation_tasks} & {t.question for t in tr.eval_tasks}
    results = train(cfg)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    validations = [r for r in lines if r.get("eval") == "validation"]
    assert [r["step"] for r in validations] == [2, 4]
    trained = {t["task_id"] for t in map(json.loads, (run / "traces.jsonl").read_text().splitlines())}
    assert not trained & {t.id for t in tr.validation_tasks}  # validation tasks never train
    state = json.loads((run / "checkpoints" / "best" / "state.json").read_text())
    kept = [r for r in validations if r["kept"]]
    assert state["step"] == kept[-1]["step"] and state["validation"] == max(r["outcome"] for r in validations)
    best = json.loads((run / "eval_best.json").read_text())
    assert best["best_step"] == state["step"] and "best" in results and results["best"]["outcome"] == best["outcome"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "step_000004"]  # pruning spares it
    # best is evaluated, never resumed: weights without the optimizer state a step checkpoint holds
    assert list((run / "checkpoints" / "step_000004").rglob("optimizer*.pt"))
    assert not list((run / "checkpoints" / "best").rglob("optimizer*.pt"))
    assert list((run / "checkpoints" / "best").rglob("model.safetensors"))
    # masrl eval at the best checkpoint gives the run's own figure; masrl compare reports it beside the last
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump(_data(run)))
    out = subprocess.run([sys.executable, "-m", "masrl.cli", "eval", str(cfg_file), "--checkpoint",
                          str(run / "checkpoints" / "best"), f"output_dir={tmp_path / 'ev'}"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["outcome"] == best["outcome"]
    from masrl.cli.compare import collect_runs

    summary = collect_runs([run])["arms"][0]["summary"]
    assert summary["heldout_best"]["values"] == [best["outcome"]] and summary["heldout_best_step"] == [state["step"]]
    assert summary["heldout_last"]["values"] == [results["after"]["outcome"]]


def test_a_resumed_run_knows_its_best_so_far(tmp_path):
    run = tmp_path / "run"
    data = _data(run, steps=2)
    train(load_config(data=data))
    first = json.loads((run / "checkpoints" / "best" / "state.json").read_text())
    data["train"]["steps"] = 4
    tr = Trainer(load_config(data=data))
    assert tr.best.step == first["step"] and tr.best.score == first["validation"]


def test_a_best_checkpoint_before_the_last_step_leaves_the_run_reporting_every_step_it_trained(tmp_path, monkeypatch):
    import asyncio
    import io

    from rich.console import Console

    from masrl.driver.run.best import KeepBest

    real = KeepBest.consider
    monkeypatch.setattr(KeepBest, "consider", lambda self, step, score, fill: step == 2 and real(self, step, score, fill))
    run = tmp_path / "run"
    data = _data(run)
    data["train"]["eval_before"] = True
    out = io.StringIO()
    tr = Trainer(load_config(data=data), console=Console(file=out, width=200))
    tr.prepare(resume=False)
    results = asyncio.run(tr.run())
    tr.rt.close()
    assert results["best"]["best_step"] == 2 and tr.step == 4
    assert "before -> after 4 steps" in out.getvalue() and "after 2 steps" not in out.getvalue()

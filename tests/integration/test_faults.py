"""Faults a user meets: a crash while a checkpoint is being replaced, overrides after --checkpoint,
a data file that is not UTF-8, a model path that does not exist. Each test failed before its fix."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tinycfg import tiny_config

from masrl.driver.run import rundir as ckpt
from masrl.errors import DataError, MasrlError

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]


def fill_with(step):
    def fill(d: Path):
        (d / "state.json").write_text(json.dumps({"step": step}))
        (d / "weights.bin").write_bytes(b"x" * 10)

    return fill


def test_a_crash_while_replacing_a_checkpoint_leaves_a_complete_one(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    target = ckpt.step_dir(root, 3)
    ckpt.write_atomically(target, fill_with(3))
    real = os.replace
    calls = {"n": 0}

    def crash_on_second(src, dst):
        calls["n"] += 1
        if calls["n"] == 2:  # the moment the new checkpoint would take the old one's place
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        ckpt.write_atomically(target, fill_with(3))
    monkeypatch.setattr(ckpt.os, "replace", real)
    latest = ckpt.latest_checkpoint(root)
    assert latest is not None and json.loads((latest / "state.json").read_text())["step"] == 3
    ckpt.write_atomically(target, fill_with(3))  # and the next save cleans up
    assert sorted(p.name for p in root.iterdir()) == ["step_000003"]


def test_only_the_last_k_checkpoints_are_kept_and_only_after_the_new_one_is_complete(tmp_path):
    root = tmp_path / "checkpoints"
    for step in range(1, 6):
        ckpt.write_atomically(ckpt.step_dir(root, step), fill_with(step))
        ckpt.prune(root, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000004", "step_000005"]


def test_eval_takes_overrides_after_the_checkpoint_flag(tmp_path):
    data = tiny_config("math/solver", tmp_path / "run", steps=1)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    out = subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-m", "masrl.cli", "eval", str(cfg), "--checkpoint", str(tmp_path / "run"),
                          "data.eval.n=2"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "held-out" in out.stdout


def test_a_data_file_that_is_not_utf8_names_the_file_and_line(tmp_path):
    from masrl.data.loader import load_math_tasks

    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "ok?", "answer": "1"}\n{"question": "caf\xe9?", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl:2: not UTF-8"):
        load_math_tasks(path)


def test_a_missing_model_leaves_no_run_directory(tmp_path):
    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    data = tiny_config("math/solver", tmp_path / "run", steps=1)
    data["model"] = str(tmp_path / "no-such-model")
    with pytest.raises(MasrlError, match="does not exist"):  # the config is checked before anything is made
        Trainer(load_config(data=data), run_dir=tmp_path / "run").prepare(resume=False)
    assert not (tmp_path / "run").exists()

"""A checkpoint that meets a full disk: the half-written folder goes, the last complete checkpoint
stays, and the error says where, how much is free and what to do. The failing writes are real
(into /dev/full, which fails every write with ENOSPC); torch.save's error names no cause, so for it
the free space a full disk would show is reported by a stand-in for ``shutil.disk_usage``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from masrl.driver.run import rundir as ckpt
from masrl.errors import MasrlError

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


def _complete(root: Path, step: int) -> Path:
    def fill(tmp: Path) -> None:
        save_file({"w": torch.zeros(4)}, str(tmp / "model.safetensors"))
        (tmp / "state.json").write_text("{}")
    return ckpt.write_atomically(ckpt.step_dir(root, step), fill)


def _fill_into_dev_full(writer: str):
    def fill(tmp: Path) -> None:
        (tmp / "state.json").write_text("{}")
        target = tmp / "blob"
        target.symlink_to("/dev/full")  # every write to it fails as on a full disk
        if writer == "torch.save":
            torch.save({"w": torch.zeros(1 << 16)}, target)
        else:
            with open(target, "w") as f:
                f.write("x" * (1 << 16))
    return fill


@pytest.mark.parametrize("writer", ["torch.save", "text"])
def test_a_full_disk_stops_the_save_with_an_error_that_names_the_folder_and_the_fix(tmp_path, writer, monkeypatch):
    root = tmp_path / "checkpoints"
    good = _complete(root, 4)
    if writer == "torch.save":  # its error says only "iostream error": the free space tells
        real = ckpt.shutil.disk_usage
        monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda p: real(p)._replace(free=5 * 2**20))

    with pytest.raises(MasrlError) as got:
        ckpt.write_atomically(ckpt.step_dir(root, 8), _fill_into_dev_full(writer))
    msg = str(got.value)
    assert "step_000008" in msg and "disk is full" in msg and "GiB free" in msg
    assert "step_000004" in msg and "train.keep_last" in msg
    assert sorted(p.name for p in root.iterdir()) == ["step_000004"]  # no half-written step_000008(.tmp)
    assert ckpt.latest_checkpoint(root) == good


def test_other_errors_while_saving_pass_through_unchanged(tmp_path):
    def fill(tmp: Path) -> None:
        raise ValueError("not a disk problem")

    with pytest.raises(ValueError, match="not a disk problem"):
        ckpt.write_atomically(ckpt.step_dir(tmp_path, 1), fill)
    # torch.save's causeless error on a disk with room is not called a full disk either
    with pytest.raises(RuntimeError):
        ckpt.write_atomically(ckpt.step_dir(tmp_path, 2), _fill_into_dev_full("torch.save"))

"""Wheels carried to the GPU host in parts (scripts/gpu/pack_parts.sh, parts_install.sh, as vllm_install.sh uses
them): one part a call, each call told what is still missing, the last one joining, checking and installing;
safe to run again, and loud when parts of two packings meet. Real bash, real pip, a real (tiny) wheel."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts" / "gpu"


def _wheel(folder: Path, payload: bytes) -> Path:
    """A pure-Python wheel ``tinypkg`` holding ``payload`` (incompressible, so that it spans several parts)."""
    files = {"tinypkg/__init__.py": b"VALUE = 42\n", "tinypkg/blob.bin": payload,
             "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
             "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
                     for n, b in files.items()) + "tinypkg-1.0.dist-info/RECORD,,\n"
    path = folder / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, b in files.items():
            z.writestr(n, b)
        z.writestr("tinypkg-1.0.dist-info/RECORD", record)
    return path


def _install(call: Path, keep: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PARTS_KEEP": str(keep), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(GPU / "parts_install.sh"), "tiny", ".gpu-tiny", str(site)], cwd=call,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("split") is None or shutil.which("sha256sum") is None, reason="needs coreutils")
def test_parts_carried_one_a_call_are_joined_checked_and_installed_once(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, os.urandom(2_500_000))
    packed = tmp_path / "packed"
    out = subprocess.run(["bash", str(GPU / "pack_parts.sh"), "tiny", str(wheels), str(packed), "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    parts = sorted(p.name for p in packed.iterdir())
    assert parts == ["00", "01", "02"] and "3 parts" in out.stdout
    keep, site = tmp_path / "keep", tmp_path / "site"

    calls = []

    def call(*carried: str) -> subprocess.CompletedProcess:  # a device call's working tree: only what it carries
        calls.append(carried)
        tree = tmp_path / f"call-{len(calls)}"
        for k in carried:
            shutil.copytree(packed / k, tree / ".gpu-tiny" / k)
        tree.mkdir(exist_ok=True)
        got = _install(tree, keep, site)
        assert got.returncode == 0 or "mismatch" in got.stderr, got.stderr
        return got

    assert "no part carried yet" in call().stdout
    assert "have 1 of 3 parts; carry next: .gpu-tiny/01 .gpu-tiny/02" in call("00").stdout
    assert "have 2 of 3 parts; carry next: .gpu-tiny/01" in call("02").stdout
    done = call("01")
    assert "installed 1 wheels" in done.stdout and "sha256 ok" in done.stdout
    value = subprocess.run([sys.executable, "-c", "import tinypkg; print(tinypkg.VALUE)"],
                           env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert value.stdout.strip() == "42"
    assert "already installed" in call("01").stdout
    # the machine went back: /tmp is empty, and the next call says which parts to carry again
    shutil.rmtree(keep)
    shutil.rmtree(site)
    assert "have 1 of 3 parts; carry next: .gpu-tiny/00 .gpu-tiny/02" in call("01").stdout
    # a part of another packing (another sha256) beside these: refused, and the kept parts cleared
    (packed / "02" / "tiny.part-02").write_bytes(b"not the same bytes")
    bad = call("00", "02")
    assert bad.returncode == 1 and "sha256 mismatch" in bad.stderr
    assert not list(keep.glob("tiny.part-*")) and not site.exists()

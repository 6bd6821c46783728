"""One memory bound for a whole sandboxed run (every process it starts), not one per process.

Where this process may create memory cgroups (root, with cgroup v2's memory controller or
cgroup v1's memory hierarchy), each sandbox uid gets a cgroup ``masrl/<uid>`` whose limit is
``Limits.memory_mb``; the run's first process joins it before it drops root, so its children
stay inside, and an OOM kill there is reported as a memory verdict. Elsewhere the bound is a
share: at most ``memory_mb // 128`` processes (and no more than ``max_procs``), each with an
address-space limit of ``memory_mb`` divided by that count. ``describe()`` says which applies.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

from masrl.sandbox.result import Limits

V2_ROOT = Path("/sys/fs/cgroup")
V1_ROOT = Path("/sys/fs/cgroup/memory")
SHARE_MB = 128  # per process when memory is shared out by rlimits


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _v2_ready() -> Path | None:
    if not (V2_ROOT / "cgroup.controllers").is_file() or "memory" not in (V2_ROOT / "cgroup.controllers").read_text():
        return None
    parent = V2_ROOT / "masrl"
    try:
        if "memory" not in (V2_ROOT / "cgroup.subtree_control").read_text():
            _write(V2_ROOT / "cgroup.subtree_control", "+memory")
        parent.mkdir(exist_ok=True)
        if "memory" not in (parent / "cgroup.subtree_control").read_text():
            _write(parent / "cgroup.subtree_control", "+memory")
    except OSError:
        return None
    return parent


def _v1_ready() -> Path | None:
    if not (V1_ROOT / "memory.limit_in_bytes").is_file():
        return None
    parent = V1_ROOT / "masrl"
    try:
        parent.mkdir(exist_ok=True)
    except OSError:
        return None
    return parent


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[str, Path | None]:
    if os.geteuid() != 0:
        return "share", None
    for kind, ready in (("cgroup2", _v2_ready), ("cgroup1", _v1_ready)):
        parent = ready()
        if parent is None:
            continue
        leaf = parent / f"probe-{os.getpid()}"
        try:
            leaf.mkdir(exist_ok=True)
            _set_limit(kind, leaf, 64)
            return kind, parent
        except OSError:
            continue
        finally:
            try:
                leaf.rmdir()
            except OSError:
                pass
    return "share", None


def mode() -> str:
    """``cgroup2`` | ``cgroup1`` | ``share`` (per-process address-space shares)."""
    return _probe()[0]


def describe() -> str:
    kind, parent = _probe()
    if kind == "share":
        return (f"memory per run: no writable memory cgroup, so at most memory_mb // {SHARE_MB} processes per run, "
                "each limited to its share of memory_mb (address space)")
    return f"memory per run: {kind} memory cgroup per sandbox uid under {parent}"


def _set_limit(kind: str, leaf: Path, memory_mb: int) -> None:
    n = str(memory_mb * 1024 * 1024)
    if kind == "cgroup2":
        _write(leaf / "memory.max", n)
        if (leaf / "memory.swap.max").exists():
            _write(leaf / "memory.swap.max", "0")
        return
    sw = leaf / "memory.memsw.limit_in_bytes"
    try:  # memsw must stay >= the limit: lower the limit first, or raise memsw first
        _write(leaf / "memory.limit_in_bytes", n)
        if sw.exists():
            _write(sw, n)
    except OSError:
        if not sw.exists():
            raise
        _write(sw, n)
        _write(leaf / "memory.limit_in_bytes", n)


def oom_kills(leaf: Path) -> int:
    """How many processes the kernel has OOM-killed in ``leaf`` so far."""
    name = "memory.events" if (leaf / "memory.events").exists() else "memory.oom_control"
    try:
        for line in (leaf / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except OSError:
        pass
    return 0


def prepare(uid: int, limits: Limits) -> Path | None:
    """The cgroup of ``uid`` with the run's limit set (None without cgroups). A run joins it by
    writing its pid to ``leaf / "cgroup.procs"``."""
    kind, parent = _probe()
    if parent is None:
        return None
    leaf = parent / str(uid)
    leaf.mkdir(exist_ok=True)
    _set_limit(kind, leaf, limits.memory_mb)
    return leaf


def process_limits(limits: Limits) -> Limits:
    """The per-process rlimits a run gets: unchanged under a cgroup; without one, memory_mb is
    shared out among at most memory_mb // SHARE_MB processes."""
    if mode() != "share":
        return limits
    procs = max(1, min(limits.max_procs, limits.memory_mb // SHARE_MB))
    return dataclasses.replace(limits, memory_mb=max(1, limits.memory_mb // procs), max_procs=procs)

"""Which walls this machine allows, the sandbox's uid, interpreter and working directories.

Modes, probed once by ``isolation()``:
* ``namespaces``: root with ``unshare``: private network, pid and mount namespaces, an
  unprivileged uid per pool slot with no capabilities (the best walls; used here).
* ``uid``: root without ``unshare``: the unprivileged per-slot uid only; the network is refused
  by the audit hook alone.
* ``user-namespace``: not root, unprivileged user namespaces work: private network and pid
  namespaces; the process limit counts against the invoking user.
* ``rlimits-only``: resource limits, the timeout and the audit hook. The audit hook is a speed
  bump, not a wall (ctypes gets around it): run such hosts' sandboxes in a container or VM.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

UID_BASE = 61000  # slot uids are taken from UID_BASE upwards
UID_RANGE = 4096
_CLAIMED: dict[int, tuple[int, int]] = {}  # slot -> (uid, fd of its held lock)
_CLAIM_LOCK = threading.Lock()


def slot_uid(slot: int) -> int:
    """The uid this process's pool slot ``slot`` runs programs as, unique among processes.

    Each uid is claimed with an exclusive ``flock`` on ``/run/masrl-uids/<uid>.lock`` (or the
    sandbox root's ``uids/``), held until this process exits, so two masrl processes on one
    machine never share a uid (a clean-up kills every process of its uid) or a cgroup.
    """
    with _CLAIM_LOCK:
        if slot in _CLAIMED:
            return _CLAIMED[slot][0]
        lock_dir = Path("/run/masrl-uids") if os.geteuid() == 0 and os.path.isdir("/run") else sandbox_root() / "uids"
        lock_dir.mkdir(parents=True, exist_ok=True)
        taken = {uid for uid, _ in _CLAIMED.values()}
        for uid in range(UID_BASE, UID_BASE + UID_RANGE):
            if uid in taken:
                continue
            fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            _CLAIMED[slot] = (uid, fd)
            return uid
        raise RuntimeError(f"all {UID_RANGE} sandbox uids from {UID_BASE} are held by other processes")


@functools.lru_cache(maxsize=1)
def isolation() -> str:
    """Which walls this machine allows; probed once."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "uid" if os.geteuid() == 0 else "rlimits-only"
    if os.geteuid() == 0 and shutil.which("setpriv"):
        probe = [unshare, "-n", "-m", "--propagation", "private", "sh", "-c",
                 f"mount -t tmpfs tmpfs /tmp && exec setpriv --reuid={UID_BASE} --regid={UID_BASE} --clear-groups "
                 "--no-new-privs /bin/sh -c true"]
        if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
            return "namespaces"
    if os.geteuid() == 0:
        return "uid"
    if subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=30).returncode == 0:
        return "user-namespace"
    return "rlimits-only"


def drop_to(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


@functools.lru_cache(maxsize=1)
def sandbox_python() -> str:
    """The interpreter sandboxed programs run with.

    When the sandbox drops root to an unprivileged uid, that uid may be unable to reach this
    process's interpreter (a venv or pyenv under /root, say); then the first system Python it
    can run is used. Set ``MASRL_SANDBOX_PYTHON`` to choose. Sandboxed code sees only the
    standard library of that interpreter, never the trainer's packages.
    """
    chosen = os.environ.get("MASRL_SANDBOX_PYTHON")
    if chosen:
        return chosen
    if isolation() not in ("namespaces", "uid"):
        return sys.executable
    candidates = [sys.executable, os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3",
                  "/bin/python3"]
    for exe in candidates:
        if not os.path.isfile(exe):
            continue
        try:
            r = subprocess.run([exe, "-I", "-c", "pass"], capture_output=True, timeout=30,
                               preexec_fn=functools.partial(drop_to, UID_BASE))
        except OSError:  # not executable by that uid
            continue
        if r.returncode == 0:
            return exe
    raise RuntimeError(f"no Python interpreter is executable by the sandbox uid {UID_BASE}; set MASRL_SANDBOX_PYTHON")


def user_process_count() -> int:
    uid = os.getuid()
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


HIDDEN_IN_SANDBOX = ("/tmp", "/var/tmp", "/dev/shm")  # covered by fresh tmpfs inside the namespaces


def _hidden(path: Path) -> bool:
    real = os.path.realpath(path)
    return any(real == h or real.startswith(h + os.sep) for h in HIDDEN_IN_SANDBOX)


def sandbox_root() -> Path:
    """Parent of the per-run directories (``MASRL_SANDBOX_DIR`` to choose).

    In namespaces mode run directories are bind-mounted into the sandbox after fresh tmpfs cover
    /tmp, /var/tmp and /dev/shm there, so they must live elsewhere: under the cache dir, or
    /var/lib/masrl/sandbox when the cache dir itself is under /tmp. Otherwise the sandbox uid
    must reach its directory itself, so it is a folder under the temp dir anyone may traverse.
    """
    from masrl.data.cache import cache_dir

    env = os.environ.get("MASRL_SANDBOX_DIR")
    mode = isolation()
    if env:
        root = Path(env)
        if mode == "namespaces" and _hidden(root):
            raise RuntimeError(f"MASRL_SANDBOX_DIR={env} is under {', '.join(HIDDEN_IN_SANDBOX)}, which the sandbox "
                               "covers with a fresh tmpfs; choose a directory elsewhere")
    elif mode == "namespaces":
        root = cache_dir() / "sandbox"
        if _hidden(root):
            root = Path("/var/lib/masrl/sandbox")
    else:
        root = Path(tempfile.gettempdir()) / f"masrl-sandbox-{os.getuid()}"
    root.mkdir(parents=True, exist_ok=True)
    if mode == "uid":
        os.chmod(root, 0o711)
    return root

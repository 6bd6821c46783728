"""Run untrusted, model-written Python in a subprocess with walls around it.

Every run gets:
* its own process in a new session (its whole process group is killed on timeout);
* a fresh temporary directory as cwd, removed afterwards;
* a minimal environment (PATH, LANG, HOME=cwd): nothing inherited, so no secrets;
* resource limits: CPU seconds, address space, file size, open files, processes, no core dumps;
* a wall-clock timeout, and stdout/stderr read up to a cap (past it the run is killed);
* an audit hook in the child that refuses sockets and writes outside its directory.

In namespaces mode each slot of the pool keeps a pre-started zygote (``zygote.py``) that forks
one child per program, with the same walls per child, so a run costs a fork (~8 ms) instead of
an interpreter start inside fresh namespaces (~50 ms).

More walls where the machine allows them (private network, pid, IPC and mount namespaces, every
mount read-only but the run's own folder and fresh tmpfs, an unprivileged uid per slot claimed
across processes, one memory cgroup per run): ``isolation.py`` lists the modes and
``isolation()`` says which applies; ``cgroups.describe()`` says how memory is bounded. Weaker
modes warn; ``sandbox.require: namespaces`` refuses to run without the full walls.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from pathlib import Path

from masrl.sandbox import cgroups
from masrl.sandbox.harness import apply_limits, kill_uid_processes
from masrl.sandbox.isolation import (
    UID_BASE,
    drop_to,
    isolation,
    sandbox_python,
    sandbox_root,
    slot_uid,
    user_process_count,
)
from masrl.sandbox.result import (
    CODE_COMPILE,
    CODE_IMPORT,
    CODE_MEMORY,
    Limits,
    RunResult,
    signal_detail,
    status_from_exit,
)
from masrl.sandbox.zygote_client import HARNESS, ZYGOTE, use_zygote, zygote_for

__all__ = ["Limits", "RunResult", "Sandbox", "run_python", "isolation", "UID_BASE", "CODE_COMPILE", "CODE_IMPORT",
           "CODE_MEMORY", "SandboxUnavailable", "check_isolation", "slot_uid"]


class SandboxUnavailable(RuntimeError):
    """The machine cannot give the walls the config requires (``sandbox.require``)."""


def check_isolation(require: str = "any") -> str:
    """The isolation mode, after warning when it is weaker than namespaces; with
    ``require="namespaces"``, refuse anything less."""
    kind = isolation()
    if kind == "namespaces":
        return kind
    why = {"uid": "no `unshare`: programs run as a separate uid but share the network, /tmp and IPC with the host",
           "user-namespace": "not root: private network and pid namespaces, but programs run as your own user and "
                             "can write where you can",
           "rlimits-only": "no namespaces and no separate uid: only resource limits and an audit hook (which ctypes "
                           "gets around) stand between model-written code and this machine"}[kind]
    if require == "namespaces":
        raise SandboxUnavailable(f"sandbox.require is 'namespaces' but this machine allows only '{kind}' ({why}); run "
                                 "as root on Linux with util-linux's unshare and setpriv, or set sandbox.require: any")
    warnings.warn(f"the sandbox runs in '{kind}' mode: {why}. Run it in a container or VM, or set sandbox.require: "
                  "namespaces to refuse", UserWarning, stacklevel=2)
    return kind


def _limit_child(limits: Limits, nproc: int, uid: int | None = None, cgroup_procs: str | None = None) -> None:
    """preexec_fn: runs in the child between fork and exec. Joins the run's cgroup (so every
    process of the run is inside it); ``uid``: drop root to it last."""
    if cgroup_procs:
        with open(cgroup_procs, "w") as f:
            f.write(str(os.getpid()))
    apply_limits(limits.cpu_s, limits.memory_mb, limits.file_size_mb, limits.max_open_files, nproc)
    if uid is not None:
        drop_to(uid)


def _command(workdir: Path, mode: str, uid: int | None, kind: str) -> list[str]:
    py = [sandbox_python(), "-I", "-B", "_harness.py", mode]
    if kind == "namespaces":
        script = (
            '"$0" -I -B "$1" --walls "$2" || exit 70; cd /tmp/work && shift 2 && '
            f"setpriv --reuid={uid} --regid={uid} --clear-groups --no-new-privs "
            '--inh-caps=-all --bounding-set=-all "$@"; exit $?'
        )
        # The walls (read-only mounts, fresh tmpfs, the run folder at /tmp/work) are zygote.py's,
        # built in this namespace by its --walls entry. sh stays as pid 1 of the namespace (no
        # exec): pid 1 ignores signals it has no handler for, so the program must not be pid 1,
        # and sh reports a killed child as 128 + signal.
        return ["unshare", "-n", "-m", "-i", "-p", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
                "sh", "-c", script, sandbox_python(), str(ZYGOTE), str(workdir), *py]
    if kind == "user-namespace":
        return ["unshare", "-rn", "-p", "--fork", "--kill-child", "sh", "-c", '"$@"; exit $?', "sandbox", *py]
    return py


def _kill_group(proc: subprocess.Popen, uid: int | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        # The pid namespace dies with its first process, taking every descendant with it (also
        # ones that left the process group with setsid). Sweep the slot's uid anyway, in case:
        # the uid is this process's alone (slot_uid), so no other masrl process is touched.
        kill_uid_processes(uid)


def _reader(stream, cap: int, sink: list, over: threading.Event) -> None:
    total = 0
    while True:
        chunk = stream.read(4096)
        if not chunk:
            return
        if total < cap:
            sink.append(chunk[: cap - total])
        total += len(chunk)
        if total > cap:
            over.set()


def run_python(code: str, *, mode: str = "script", stdin: str | None = None, limits: Limits = Limits(),
               files: dict[str, str] | None = None, slot: int = 0) -> RunResult:
    """Run ``code`` in a fresh sandboxed process and wait for it (blocking)."""
    kind = isolation()
    uid = slot_uid(slot) if kind in ("namespaces", "uid") else None
    leaf = cgroups.prepare(uid, limits) if uid is not None else None
    kills = cgroups.oom_kills(leaf) if leaf is not None else 0
    plimits = cgroups.process_limits(limits)
    if use_zygote():
        res = zygote_for(slot).run(mode, {"program.py": code, **(files or {})}, stdin, plimits,
                                   cgroup_procs=str(leaf / "cgroup.procs") if leaf is not None else None)
    else:
        res = _run_fresh(code, mode, stdin, plimits, files, uid, kind, leaf)
    if leaf is not None and cgroups.oom_kills(leaf) > kills:
        res.detail = (res.detail + "; " if res.detail else "") + \
            f"the kernel killed a process of the run at its {limits.memory_mb} MB memory limit"
        if res.status in ("timeout", "runtime_error"):
            res.status = "memory"
    return res


def _run_fresh(code: str, mode: str, stdin: str | None, limits: Limits, files: dict[str, str] | None,
               uid: int | None, kind: str, leaf: Path | None) -> RunResult:
    workdir = Path(tempfile.mkdtemp(prefix="run-", dir=sandbox_root()))
    try:
        nproc = _prepare_workdir(workdir, code, files, uid, limits)
        home = "/tmp/work" if kind == "namespaces" else str(workdir)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
               "PYTHONIOENCODING": "utf-8"}
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            _command(workdir, mode, uid, kind), cwd=workdir, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=functools.partial(_limit_child, limits, nproc, uid if kind == "uid" else None,
                                         str(leaf / "cgroup.procs") if leaf is not None else None),
        )
        out, err, over = [], [], threading.Event()
        threads = [threading.Thread(target=_reader, args=(proc.stdout, limits.output_bytes, out, over), daemon=True),
                   threading.Thread(target=_reader, args=(proc.stderr, limits.output_bytes, err, over), daemon=True)]
        for t in threads:
            t.start()
        try:
            if stdin:
                proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        status = _wait(proc, over, t0 + limits.wall_s)
        _kill_group(proc, uid)
        proc.wait()
        for t in threads:
            t.join(timeout=2)
        duration = time.perf_counter() - t0
        rc = proc.returncode
        stdout = b"".join(out).decode("utf-8", "replace")
        stderr = b"".join(err).decode("utf-8", "replace")
        if rc == 70 and "sandbox set-up failed" in stderr:
            raise RuntimeError(f"sandbox could not set up a run: {stderr.strip()[-500:]}")
        status = status or status_from_exit(rc, over.is_set())
        if status == "runtime_error" and "MemoryError" in stderr[-300:]:
            status = "memory"
        left = {}
        res = workdir / "results.jsonl"
        if res.is_file() and res.stat().st_size < 8 * 1024 * 1024:
            left["results.jsonl"] = res.read_text(errors="replace")
        return RunResult(status, rc, stdout, stderr, duration, left,
                         signal_detail(rc, via_shell=kind in ("namespaces", "user-namespace")))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _prepare_workdir(workdir: Path, code: str, files: dict[str, str] | None, uid: int | None, limits: Limits) -> int:
    """The program, the harness and the run's files, owned by the slot uid; returns the process
    limit to set (a per-uid count: the caller's own processes count against it without a uid)."""
    (workdir / "program.py").write_text(code)
    shutil.copyfile(HARNESS, workdir / "_harness.py")
    for name, text in (files or {}).items():
        (workdir / name).write_text(text)
    if uid is None:
        return user_process_count() + limits.max_procs
    os.chown(workdir, uid, uid)
    for p in workdir.iterdir():
        os.chown(p, uid, uid)
    return limits.max_procs


def _wait(proc, over: threading.Event, deadline: float) -> str | None:
    """Wait for the program to exit; ``output_limit`` or ``timeout`` when it had to be stopped."""
    while proc.poll() is None:
        if over.is_set():
            return "output_limit"
        if time.perf_counter() > deadline:
            return "timeout"
        time.sleep(0.002)
    return None


class Sandbox:
    """An async pool: at most ``max_workers`` programs run at once; callers await their result."""

    def __init__(self, max_workers: int | None = None, limits: Limits = Limits()):
        self.max_workers = max_workers or max(1, os.cpu_count() or 1)
        self.limits = limits
        self._slots: asyncio.Queue | None = None
        self._loop = None

    def _queue(self) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._loop = loop
            self._slots = asyncio.Queue()
            for k in range(self.max_workers):
                self._slots.put_nowait(k)
        return self._slots

    async def run(self, code: str, *, mode: str = "script", stdin: str | None = None, limits: Limits | None = None,
                  files: dict[str, str] | None = None) -> RunResult:
        slots = self._queue()
        slot = await slots.get()
        try:
            fn = functools.partial(run_python, code, mode=mode, stdin=stdin, limits=limits or self.limits,
                                   files=files, slot=slot)
            return await asyncio.get_running_loop().run_in_executor(None, fn)
        finally:
            slots.put_nowait(slot)

    @staticmethod
    def isolation() -> str:
        return isolation()

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

Where the machine allows it (``isolation()`` says which applies):
* ``namespaces``: running as root with ``unshare``: a private network namespace (no interfaces
  but a downed loopback: no network at all), a private pid namespace (when its first process
  ends, the kernel kills every descendant), a private mount namespace with fresh small tmpfs
  on /tmp, /var/tmp and /dev/shm, and the program runs as an unprivileged uid of its own per
  pool slot with no capabilities, so the process limit is enforced and the host's files are
  protected by permissions.
* ``uid``: root without ``unshare``: the unprivileged per-slot uid (process limit enforced,
  host files protected by permissions), but the network is only refused by the audit hook.
* ``user-namespace``: not root but unprivileged user namespaces work: private network and pid
  namespaces; the process limit is counted against the invoking user.
* ``rlimits-only``: neither: resource limits, the audit hook and the timeout only. The audit
  hook is a speed bump, not a wall (ctypes can get around it): run such hosts' sandboxes in a
  container or VM.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HARNESS = Path(__file__).with_name("harness.py")
ZYGOTE = Path(__file__).with_name("zygote.py")
CODE_MEMORY, CODE_COMPILE, CODE_IMPORT = 75, 76, 77
UID_BASE = 61000  # namespaces mode: slot k runs as uid UID_BASE + k


@dataclass(frozen=True)
class Limits:
    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 512
    file_size_mb: int = 16
    max_procs: int = 32
    max_open_files: int = 64
    output_bytes: int = 64_000
    case_timeout_s: float = 2.0  # per case when many cases share one process


@dataclass
class RunResult:
    status: str  # ok | runtime_error | compile_error | timeout | memory | output_limit
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    files: dict[str, str] = field(default_factory=dict)  # small files the harness left (results.jsonl)


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


def _drop_to(uid: int) -> None:
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
                               preexec_fn=functools.partial(_drop_to, UID_BASE))
        except OSError:  # not executable by that uid
            continue
        if r.returncode == 0:
            return exe
    raise RuntimeError(f"no Python interpreter is executable by the sandbox uid {UID_BASE}; set MASRL_SANDBOX_PYTHON")


def _user_process_count() -> int:
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


def _limit_child(limits: Limits, nproc: int, uid: int | None = None) -> None:
    """preexec_fn: runs in the child between fork and exec. ``uid``: drop root to it last."""
    cpu = max(1, int(limits.cpu_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = limits.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = limits.file_size_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    if uid is not None:
        _drop_to(uid)


def _command(workdir: Path, mode: str, slot: int, kind: str) -> list[str]:
    py = [sandbox_python(), "-I", "-B", "_harness.py", mode]
    if kind == "namespaces":
        uid = UID_BASE + slot
        script = (
            "mount -t tmpfs -o size=16m,mode=1777 tmpfs /tmp && "
            "mount -t tmpfs -o size=16m,mode=1777 tmpfs /var/tmp 2>/dev/null; "
            "mount -t tmpfs -o size=16m,mode=1777 tmpfs /dev/shm 2>/dev/null; "
            'mkdir /tmp/work && mount --bind "$1" /tmp/work && cd /tmp/work && shift && '
            f"setpriv --reuid={uid} --regid={uid} --clear-groups --no-new-privs "
            '--inh-caps=-all --bounding-set=-all "$@"; exit $?'
        )
        # sh stays as pid 1 of the namespace (no exec): pid 1 ignores signals it has no handler
        # for, so the program must not be pid 1, and sh reports a killed child as 128 + signal.
        return ["unshare", "-n", "-m", "-p", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
                "sh", "-c", script, "sandbox", str(workdir), *py]
    if kind == "user-namespace":
        return ["unshare", "-rn", "-p", "--fork", "--kill-child", "sh", "-c", '"$@"; exit $?', "sandbox", *py]
    return py


def _kill_group(proc: subprocess.Popen, slot: int, kind: str) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if kind in ("namespaces", "uid"):
        # The pid namespace dies with its first process, taking every descendant with it (also
        # ones that left the process group with setsid). Sweep the slot's uid anyway, in case.
        uid = UID_BASE + slot
        for _ in range(20):
            found = False
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        if os.stat(f"/proc/{pid}").st_uid == uid:
                            found = True
                            os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
            if not found:
                break
            time.sleep(0.01)


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


def sandbox_root() -> Path:
    """Parent of the per-run directories (``MASRL_SANDBOX_DIR`` to choose).

    In namespaces mode it is under the cache dir: /tmp is hidden behind a tmpfs there, and the run
    directory is bind-mounted, so only root needs to reach it. Otherwise the sandbox uid must
    reach it itself, so it is a folder under the temp dir that anyone may traverse.
    """
    from masrl.models import cache_dir

    env = os.environ.get("MASRL_SANDBOX_DIR")
    if env:
        root = Path(env)
    elif isolation() == "namespaces":
        root = cache_dir() / "sandbox"
    else:
        root = Path(tempfile.gettempdir()) / f"masrl-sandbox-{os.getuid()}"
    root.mkdir(parents=True, exist_ok=True)
    if isolation() == "uid":
        os.chmod(root, 0o711)
    return root


class Zygote:
    """Parent side of ``zygote.py``: one pre-started sandbox process per pool slot.

    Used in namespaces mode (set ``MASRL_SANDBOX_ZYGOTE=0`` to start a fresh process per run
    instead). Each program still runs in a child of its own with its own mount namespace, /tmp,
    run directory and limits; only the interpreter start-up is shared. A zygote that stops
    answering is killed and restarted.
    """

    def __init__(self, slot: int):
        self.slot = slot
        self.uid = UID_BASE + slot
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.n = 0

    def _start(self) -> None:
        base = sandbox_root() / f"zygote-{self.slot}"
        base.mkdir(parents=True, exist_ok=True)
        cmd = ["unshare", "-n", "-m", "-p", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
               sandbox_python(), "-I", "-B", str(ZYGOTE), str(self.uid), str(HARNESS), str(base)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True)
        line = self._readline(30.0)
        if not line or not json.loads(line).get("ready"):
            err = self.proc.stderr.read1(4000).decode(errors="replace") if self.proc.poll() is not None else ""
            self.close()
            raise RuntimeError(f"sandbox zygote for slot {self.slot} did not start: {err.strip()[-500:]}")

    def _readline(self, timeout: float) -> bytes | None:
        import select

        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        return self.proc.stdout.readline()

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if f is not None:
                    f.close()
            self.proc = None

    def run(self, mode: str, files: dict[str, str], stdin: str | None, limits: Limits) -> RunResult:
        with self.lock:
            for attempt in (1, 2):
                if self.proc is None or self.proc.poll() is not None:
                    self.close()
                    self._start()
                self.n += 1
                req = {"id": self.n, "mode": mode, "files": files, "stdin": stdin,
                       "limits": {k: getattr(limits, k) for k in ("cpu_s", "wall_s", "memory_mb", "file_size_mb",
                                                                   "max_procs", "max_open_files", "output_bytes")}}
                try:
                    self.proc.stdin.write((json.dumps(req) + "\n").encode())
                    self.proc.stdin.flush()
                    line = self._readline(limits.wall_s + 15.0)
                except (BrokenPipeError, OSError):
                    line = None
                if line:
                    rep = json.loads(line)
                    if rep.get("status") != "error":
                        return _result_from_reply(rep)
                    if attempt == 2:
                        return RunResult("runtime_error", None, "", rep.get("stderr", ""), 0.0)
                self.close()  # no answer: kill it; the next attempt starts a fresh one
            return RunResult("runtime_error", None, "", "the sandbox zygote stopped answering", 0.0)


def _result_from_reply(rep: dict) -> RunResult:
    rc = rep["returncode"]
    stderr = rep["stderr"]
    status = rep["status"] or _status_from_exit(rc, False)
    if rc == 70 and "set-up failed" in stderr:
        raise RuntimeError(f"sandbox could not set up a run: {stderr.strip()}")
    if status == "runtime_error" and "MemoryError" in stderr[-300:]:
        status = "memory"
    return RunResult(status, rc, rep["stdout"], stderr, rep["duration_s"], rep["files"])


_ZYGOTES: dict[int, Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def _zygote(slot: int) -> Zygote:
    with _ZYGOTES_LOCK:
        z = _ZYGOTES.get(slot)
        if z is None:
            z = _ZYGOTES[slot] = Zygote(slot)
        return z


def shutdown_zygotes() -> None:
    with _ZYGOTES_LOCK:
        for z in _ZYGOTES.values():
            z.close()
        _ZYGOTES.clear()


atexit.register(shutdown_zygotes)


def use_zygote() -> bool:
    return isolation() == "namespaces" and os.environ.get("MASRL_SANDBOX_ZYGOTE", "1") != "0"


def run_python(code: str, *, mode: str = "script", stdin: str | None = None, limits: Limits = Limits(),
               files: dict[str, str] | None = None, slot: int = 0) -> RunResult:
    """Run ``code`` in a fresh sandboxed process and wait for it (blocking)."""
    if use_zygote():
        return _zygote(slot).run(mode, {"program.py": code, **(files or {})}, stdin, limits)
    kind = isolation()
    workdir = Path(tempfile.mkdtemp(prefix="run-", dir=sandbox_root()))
    try:
        (workdir / "program.py").write_text(code)
        shutil.copyfile(HARNESS, workdir / "_harness.py")
        for name, text in (files or {}).items():
            (workdir / name).write_text(text)
        if kind in ("namespaces", "uid"):
            os.chown(workdir, UID_BASE + slot, UID_BASE + slot)
            for p in workdir.iterdir():
                os.chown(p, UID_BASE + slot, UID_BASE + slot)
            nproc = limits.max_procs
        else:
            nproc = _user_process_count() + limits.max_procs
        home = "/tmp/work" if kind == "namespaces" else str(workdir)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
               "PYTHONIOENCODING": "utf-8"}
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            _command(workdir, mode, slot, kind), cwd=workdir, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=functools.partial(_limit_child, limits, nproc, UID_BASE + slot if kind == "uid" else None),
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
        status = None
        deadline = t0 + limits.wall_s
        while proc.poll() is None:
            if over.is_set():
                status = "output_limit"
                break
            if time.perf_counter() > deadline:
                status = "timeout"
                break
            time.sleep(0.002)
        _kill_group(proc, slot, kind)
        proc.wait()
        for t in threads:
            t.join(timeout=2)
        duration = time.perf_counter() - t0
        rc = proc.returncode
        if status is None:
            status = _status_from_exit(rc, over.is_set())
        stdout = b"".join(out).decode("utf-8", "replace")
        stderr = b"".join(err).decode("utf-8", "replace")
        if status == "runtime_error" and "MemoryError" in stderr[-300:]:
            status = "memory"
        left = {}
        res = workdir / "results.jsonl"
        if res.is_file() and res.stat().st_size < 8 * 1024 * 1024:
            left["results.jsonl"] = res.read_text(errors="replace")
        return RunResult(status, rc, stdout, stderr, duration, left)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _status_from_exit(rc: int, over: bool) -> str:
    if over:
        return "output_limit"
    if rc == 0:
        return "ok"
    if rc == CODE_MEMORY:
        return "memory"
    if rc == CODE_COMPILE:
        return "compile_error"
    if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGKILL):
        return "timeout"  # the CPU limit sends SIGXCPU, then SIGKILL at the hard limit
    if rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return "output_limit"
    if rc in (-signal.SIGSEGV, 128 + signal.SIGSEGV):
        return "memory"
    return "runtime_error"


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

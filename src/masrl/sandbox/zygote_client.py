"""Parent side of ``zygote.py``: one pre-started sandbox process per pool slot."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

from masrl.sandbox.isolation import isolation, sandbox_python, sandbox_root, slot_uid
from masrl.sandbox.result import Limits, RunResult, signal_detail, status_from_exit

HARNESS = Path(__file__).with_name("harness.py")
ZYGOTE = Path(__file__).with_name("zygote.py")


class Zygote:
    """Parent side of ``zygote.py``: one pre-started sandbox process per pool slot.

    Used in namespaces mode (set ``MASRL_SANDBOX_ZYGOTE=0`` to start a fresh process per run
    instead). Each program still runs in a child of its own with its own mount namespace, /tmp,
    run directory and limits; only the interpreter start-up is shared. A zygote that stops
    answering is killed and restarted.
    """

    def __init__(self, slot: int):
        self.slot = slot
        self.uid = slot_uid(slot)
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.n = 0

    def _start(self) -> None:
        base = sandbox_root() / f"zygote-{self.slot}"
        base.mkdir(parents=True, exist_ok=True)
        cmd = ["unshare", "-n", "-m", "-i", "-p", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
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

    def run(self, mode: str, files: dict[str, str], stdin: str | None, limits: Limits,
            cgroup_procs: str | None = None) -> RunResult:
        with self.lock:
            for attempt in (1, 2):
                if self.proc is None or self.proc.poll() is not None:
                    self.close()
                    self._start()
                self.n += 1
                req = {"id": self.n, "mode": mode, "files": files, "stdin": stdin, "cgroup_procs": cgroup_procs,
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
    status = rep["status"] or status_from_exit(rc, False)
    if rc == 70 and "set-up failed" in stderr:
        raise RuntimeError(f"sandbox could not set up a run: {stderr.strip()}")
    if status == "runtime_error" and "MemoryError" in stderr[-300:]:
        status = "memory"
    return RunResult(status, rc, rep["stdout"], stderr, rep["duration_s"], rep["files"], signal_detail(rc))


_ZYGOTES: dict[int, Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def zygote_for(slot: int) -> Zygote:
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



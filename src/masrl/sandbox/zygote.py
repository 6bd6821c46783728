"""The sandbox zygote: a pre-started process per pool slot that forks one child per program.

Starting a fresh interpreter inside fresh namespaces costs ~45 ms per program; forking a
process that already sits in them, with the harness imported, costs a few. The zygote runs as
root *inside* private network, pid and mount namespaces (started by ``sandbox.py`` with
``unshare``) and only ever runs this file's code. For each program it forks a child that:

  1. enters mount and IPC namespaces of its own (SysV shared memory, semaphores and message queues
     die with the run), joins the run's memory cgroup when there is one, remounts every mount
     read-only, then puts fresh tmpfs on /tmp, /var/tmp and /dev/shm and its run directory,
     writable, at /tmp/work: the run can write nowhere else (no world-writable host directory,
     /run/lock say, keeps a file), and nothing written by one run is seen by the next;
  2. moves to a new session, sets the resource limits, closes every inherited descriptor but the
     three pipes to the zygote, drops to the slot's unprivileged uid with no capabilities and
     ``no_new_privs``;
  3. runs the harness in-process and exits.

The child cannot signal or trace the zygote (different uid). After each run the zygote kills
every process of the slot uid left in its pid namespace and reaps orphans (it is pid 1 there).

Protocol on stdin/stdout: one JSON request per line, one JSON reply per line.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import shutil
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1, 32, 4096, 16384, 1 << 18, 1 << 21
KEEP_FLAGS = 2 | 4 | 8 | 1024 | 2048  # nosuid, nodev, noexec, noatime, nodiratime: same bits in statvfs
PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, dst, fstype, flags, data) -> None:
    def enc(x):
        return x.encode() if isinstance(x, str) else x

    _check(_libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {dst}")


def _mount_points() -> list[str]:
    import re

    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            points.append(mp)
    return points


def _remount(path: str, read_only: bool) -> None:
    f = os.statvfs(path).f_flag
    flags = MS_REMOUNT | MS_BIND | (f & KEEP_FLAGS) | (MS_RELATIME if f & 4096 else 0) | (MS_RDONLY if read_only else 0)
    _mount(None, path, None, flags, None)


def build_walls(run_dir: str, cgroup_procs: str | None = None) -> None:
    """In a process that already has a mount namespace of its own (as root): join the run's
    cgroup, make every mount read-only, then fresh tmpfs on /tmp, /var/tmp, /dev/shm and the run
    directory, writable, at /tmp/work. Raises if any writable mount cannot be made read-only."""
    if cgroup_procs:
        with open(cgroup_procs, "w") as f:
            f.write(str(os.getpid()))
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    stuck = []
    for mp in _mount_points():
        try:
            if not os.statvfs(mp).f_flag & 1:
                _remount(mp, True)
        except OSError as exc:
            if not os.path.exists(mp):  # covered by a later mount
                continue
            stuck.append(f"{mp} ({exc.strerror})")
    if stuck:
        raise OSError(f"could not make {', '.join(stuck)} read-only")
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            _mount("tmpfs", d, "tmpfs", 0, "size=16m,mode=1777")
    os.mkdir("/tmp/work")
    _mount(run_dir, "/tmp/work", None, MS_BIND, None)
    _remount("/tmp/work", False)  # a bind mount starts with its source's flags: read-only by now


def _child(req: dict, run_dir: str, uid: int, fds: tuple[int, int, int]) -> None:
    """In the forked child: build the walls, then run the harness. Never returns."""
    code = 1
    try:
        os.setsid()
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare")
        build_walls(run_dir, req.get("cgroup_procs"))
        os.chdir("/tmp/work")
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        os.closerange(3, 1 << 16)
        lim = req["limits"]
        sys.modules["_harness"].apply_limits(lim["cpu_s"], lim["memory_mb"], lim["file_size_mb"],
                                             lim["max_open_files"], lim["max_procs"])
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp/work",
                           "PYTHONIOENCODING": "utf-8"})
        import io

        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", line_buffering=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        code = sys.modules["_harness"].main(req["mode"])
        code = code if isinstance(code, int) else 1
    except BaseException as exc:  # walls failed to go up: never run the program
        try:
            os.write(2, f"sandbox child set-up failed: {exc}\n".encode())
        except OSError:
            pass
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(code)


def _sweep(uid: int) -> None:
    """Kill every process of ``uid`` left in this pid namespace, reaping as we go (we are pid 1)."""
    sys.modules["_harness"].kill_uid_processes(uid, passes=50, between=_reap)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_one(req: dict, uid: int, base: str, n: int) -> dict:
    run_dir = os.path.join(base, f"run-{n}")
    os.mkdir(run_dir, 0o700)
    try:
        for name, text in req["files"].items():
            with open(os.path.join(run_dir, name), "w") as f:
                f.write(text)
        for name in os.listdir(run_dir):
            os.chown(os.path.join(run_dir, name), uid, uid)
        os.chown(run_dir, uid, uid)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        sys.stdout.flush()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            _child(req, run_dir, uid, (in_r, out_w, err_w))
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        lim = req["limits"]
        pipes = _Pipes(in_w, out_r, err_r, (req.get("stdin") or "").encode(), lim["output_bytes"])
        status, rc = _supervise(pid, pipes, t0 + lim["wall_s"])
        if rc is None:
            rc = _kill(pid)
        _sweep(uid)
        pipes.close()
        duration = time.perf_counter() - t0
        left_files = {}
        res = os.path.join(run_dir, "results.jsonl")
        if os.path.isfile(res) and os.path.getsize(res) < 8 * 1024 * 1024:
            with open(res, errors="replace") as f:
                left_files["results.jsonl"] = f.read()
        stdout, stderr = pipes.texts()
        return {"status": status, "returncode": rc, "stdout": stdout, "stderr": stderr, "duration_s": duration,
                "files": left_files}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _supervise(pid: int, pipes: "_Pipes", deadline: float) -> tuple[str | None, int | None]:
    """Feed stdin and collect output until the child exits, the wall clock runs out or the output
    passes its cap: ``(status, exit code)``, the code None when the child is still running."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return "timeout", None
        if pipes.pump(min(left, 0.05)):
            return "output_limit", None
        done, wstatus = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(wstatus)
            return ("output_limit" if pipes.drain() else None), rc


def _kill(pid: int) -> int:
    """Kill the child's process group and reap it; its exit code."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        _, wstatus = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(wstatus)
    except ChildProcessError:
        return -9


class _Pipes:
    """The child's stdin (written from ``pending``), stdout and stderr (read into buffers kept to
    ``cap + 1`` bytes, so passing the cap is seen), all non-blocking under one selector."""

    def __init__(self, in_w: int, out_r: int, err_r: int, pending: bytes, cap: int):
        self.in_w, self.out_r, self.err_r, self.cap = in_w, out_r, err_r, cap
        self.pending = memoryview(pending)
        self.bufs = {out_r: bytearray(), err_r: bytearray()}
        self.sel = selectors.DefaultSelector()
        for fd in self.bufs:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        os.set_blocking(in_w, False)
        if len(self.pending):
            self.sel.register(in_w, selectors.EVENT_WRITE)
        else:
            self._close_stdin(registered=False)

    def _close_stdin(self, registered: bool = True) -> None:
        if registered:
            self.sel.unregister(self.in_w)
        os.close(self.in_w)
        self.in_w = -1

    def _keep(self, fd: int, chunk: bytes) -> None:
        b = self.bufs[fd]
        if len(b) < self.cap + 1:
            b.extend(chunk[: self.cap + 1 - len(b)])

    def over(self) -> bool:
        return any(len(b) > self.cap for b in self.bufs.values())

    def pump(self, timeout: float) -> bool:
        """One round of the selector; True when the output passed its cap."""
        over = False
        for key, _ in self.sel.select(timeout=timeout):
            if key.fd == self.in_w:
                self._write_stdin()
                continue
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self.sel.unregister(key.fd)
                continue
            self._keep(key.fd, chunk)
            over = over or len(self.bufs[key.fd]) > self.cap
        return over

    def _write_stdin(self) -> None:
        try:
            self.pending = self.pending[os.write(self.in_w, self.pending[:65536]):]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the program closed its stdin
            self.pending = self.pending[:0]
        if not len(self.pending):
            self._close_stdin()

    def drain(self) -> bool:
        """Read what is left in the pipes after the child exited; True when the output passed its cap."""
        for fd in list(self.bufs):
            try:
                while True:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    self._keep(fd, chunk)
            except (BlockingIOError, OSError):
                pass
        return self.over()

    def close(self) -> None:
        self.sel.close()
        if self.in_w >= 0:
            os.close(self.in_w)
        for fd in self.bufs:
            os.close(fd)

    def texts(self) -> tuple[str, str]:
        return (self.bufs[self.out_r][: self.cap].decode("utf-8", "replace"),
                self.bufs[self.err_r][: self.cap].decode("utf-8", "replace"))


PRELOAD = ("io", "json", "traceback", "math", "re", "collections", "itertools", "functools", "typing", "heapq",
           "bisect", "string", "random", "statistics", "fractions", "decimal", "hashlib", "copy", "operator",
           "datetime", "dataclasses", "enum")


def serve(uid: int, harness_path: str, base: str) -> None:
    """``base``: an existing directory; a tmpfs private to this namespace is mounted over it."""
    import importlib
    import importlib.util

    spec = importlib.util.spec_from_file_location("_harness", harness_path)
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    sys.modules["_harness"] = harness
    for name in PRELOAD:  # children start with these imported (copy-on-write)
        importlib.import_module(name)
    _mount("tmpfs", base, "tmpfs", 0, "size=256m,mode=0711")
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    n = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        n += 1
        req = json.loads(line)
        try:
            reply = run_one(req, uid, base, n)
        except Exception as exc:  # report, stay alive
            reply = {"status": "error", "returncode": None, "stdout": "", "stderr": f"zygote: {exc}",
                     "duration_s": 0.0, "files": {}}
        reply["id"] = req.get("id")
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    if sys.argv[1] == "--walls":  # the fresh-process path: sh runs this, then the program, in one namespace
        try:
            build_walls(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None)
        except OSError as exc:
            sys.stderr.write(f"sandbox set-up failed: {exc}\n")
            sys.exit(70)
    else:
        serve(int(sys.argv[1]), sys.argv[2], sys.argv[3])

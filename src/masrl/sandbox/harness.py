"""Runs inside the sandbox's child process. Standard library only; copied into the work dir.

Usage: python -I _harness.py MODE   (or ``main(mode)`` in a process forked by the zygote)
  script  run program.py as __main__ with the real stdin/stdout
  stdio   run program.py once per case from cases.json, stdin/stdout redirected, in this process
  call    import program.py once, call the named function per case from cases.json
  assert  run program.py, then the test code and ``check(entry_point)`` from _tests.json

cases.json holds inputs only (never expected outputs: the program could read them); the parent
judges the outputs. _tests.json is read and deleted before the program starts; a passed assert
run is recorded with a nonce from it, so exiting early or writing a results file is no pass.

Per-case results go to results.jsonl (one line per finished case), so the parent still knows
which cases finished if this process is killed. Exit codes: 0 done, 75 memory error,
76 compile error, 77 the program itself failed at import (call mode).
"""

import os
import resource  # tiny; and apply_limits runs between fork and exec, where importing is unsafe
import sys

# Only these at start-up: every import here is paid by every sandboxed run. The rest are
# imported where a mode needs them.

ROOT = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
SAFE_WRITE = ("/dev/null",)
CODE_MEMORY, CODE_COMPILE, CODE_IMPORT = 75, 76, 77


def _inside(path):
    try:
        p = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else "")
    except Exception:
        return False
    return p == ROOT or p.startswith(ROOT + os.sep) or p in SAFE_WRITE


def _audit(event, args):
    # Defence in depth; the namespaces and rlimits set up by the parent are the real walls.
    if event == "socket.__new__" or event.startswith("socket.") and event not in ("socket.gethostname",):
        raise PermissionError("network access is disabled in the sandbox")
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS)
        if writing and path is not None and not isinstance(path, int) and not _inside(path):
            raise PermissionError(f"writing outside the sandbox directory is not allowed: {path}")
    elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.chmod", "os.chown", "os.symlink", "os.link",
                   "os.truncate", "shutil.rmtree", "os.utime"):
        paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
        if any(not _inside(p) for p in paths):
            raise PermissionError(f"{event} outside the sandbox directory is not allowed")


def apply_limits(cpu_s, memory_mb, file_size_mb, max_open_files, max_procs):
    """Resource limits for a sandboxed process (shared by sandbox.py and zygote.py)."""
    cpu = max(1, int(cpu_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = file_size_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))


def kill_uid_processes(uid, passes=20, between=None):
    """SIGKILL every process of ``uid`` visible in /proc, pass after pass until none is left."""
    import signal
    import time

    for _ in range(passes):
        found = False
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.stat(f"/proc/{pid}").st_uid == uid:
                        found = True
                        os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        if between is not None:
            between()
        if not found:
            return
        time.sleep(0.005)


class OutputLimit(Exception):
    pass


def capped_io(cap):
    import io

    class CappedIO(io.StringIO):
        def write(self, s):
            if self.tell() + len(s) > cap:
                raise OutputLimit()
            return super().write(s)

    return CappedIO()


class CaseTimeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise CaseTimeout()


def _record(out, rec):
    import json

    out.write(json.dumps(rec) + "\n")
    out.flush()


def _error_text(exc, limit=2000):
    import traceback

    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text[:limit]


def _jsonable(v):
    import json

    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        if isinstance(v, (tuple, set, frozenset)):
            return [_jsonable(x) for x in v]
        if isinstance(v, dict):
            return {str(k): _jsonable(x) for k, x in v.items()}
        return {"__repr__": repr(v)}


def _run_asserts(code, tests):
    nonce = tests.pop("nonce")
    results = open("results.jsonl", "w")
    glb = {"__name__": "__main__", "__file__": "program.py"}
    sys.argv = ["program.py"]
    try:
        exec(code, glb)
    except MemoryError:
        return CODE_MEMORY
    except SystemExit:
        _record(results, {"i": 0, "status": "error", "message": "the program exited before the tests ran"})
        return 1
    except BaseException as exc:
        sys.stderr.write(_error_text(exc))
        _record(results, {"i": 0, "status": "error", "message": _error_text(exc)})
        return 1
    try:
        exec(compile(tests["test"], "tests.py", "exec"), glb)
        glb["check"](glb[tests["entry_point"]])
    except MemoryError:
        return CODE_MEMORY
    except AssertionError as exc:
        _record(results, {"i": 0, "status": "failed", "message": _error_text(exc)})
        return 1
    except SystemExit:
        _record(results, {"i": 0, "status": "error", "message": "the program exited while the tests ran"})
        return 1
    except BaseException as exc:
        _record(results, {"i": 0, "status": "error", "message": _error_text(exc)})
        return 1
    _record(results, {"i": 0, "status": "passed", "nonce": nonce})
    return 0


def main(mode=None):
    global ROOT
    ROOT = os.path.realpath(os.getcwd())
    mode = mode or sys.argv[1]
    source = open("program.py").read()
    tests = None
    if mode == "assert":
        import json

        with open("_tests.json") as f:
            tests = json.load(f)
        os.remove("_tests.json")
    try:
        code = compile(source, "program.py", "exec")
    except (SyntaxError, ValueError) as exc:
        sys.stderr.write(_error_text(exc))
        return CODE_COMPILE
    sys.addaudithook(_audit)
    if mode == "assert":
        return _run_asserts(code, tests)
    if mode == "script":
        return _run_script(code)
    return _run_cases(code, mode)


def _run_script(code) -> int:
    sys.argv = ["program.py"]
    try:
        exec(code, {"__name__": "__main__", "__file__": "program.py"})
    except MemoryError:
        return CODE_MEMORY
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _run_cases(code, mode: str) -> int:
    """stdio or call mode: every case of cases.json under its own timer, one record per case."""
    import json
    import signal

    spec = json.load(open("cases.json"))
    signal.signal(signal.SIGALRM, _on_alarm)
    results = open("results.jsonl", "w")
    fn = None
    if mode == "call":
        fn = _load_function(code, spec)
        if isinstance(fn, int):
            return fn
    for i, case in enumerate(spec["cases"]):
        _record(results, _run_case(code, mode, fn, case, i, spec["output_cap"], spec["case_timeout_s"]))
    return 0


def _load_function(code, spec):
    """Run the program as a module (under the case timer) and return its function, or an exit code."""
    import signal

    real_stdout = sys.stdout
    glb = {"__name__": "program"}
    try:
        sys.stdout = capped_io(spec["output_cap"])
        signal.setitimer(signal.ITIMER_REAL, spec["case_timeout_s"])
        exec(code, glb)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except MemoryError:
        return CODE_MEMORY
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout = real_stdout
        sys.stderr.write("TLE at import" if isinstance(exc, CaseTimeout) else _error_text(exc))
        return CODE_IMPORT
    finally:
        sys.stdout = real_stdout
    fn = glb.get(spec["fn_name"])
    if not callable(fn):
        sys.stderr.write(f"the program defines no function named {spec['fn_name']!r}")
        return CODE_IMPORT
    return fn


def _run_case(code, mode: str, fn, case: dict, i: int, cap: int, per_case: float) -> dict:
    import io
    import signal
    import time

    real_stdin, real_stdout = sys.stdin, sys.stdout
    t0 = time.perf_counter()
    buf = capped_io(cap)
    rec = {"i": i}
    try:
        sys.stdout = buf
        signal.setitimer(signal.ITIMER_REAL, per_case)
        if mode == "stdio":
            sys.stdin = io.StringIO(case.get("input", ""))
            try:
                exec(code, {"__name__": "__main__", "__file__": "program.py"})
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise RuntimeError(f"exit status {exc.code}") from None
            rec.update(status="done", output=buf.getvalue())
        else:
            value = fn(*case.get("args", []), **case.get("kwargs", {}))
            rec.update(status="done", value=_jsonable(value))
    except CaseTimeout:
        rec.update(status="timeout")
    except OutputLimit:
        rec.update(status="output_limit")
    except MemoryError:
        rec.update(status="memory")
    except BaseException as exc:
        rec.update(status="error", message=_error_text(exc))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout, sys.stdin = real_stdout, real_stdin
    rec["time_s"] = time.perf_counter() - t0
    return rec


if __name__ == "__main__":
    sys.exit(main())

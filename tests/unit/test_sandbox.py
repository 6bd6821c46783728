"""Every bad program, run for real in the real sandbox."""

import asyncio
import os
import time
from pathlib import Path

import pytest

from masrl.sandbox import Limits, Sandbox, isolation, run_python, slot_uid

FAST = Limits(cpu_s=2, wall_s=4, memory_mb=256, output_bytes=10_000, max_procs=16)
NS = isolation() == "namespaces"


def test_ok_program_reads_stdin():
    r = run_python("import sys\nprint(sys.stdin.read().strip()[::-1])", stdin="abc\n", limits=FAST)
    assert r.status == "ok" and r.stdout == "cba\n" and r.returncode == 0


def test_compile_error():
    r = run_python("def f(:\n  pass", limits=FAST)
    assert r.status == "compile_error" and "SyntaxError" in r.stderr


def test_runtime_error():
    r = run_python("raise ValueError('boom')", limits=FAST)
    assert r.status == "runtime_error" and "ValueError: boom" in r.stderr


def test_infinite_loop_times_out():
    t0 = time.time()
    r = run_python("while True:\n    pass", limits=FAST)
    assert r.status == "timeout"
    assert time.time() - t0 < FAST.wall_s + 30  # stopped, not run on (a busy machine only starts it later)


def test_sleeping_forever_hits_the_wall_clock():
    t0 = time.time()
    r = run_python("import time\ntime.sleep(100)", limits=Limits(wall_s=1.0, cpu_s=5))
    assert r.status == "timeout" and time.time() - t0 < 40  # its 1 s wall clock, not the 100 s it asked for


def test_unbounded_allocation_is_a_memory_error():
    r = run_python("x = []\nwhile True:\n    x.append(bytearray(10**7))", limits=FAST)
    assert r.status == "memory"


def test_huge_output_is_cut_off():
    r = run_python("while True:\n    print('x' * 1000)", limits=FAST)
    assert r.status == "output_limit"
    assert len(r.stdout) <= FAST.output_bytes


def test_huge_file_hits_the_file_size_limit(tmp_path):
    r = run_python("open('big', 'w').write('x' * 50_000_000)", limits=Limits(file_size_mb=1, wall_s=5))
    assert r.status in ("output_limit", "runtime_error")
    assert r.status != "ok"


def test_fork_bomb_is_contained():
    t0 = time.time()
    r = run_python("import os\nwhile True:\n    os.fork()", limits=FAST)
    assert r.status != "ok"
    assert time.time() - t0 < FAST.wall_s + 3
    time.sleep(0.2)
    if NS:  # nothing of the sandbox's uid survives
        left = [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) == slot_uid(0)]
        assert left == []


def _uid(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_socket_is_refused():
    r = run_python("import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=2)\nprint('connected')",
                   limits=FAST)
    assert r.status == "runtime_error" and "connected" not in r.stdout


RAW_CONNECT = """
import ctypes, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(2, 1, 0)
addr = struct.pack("<H", 2) + struct.pack(">H", {port}) + socket.inet_aton("127.0.0.1") + bytes(8)
rc = libc.connect(fd, addr, 16)
print(rc, ctypes.get_errno())
"""


@pytest.mark.skipif(isolation() == "rlimits-only", reason="needs a network namespace")
def test_no_network_even_when_the_audit_hook_is_bypassed():
    import socket
    import subprocess
    import sys

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    code = RAW_CONNECT.format(port=listener.getsockname()[1])
    try:
        # the same raw connect (libc via ctypes, invisible to audit hooks) works on the host...
        host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert host.stdout.split()[0] == "0"
        # ...and fails inside the sandbox: its loopback is another, downed interface
        r = run_python(code, limits=FAST)
        assert r.status == "ok", r.stderr
        rc, errno = map(int, r.stdout.split())
        assert rc == -1 and errno != 0
    finally:
        listener.close()


def test_environment_is_not_inherited(monkeypatch):
    monkeypatch.setenv("MASRL_TEST_SECRET", "hunter2")
    r = run_python("import os\nprint(sorted(os.environ))\nprint(os.environ.get('MASRL_TEST_SECRET'))", limits=FAST)
    assert r.status == "ok"
    assert "hunter2" not in r.stdout and "MASRL_TEST_SECRET" not in r.stdout


def test_writes_outside_the_directory_do_not_land(tmp_path):
    victim = tmp_path / "victim.txt"
    tmp_target = Path("/tmp") / f"masrl-escape-{os.getpid()}.txt"
    code = (f"open({str(victim)!r}, 'w').write('pwned')\n")
    r = run_python(code, limits=FAST)
    assert r.status == "runtime_error" and not victim.exists()
    r = run_python(f"open({str(tmp_target)!r}, 'w').write('pwned')", limits=FAST)
    assert r.status == "runtime_error" and not tmp_target.exists()
    r = run_python("open('../escape.txt', 'w').write('pwned')\n", limits=FAST)
    assert r.status == "runtime_error"
    # writing inside its own directory is fine
    r = run_python("open('ok.txt', 'w').write('fine')\nprint(open('ok.txt').read())", limits=FAST)
    assert r.status == "ok" and r.stdout == "fine\n"


RAW_WRITE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for path in {paths!r}:
    fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT, 0o644)
    print(path, fd, ctypes.get_errno())
"""


@pytest.mark.skipif(not NS, reason="needs mount namespaces and a separate uid (root + unshare)")
def test_raw_writes_do_not_reach_the_host(tmp_path):
    tmp_target = f"/tmp/masrl-escape2-{os.getpid()}.txt"
    victim = str(tmp_path / "victim.txt")
    r = run_python(RAW_WRITE.format(paths=[tmp_target, victim]), limits=FAST)
    assert r.status == "ok", r.stderr
    lines = dict((ln.split()[0], int(ln.split()[1])) for ln in r.stdout.splitlines())
    assert lines[tmp_target] >= 0  # it wrote, but to the sandbox's private /tmp
    assert lines[victim] == -1  # permission denied for the sandbox's uid
    assert not Path(tmp_target).exists() and not Path(victim).exists()


def test_pool_bounds_concurrency_and_returns_each_result():
    sb = Sandbox(max_workers=2, limits=FAST)

    async def main():
        t0 = time.perf_counter()
        res = await asyncio.gather(*(sb.run(f"import time\ntime.sleep(0.3)\nprint({i})") for i in range(6)))
        return res, time.perf_counter() - t0

    res, elapsed = asyncio.run(main())
    assert [r.stdout.strip() for r in res] == [str(i) for i in range(6)]
    assert elapsed >= 0.9  # 6 runs of 0.3 s, two at a time


def test_the_calling_process_is_unharmed():
    before = (os.getcwd(), dict(os.environ), len(os.listdir("/proc")))
    for code in ("import os\nos.chdir('/')\nos.environ['X']='1'", "import sys\nsys.exit(3)",
                 "import os\nos.kill(os.getppid(), 9)"):
        r = run_python(code, limits=FAST)
        assert r.status in ("ok", "runtime_error")
    assert os.getcwd() == before[0] and dict(os.environ) == before[1]


PROGRAMS = {
    "ok": ("print(sum(range(10)))", "ok"),
    "compile": ("def (", "compile_error"),
    "loop": ("while True:\n    pass", "timeout"),
    "memory": ("x = bytearray(10**10)", "memory"),
    "output": ("while True:\n    print('z' * 1000)", "output_limit"),
    "raise": ("raise SystemExit(4)", "runtime_error"),
}


@pytest.mark.skipif(not NS, reason="the zygote is used in namespaces mode only")
@pytest.mark.parametrize("backend", ["zygote", "fresh-process"])
def test_both_backends_give_the_same_verdicts(backend, monkeypatch):
    monkeypatch.setenv("MASRL_SANDBOX_ZYGOTE", "1" if backend == "zygote" else "0")
    for name, (code, status) in PROGRAMS.items():
        assert run_python(code, limits=FAST).status == status, name


@pytest.mark.skipif(not NS, reason="needs namespaces")
def test_nothing_carries_over_from_one_run_to_the_next():
    leave = ("import ctypes, os, subprocess, sys\n"
             "libc = ctypes.CDLL(None)\n"
             "libc.open(b'/tmp/leak', os.O_WRONLY | os.O_CREAT, 0o644)\n"
             "open('here.txt', 'w').write('x')\n"
             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
             "print('left')")
    look = ("import os\n"
            "mine = [p for p in os.listdir('/proc') if p.isdigit() and os.stat('/proc/' + p).st_uid == os.getuid()]\n"
            "print(os.path.exists('/tmp/leak'), os.path.exists('here.txt'), len(mine))")
    assert run_python(leave, limits=FAST).stdout.strip() == "left"
    r = run_python(look, limits=FAST)
    assert r.stdout.split() == ["False", "False", "1"]  # only the looking process itself


@pytest.mark.parametrize("backend", ["zygote", "fresh-process"])
def test_works_when_the_cache_dir_is_under_tmp(backend, monkeypatch, tmp_path):
    from masrl.sandbox.zygote_client import shutdown_zygotes

    monkeypatch.setenv("MASRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MASRL_SANDBOX_ZYGOTE", "1" if backend == "zygote" else "0")
    shutdown_zygotes()
    try:
        r = run_python("print(6 * 7)", limits=FAST)
        assert r.status == "ok" and r.stdout == "42\n", r.stderr
    finally:
        shutdown_zygotes()

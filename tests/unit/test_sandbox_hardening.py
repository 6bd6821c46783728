"""Holes found when the sandbox was attacked from outside; each test failed before its fix.

Model-written code is trained on, so every hole here is a reward hack or a host leak.
"""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from masrl.data.test_spec import parse_spec
from masrl.sandbox import Limits, SandboxUnavailable, cgroups, check_isolation, isolation, run_python
from masrl.tools.code_tests import verify

FAST = Limits(cpu_s=2, wall_s=6, memory_mb=256, output_bytes=10_000, max_procs=16)
NS = isolation() == "namespaces"
BACKENDS = ["zygote", "fresh-process"] if NS else ["fresh-process"]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("MASRL_SANDBOX_ZYGOTE", "1" if request.param == "zygote" else "0")
    return request.param


COPY_ANSWERS = """
import json, os
for name in ("cases.json", "/tmp/work/cases.json"):
    if os.path.exists(name):
        spec = json.load(open(name))
        break
else:
    spec = {"cases": []}
EXPECTED = [c.get("output", c.get("expected")) for c in spec["cases"]]
"""


def test_a_program_cannot_copy_expected_stdio_outputs(backend):
    spec = parse_spec({"kind": "stdio", "cases": [{"input": "1\n", "output": "7919\n"}, {"input": "2\n", "output": "104729\n"}]})
    cheat = COPY_ANSWERS + "import sys\nn = int(sys.stdin.read())\nprint(EXPECTED[n - 1] or '', end='')\n"
    report = verify(cheat, spec, FAST)
    assert report.pass_rate == 0.0, report.first_failure


def test_a_program_cannot_copy_expected_call_values(backend):
    spec = parse_spec({"kind": "call", "fn_name": "f",
                       "cases": [{"args": [1], "expected": 7919}, {"args": [2], "expected": 104729}]})
    cheat = COPY_ANSWERS + "def f(n):\n    return EXPECTED[n - 1]\n"
    assert verify(cheat, spec, FAST).pass_rate == 0.0
    honest = "def f(n):\n    return [7919, 104729][n - 1]\n"
    assert verify(honest, spec, FAST).all_passed  # the cases themselves still reach the program


@pytest.mark.parametrize("escape", ["import sys\nsys.exit(0)", "raise SystemExit", "import os\nos._exit(0)"])
def test_leaving_before_the_asserts_run_does_not_pass(backend, escape):
    spec = parse_spec({"kind": "assert", "entry_point": "add",
                       "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"})
    report = verify("def add(a, b):\n    return 0\n" + escape + "\n", spec, FAST)
    assert not report.all_passed and report.pass_rate == 0.0
    assert verify("def add(a, b):\n    return a + b\n", spec, FAST).all_passed


SHM_CREATE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
sid = libc.shmget(0x6d61, 32 << 20, 0o1000 | 0o666)
assert sid >= 0, ctypes.get_errno()
addr = libc.shmat(sid, None, 0)
ctypes.memmove(addr, b"secret", 6)
print(sid)
"""
SHM_READ = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0x6d61, 0, 0))
"""


def _host_shm_ids() -> set[str]:
    try:
        lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {ln.split()[1] for ln in lines if ln.split()}


@pytest.mark.skipif(not NS, reason="needs an IPC namespace (root + unshare)")
def test_shared_memory_does_not_outlive_a_run(backend):
    before = _host_shm_ids()
    r = run_python(SHM_CREATE, limits=FAST)
    assert r.status == "ok", r.stderr
    assert _host_shm_ids() == before  # the 32 MiB segment is not on the host
    r = run_python(SHM_READ, limits=FAST)
    assert r.stdout.strip() == "-1"  # and the next program in the slot does not find it


def _world_writable_dirs() -> list[str]:
    """Every world-writable directory of the host outside /proc and /sys (bounded walk)."""
    found = []
    for root, dirs, _ in os.walk("/", topdown=True):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/work", "/root")]
        try:
            st = os.stat(root)
        except OSError:
            continue
        if st.st_mode & 0o002 and os.path.isdir(root) and not os.path.islink(root):
            found.append(root)
        if len(found) > 200:
            break
    return found


@pytest.mark.skipif(not NS, reason="needs mount namespaces and a separate uid (root + unshare)")
def test_no_world_writable_host_directory_keeps_a_file(backend):
    dirs = _world_writable_dirs()
    assert "/tmp" in dirs  # the walk sees what it should
    name = f"masrl-left-{os.getpid()}-{backend}"
    code = textwrap.dedent(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        for d in {dirs!r}:
            libc.open(os.path.join(d, {name!r}).encode(), os.O_WRONLY | os.O_CREAT, 0o644)
            os.system("touch " + os.path.join(d, {name!r} + "-sh") + " 2>/dev/null")
        print("tried", len({dirs!r}))
    """)
    r = run_python(code, limits=FAST)
    assert r.status == "ok", r.stderr
    left = [d for d in dirs if os.path.exists(os.path.join(d, name)) or os.path.exists(os.path.join(d, name + "-sh"))]
    for d in left:
        for suffix in ("", "-sh"):
            Path(d, name + suffix).unlink(missing_ok=True)
    assert left == [], f"files stayed on the host in {left}"


MEMORY_HOG = """
import os, time
pids = []
for k in range(3):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            b = bytearray(300 << 20)
            for i in range(0, len(b), 4096):
                b[i] = 1
            time.sleep(1.5)
            code = 0
        finally:
            os._exit(code)
    pids.append(pid)
# held: children that kept their 300 MB through the sleep and exited normally (an OOM kill is a signal)
print(sum(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) == 0 for p in pids))
"""


@pytest.mark.skipif(not NS, reason="memory per run needs a cgroup (root)")
def test_memory_limit_covers_the_whole_run(backend):
    r = run_python(MEMORY_HOG, limits=Limits(cpu_s=5, wall_s=10, memory_mb=512, max_procs=16))
    held = int(r.stdout.strip() or 0)
    assert held * 300 <= 512, f"{held} processes held 300 MB each under a 512 MB limit ({cgroups.describe()})"


def test_memory_bound_is_described():
    text = cgroups.describe()
    assert "cgroup" in text or "per process" in text


SLEEPER = textwrap.dedent("""
    import sys
    from masrl.sandbox import Limits, run_python
    r = run_python("import time\\ntime.sleep(2.5)\\nprint('alive')", limits=Limits(wall_s=8, cpu_s=4), slot=0)
    print(r.status, r.stdout.strip())
""")


@pytest.mark.skipif(isolation() not in ("namespaces", "uid"), reason="slot uids exist only when running as root")
def test_two_processes_never_share_a_slot_uid(backend):
    other = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "MASRL_SANDBOX_ZYGOTE": os.environ.get("MASRL_SANDBOX_ZYGOTE", "1")})
    time.sleep(1.0)
    for _ in range(5):  # this process's runs in slot 0 sweep their uid after each run
        assert run_python("print(1)", limits=FAST, slot=0).status == "ok"
    out, _ = other.communicate(timeout=30)
    assert out.split() == ["ok", "alive"], out


def test_a_segfault_is_a_runtime_error_with_the_signal(backend):
    r = run_python("import ctypes\nctypes.string_at(0)", limits=FAST)
    assert r.status == "runtime_error"
    assert "SIGSEGV" in r.detail


def test_weak_isolation_warns_and_can_be_refused(monkeypatch, caplog):
    import masrl.sandbox.runner as sb

    monkeypatch.setattr(sb, "isolation", lambda: "rlimits-only")
    with pytest.warns(UserWarning, match="rlimits-only"):
        check_isolation("any")
    with pytest.raises(SandboxUnavailable, match="sandbox.require"):
        check_isolation("namespaces")
    monkeypatch.setattr(sb, "isolation", lambda: "namespaces")
    check_isolation("namespaces")  # fine, silent


def test_without_a_cgroup_memory_is_shared_out_among_few_processes(monkeypatch):
    monkeypatch.setattr(cgroups, "mode", lambda: "share")
    lim = cgroups.process_limits(Limits(memory_mb=512, max_procs=32))
    assert (lim.max_procs, lim.memory_mb) == (4, 128)  # 4 processes x 128 MB <= 512 MB
    lim = cgroups.process_limits(Limits(memory_mb=100, max_procs=32))
    assert (lim.max_procs, lim.memory_mb) == (1, 100)
    monkeypatch.setattr(cgroups, "mode", lambda: "cgroup1")
    assert cgroups.process_limits(Limits(memory_mb=512, max_procs=32)).max_procs == 32

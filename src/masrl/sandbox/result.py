"""What a sandboxed run is given (Limits) and what comes back (RunResult), and exit-code mapping."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

CODE_MEMORY, CODE_COMPILE, CODE_IMPORT = 75, 76, 77  # the harness's exit codes


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
    detail: str = ""  # what the sandbox saw: the signal that killed the program, an OOM kill


def signal_detail(rc: int | None, via_shell: bool = False) -> str:
    """'killed by signal SIGSEGV' for a return code that means a signal (sh reports 128 + n)."""
    if rc is None:
        return ""
    n = -rc if rc < 0 else (rc - 128 if via_shell and 128 < rc < 160 else 0)
    if not n:
        return ""
    try:
        return f"killed by signal {signal.Signals(n).name}"
    except ValueError:
        return f"killed by signal {n}"


def status_from_exit(rc: int, over: bool) -> str:
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
    return "runtime_error"  # a segfault included: the signal's name goes in RunResult.detail



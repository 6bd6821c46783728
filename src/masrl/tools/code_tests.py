"""The verifier that runs a program against its task's test spec (``data.test_spec``) in the sandbox.

stdio and call cases of one program run in one process (the harness re-runs the program per
case with a per-case timer), so a step does not pay a process start per case. Verdicts per case:
OK, WA (wrong answer), TLE, RE (runtime error), MLE, CE (compile error), OLE (output limit).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from masrl.data.checkers import CHECKERS
from masrl.data.test_spec import TestSpec
from masrl.sandbox import Limits, RunResult, Sandbox, run_python

OK, WA, TLE, RE, MLE, CE, OLE = "OK", "WA", "TLE", "RE", "MLE", "CE", "OLE"
_FROM_STATUS = {"timeout": TLE, "memory": MLE, "output_limit": OLE, "compile_error": CE, "runtime_error": RE}


@dataclass
class CaseVerdict:
    verdict: str
    message: str = ""
    time_s: float = 0.0


@dataclass
class TestReport:
    pass_rate: float
    all_passed: bool
    cases: list[CaseVerdict] = field(default_factory=list)
    first_failure: str | None = None
    duration_s: float = 0.0

    @property
    def verdicts(self) -> list[str]:
        return [c.verdict for c in self.cases]


def _normalise(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_normalise(x) for x in v]
    if isinstance(v, list):
        return [_normalise(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _normalise(x) for k, x in v.items()}
    return v


def _values_equal(got: Any, expected: Any) -> bool:
    got, expected = _normalise(got), _normalise(expected)
    if isinstance(got, float) or isinstance(expected, float):
        try:
            return abs(float(got) - float(expected)) <= 1e-6 * max(1.0, abs(float(expected)))
        except (TypeError, ValueError):
            return False
    return got == expected


def _truncate(s: str, n: int = 300) -> str:
    return s if len(s) <= n else s[:n] + "..."


INPUT_KEYS = ("input", "args", "kwargs")  # what of a case the program may see


@dataclass(frozen=True)
class Plan:
    """One verification run: what goes into the sandbox, and the nonce a passed assert run echoes."""

    program: str
    mode: str
    files: dict[str, str]
    nonce: str = ""


def plan(code: str, spec: TestSpec, limits: Limits) -> Plan:
    """The run for ``code`` against ``spec``. Expected outputs never enter the sandbox."""
    if spec.kind == "assert":
        nonce = secrets.token_hex(16)
        tests = {"test": spec.test, "entry_point": spec.entry_point, "nonce": nonce}
        return Plan(code, "assert", {"_tests.json": json.dumps(tests)}, nonce)
    inputs = [{k: c[k] for k in INPUT_KEYS if k in c} for c in spec.cases]
    cases = {"cases": inputs, "output_cap": limits.output_bytes, "case_timeout_s": limits.case_timeout_s,
             "fn_name": spec.fn_name}
    return Plan(code, spec.kind, {"cases.json": json.dumps(cases)})


def _records(run: RunResult) -> dict[int, dict]:
    done: dict[int, dict] = {}
    for line in run.files.get("results.jsonl", "").splitlines():
        try:
            rec = json.loads(line)
            done[rec["i"]] = rec
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return done


def judge(spec: TestSpec, run: RunResult, nonce: str = "") -> TestReport:
    """Turn a sandbox run into per-case verdicts."""
    if spec.kind == "assert":
        return _report([_assert_verdict(run, nonce)], run.duration_s)
    n = len(spec.cases)
    if run.status == "compile_error":
        return _report([CaseVerdict(CE, _truncate(run.stderr))] * n, run.duration_s)
    if run.returncode == 77:  # the program failed at import (call mode)
        v = TLE if "TLE" in run.stderr else RE
        return _report([CaseVerdict(v, _truncate(run.stderr))] * n, run.duration_s)
    done = _records(run)
    return _report([_case_verdict(spec, case, done.get(i), run) for i, case in enumerate(spec.cases)], run.duration_s)


def _assert_verdict(run: RunResult, nonce: str) -> CaseVerdict:
    """An assert-based run passes only when the harness recorded the tests finishing with ``nonce``."""
    rec = _records(run).get(0, {})
    if rec.get("status") == "passed" and nonce and rec.get("nonce") == nonce and run.status == "ok":
        return CaseVerdict(OK, time_s=run.duration_s)
    if rec.get("status") == "failed":
        return CaseVerdict(WA, _truncate(rec.get("message") or "assertion failed"), run.duration_s)
    if rec.get("status") == "error":
        return CaseVerdict(RE, _truncate(rec.get("message", "")), run.duration_s)
    v = _FROM_STATUS.get(run.status, RE)
    why = run.detail or (run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "")
    return CaseVerdict(v, _truncate(why or "the program ended before the tests finished"), run.duration_s)


_LIMIT_VERDICTS = {"timeout": (TLE, "time limit"), "memory": (MLE, "memory limit"), "output_limit": (OLE, "output limit")}


def _case_verdict(spec: TestSpec, case: dict, rec: dict | None, run: RunResult) -> CaseVerdict:
    """One stdio or call case, from the harness's record of it (None: the process died first)."""
    if rec is None:
        v = _FROM_STATUS.get(run.status, RE)
        return CaseVerdict(TLE if v == "OK" else v, f"process ended: {run.status}")
    st, t = rec["status"], rec.get("time_s", 0.0)
    if st in _LIMIT_VERDICTS:
        return CaseVerdict(*_LIMIT_VERDICTS[st], t)
    if st == "error":
        return CaseVerdict(RE, _truncate(rec.get("message", "")), t)
    if spec.kind == "stdio":
        ok = CHECKERS[spec.checker](rec.get("output", ""), case["output"])
        msg = "" if ok else _truncate(f"input {case.get('input', '')!r}: expected {case['output']!r}, "
                                      f"got {rec.get('output', '')!r}")
        return CaseVerdict(OK if ok else WA, msg, t)
    ok = _values_equal(rec.get("value"), case["expected"])
    msg = "" if ok else _truncate(f"{spec.fn_name}(*{case.get('args', [])!r}): expected {case['expected']!r}, "
                                  f"got {rec.get('value')!r}")
    return CaseVerdict(OK if ok else WA, msg, t)


def _report(cases: list[CaseVerdict], duration: float) -> TestReport:
    passed = sum(c.verdict == OK for c in cases)
    first = next((f"{c.verdict}: {c.message}".strip() for c in cases if c.verdict != OK), None)
    return TestReport(passed / len(cases) if cases else 0.0, passed == len(cases) and bool(cases), cases, first, duration)


def verify(code: str, spec: TestSpec, limits: Limits = Limits()) -> TestReport:
    """Run ``code`` against ``spec`` in the sandbox (blocking)."""
    p = plan(code, spec, limits)
    t0 = time.perf_counter()
    report = judge(spec, run_python(p.program, mode=p.mode, limits=limits, files=p.files), p.nonce)
    report.duration_s = time.perf_counter() - t0
    return report


class CodeVerifier:
    """Async verification with a bounded pool, for many concurrent workflows."""

    def __init__(self, max_workers: int | None = None, limits: Limits = Limits()):
        self.sandbox = Sandbox(max_workers, limits)
        self.limits = limits

    async def verify(self, code: str, spec: TestSpec, limits: Limits | None = None) -> TestReport:
        lim = limits or self.limits
        p = plan(code, spec, lim)
        t0 = time.perf_counter()
        run = await self.sandbox.run(p.program, mode=p.mode, limits=lim, files=p.files)
        report = judge(spec, run, p.nonce)
        report.duration_s = time.perf_counter() - t0
        return report


def summarize_report(report) -> dict:
    """The JSON-able result of the ``run_tests`` tool."""
    return {"pass_rate": report.pass_rate, "all_passed": report.all_passed,
            "cases": [[c.verdict, c.message] for c in report.cases], "first_failure": report.first_failure}


def code_tools(services) -> dict:
    """The ``run_tests`` tool on the run's code verifier, set up now: a sandbox below
    ``sandbox.require`` stops the run before it starts."""
    from masrl.tools.base import Tool, ToolUseError

    verifier = services.code_verifier()

    async def run_tests(code: str, tests: TestSpec) -> dict:
        """Run a program against test cases in the sandbox; returns the pass rate and each case's verdict."""
        if not code.strip():
            raise ToolUseError("no code to run")
        return summarize_report(await verifier.verify(code, tests))

    return {"run_tests": Tool.from_function(run_tests, timeout_s=services.tool_timeout_s)}

"""A code task's test spec: what a JSONL row's tests hold, validated into a ``TestSpec``.

Three formats, as plain dicts:

  {"kind": "stdio",  "cases": [{"input": "1 2\\n", "output": "3\\n"}, ...], "checker": "lines"}
  {"kind": "call",   "fn_name": "add", "cases": [{"args": [1, 2], "expected": 3}, ...]}
  {"kind": "assert", "test": "def check(candidate): assert candidate(1, 2) == 3", "entry_point": "add"}

``tools.code_tests`` runs a program against one in the sandbox.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from masrl.data.checkers import CHECKERS
from masrl.errors import DataError


@dataclass(frozen=True)
class TestSpec:
    kind: str  # stdio | call | assert
    cases: tuple = ()
    checker: str = "lines"
    fn_name: str | None = None
    test: str | None = None
    entry_point: str | None = None



def parse_spec(raw: Any, *, where: str = "tests") -> TestSpec:
    """Validate a test spec (dict or JSON string); errors name ``where`` and the field."""
    raw = _spec_object(raw, where)
    kind = raw.get("kind")
    if kind not in ("stdio", "call", "assert"):
        raise DataError(f"{where}.kind: must be 'stdio', 'call' or 'assert', got {kind!r}")
    if kind == "assert":
        test, entry = raw.get("test"), raw.get("entry_point")
        if not isinstance(test, str) or not test.strip():
            raise DataError(f"{where}.test: an assert spec needs test code defining check(candidate)")
        if not isinstance(entry, str) or not entry:
            raise DataError(f"{where}.entry_point: an assert spec needs the function name to check")
        return TestSpec("assert", test=test, entry_point=entry)
    cases = raw.get("cases")
    if not isinstance(cases, list) or not cases:
        raise DataError(f"{where}.cases: must be a non-empty list")
    checker = raw.get("checker", "lines")
    if checker not in CHECKERS:
        raise DataError(f"{where}.checker: unknown checker {checker!r}; use one of {', '.join(CHECKERS)}")
    for i, c in enumerate(cases):
        _check_case(c, kind, f"{where}.cases[{i}]")
    fn = raw.get("fn_name")
    if kind == "call" and (not isinstance(fn, str) or not fn):
        raise DataError(f"{where}.fn_name: a call spec needs the function name")
    return TestSpec(kind, tuple(cases), checker, fn)


def _spec_object(raw: Any, where: str) -> dict:
    """A spec as a dict: JSON text parsed; a bare list of cases is stdio when they have outputs,
    else call."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
    if isinstance(raw, list):
        kind = "stdio" if raw and isinstance(raw[0], dict) and "output" in raw[0] else "call"
        raw = {"kind": kind, "cases": raw}
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected an object with 'kind', got {type(raw).__name__}")
    return raw


def _check_case(c: Any, kind: str, where: str) -> None:
    if not isinstance(c, dict):
        raise DataError(f"{where}: must be an object")
    if kind == "stdio" and not isinstance(c.get("output"), str):
        raise DataError(f"{where}.output: a stdio case needs the expected output as a string")
    if kind == "stdio" and not isinstance(c.get("input", ""), str):
        raise DataError(f"{where}.input: must be a string")
    if kind == "call" and "expected" not in c:
        raise DataError(f"{where}.expected: a call case needs the expected return value")
    if kind == "call" and not isinstance(c.get("args", []), list):
        raise DataError(f"{where}.args: must be a list of positional arguments")

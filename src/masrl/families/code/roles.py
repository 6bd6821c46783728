"""The code roles' prompts and parsers, test feedback and the ``run_tests`` tool, shared by the code
team, the single coder and YAML graphs."""

from __future__ import annotations

import ast

from masrl.data.tasks import Task
from masrl.data.test_spec import TestSpec
from masrl.families.code.extract import extract_code
from masrl.parsing import ParseResult, TagSpec, nonempty, parse_tags

PLANNER_SYSTEM = "You plan how to write a small Python function. Reply with one sentence in <plan></plan>."
PLANNER_EXAMPLES = [
    ("Write a Python function `add_4(x)` that returns x plus 4.", "<plan>Return x + 4.</plan>"),
    ("Write a Python function `largest(xs)` that returns the largest number in the list xs.",
     "<plan>Use max on the list.</plan>"),
]
CODER_SYSTEM = "You write Python functions. Reply with only the function inside <code></code>."
CODER_EXAMPLES = [
    ("Write a Python function `add_4(x)` that returns x plus 4.\nPlan: Return x + 4.",
     "<code>def add_4(x):\n    return x + 4</code>"),
    ("Write a Python function `largest(xs)` that returns the largest number in the list xs.\nPlan: Use max on the list.",
     "<code>def largest(xs):\n    return max(xs)</code>"),
]
SOLVER_EXAMPLES = [(q.split("\nPlan:")[0], a) for q, a in CODER_EXAMPLES]
REFLECTOR_SYSTEM = ("You review a Python function that failed its tests. Say in one sentence what is wrong and "
                    "how to fix it, inside <reflection></reflection>.")
REFLECTOR_EXAMPLES = [
    ("Task: Write a Python function `times_3(x)` that returns x multiplied by 3.\n"
     "Code:\ndef times_3(x):\n    return x + 3\nTests: test 1: WA times_3(*[2]): expected 6, got 5",
     "<reflection>It adds 3 instead of multiplying; return x * 3.</reflection>"),
    ("Task: Write a Python function `first(xs)` that returns the first element of the list xs.\n"
     "Code:\ndef first(xs):\n    return xs[1]\nTests: test 1: WA first(*[[4, 7]]): expected 4, got 7",
     "<reflection>Index 1 is the second element; return xs[0].</reflection>"),
]


def parse_plan(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("plan", nonempty)])


def parse_reflection(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("reflection", nonempty)])


def parse_code(text: str) -> ParseResult:
    """Format credit in thirds: a <code> block, that parses as Python, that defines a function."""
    res = parse_tags(text, [TagSpec("code", nonempty)], strict_outside=False)
    code = extract_code(text)
    fields = {"code": code} if code else {}
    checks = [bool(res.fields.get("code"))]
    try:
        tree = ast.parse(code or "")
        checks += [bool(code), any(isinstance(n, ast.FunctionDef) for n in ast.walk(tree))]
    except (SyntaxError, ValueError):
        checks += [False, False]
    score = sum(checks) / len(checks)
    return ParseResult(all(checks), score, fields, [] if all(checks) else ["code: missing, unparseable or no function"])


def feedback(result: dict, visible: int | None) -> str:
    """What the coder and reflector are shown: verdicts of the visible cases (with their messages),
    nothing about the hidden ones; or, without a visible split, verdicts only (messages could name
    expected values)."""
    cases = result["cases"]
    if visible is None:
        if result["all_passed"]:
            return "all tests passed"
        bad = sum(1 for v, _ in cases if v != "OK")
        kinds = sorted({v for v, _ in cases if v != "OK"})
        return f"{bad} of {len(cases)} tests failed ({', '.join(kinds)})"
    return "; ".join(f"test {i + 1}: passed" if v == "OK" else f"test {i + 1}: {v} {m}".strip()
                     for i, (v, m) in enumerate(cases[:visible]))


def seen_passing(result: dict, visible: int | None) -> bool:
    """Whether the tests the team may see all pass (the visible ones; all, without a split): when the
    team stops retrying. Hidden cases only score, so they never decide a retry."""
    cases = result["cases"]
    if visible is None or not cases or (cases[0][0] == "RE" and len(cases) == 1):
        return bool(result["all_passed"])
    return all(v == "OK" for v, _ in cases[:visible])


def full_spec(task: Task) -> tuple[TestSpec, int | None]:
    """All of a task's tests, visible ones first, and how many are visible (None: no split)."""
    spec: TestSpec = task.answer
    shown: TestSpec | None = task.meta.get("visible_tests")
    if shown is None or spec.kind == "assert":
        return spec, None
    rest = tuple(c for c in spec.cases if c not in shown.cases)
    return TestSpec(spec.kind, tuple(shown.cases) + rest, spec.checker, spec.fn_name), len(shown.cases)


def question_of(task: Task) -> str:
    """The coder's task text; HumanEval's prompt (signature and docstring) is asked for in full."""
    if task.meta.get("prompt") and task.meta.get("fn_name"):
        return f"Write the complete Python function `{task.meta['fn_name']}`:\n{task.meta['prompt'].strip()}"
    return task.question


def program_of(task: Task, code: str) -> str:
    """What runs: the task's imports (HumanEval's ``from typing import List``...) and the code."""
    return task.meta.get("preamble", "") + code



"""Plan-code-verify-reflect, and the single coder to compare it with.

planner    <plan>approach</plan>
coder      <code>program</code>               (turn 0, then once per reflection)
verifier   the sandbox running the tests: a tool (``run_tests``), not a model
reflector  <reflection>what went wrong and the fix</reflection>

Up to ``max_turns`` coder turns; the loop stops once the visible tests pass (every test, for a task
without a visible split). The coder sees test results on the *visible* cases only (the generator's
``visible_tests``; for a task without them, verdicts without expected values) and nothing of the
hidden ones, which only score: every score counts all cases, so copying expected values from
feedback into the code does not pay, and the hidden cases never tell the team to try again.

Credit (paid by the ``credit`` reward): the coder's turn 0 earns its pass rate, each later coder
turn the change in pass rate it made; a reflection earns the change in pass rate of the coder
turn that followed it; the planner earns the final pass rate. Metrics: ``pass_rate`` (final),
``all_passed``, ``turns_to_success`` (coder turns until all passed; max_turns + 1 when never),
and per agent: ``coder/pass_rate`` (its turns' mean), ``reflector/gain``, ``planner/accuracy``.
"""

from __future__ import annotations

import ast

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.parsing import ParseResult, TagSpec, nonempty, parse_tags
from masrl.tools.base import Tool, ToolUseError
from masrl.tools.code_extract import extract_code
from masrl.tools.code_tests import TestSpec
from masrl.trace import Trace
from masrl.workflows.math_prompts import few_shot

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


def summarize_report(report) -> dict:
    """The JSON-able result of the ``run_tests`` tool."""
    return {"pass_rate": report.pass_rate, "all_passed": report.all_passed,
            "cases": [[c.verdict, c.message] for c in report.cases], "first_failure": report.first_failure}


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


def _full_spec(task: Task) -> tuple[TestSpec, int | None]:
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


def code_tools(services) -> dict[str, Tool]:
    """The ``run_tests`` tool on the run's code verifier, set up now: a sandbox below
    ``sandbox.require`` stops the run before it starts."""
    verifier = services.code_verifier()

    async def run_tests(code: str, tests: TestSpec) -> dict:
        """Run a program against test cases in the sandbox; returns the pass rate and each case's verdict."""
        if not code.strip():
            raise ToolUseError("no code to run")
        return summarize_report(await verifier.verify(code, tests))

    return {"run_tests": Tool.from_function(run_tests, timeout_s=services.tool_timeout_s)}


class CodeTeam:
    name = "code_team"

    def __init__(self, max_turns: int = 2, plan: bool = True):
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.max_turns = max_turns
        self.plan = plan

    def roles(self) -> dict[str, AgentRole]:
        roles = {
            "coder": AgentRole("coder", parse_code, "writes the function", 160, ("</code>",)),
            "reflector": AgentRole("reflector", parse_reflection, "says what went wrong", 64, ("</reflection>",)),
        }
        if self.plan:
            roles = {"planner": AgentRole("planner", parse_plan, "plans the approach", 48, ("</plan>",)), **roles}
        return roles

    def tools(self, services) -> dict[str, Tool]:
        return code_tools(services)

    async def run(self, task: Task, ctx) -> None:
        spec, visible = _full_spec(task)
        q = question_of(task)
        plan_text, planner = "", None
        if self.plan:
            planner = await ctx.call("planner", few_shot(PLANNER_SYSTEM, PLANNER_EXAMPLES, q))
            plan_text = planner.parsed.get("plan") or ""
        prompt = f"{q}\nPlan: {plan_text}" if self.plan else q
        rates: list[float] = []
        refl = None  # the reflection the next coder turn follows
        code = ""
        for turn in range(self.max_turns):
            coder = await ctx.call("coder", few_shot(CODER_SYSTEM, CODER_EXAMPLES, prompt))
            code = coder.parsed.get("code") or ""
            res = await ctx.tool("run_tests", code=program_of(task, code), tests=spec)
            result = res.value if res.ok else {"pass_rate": 0.0, "all_passed": False,
                                               "cases": [["RE", res.error or ""]], "first_failure": res.error}
            rate = float(result["pass_rate"])
            coder.credit = rate - (rates[-1] if rates else 0.0)
            coder.turn_score = rate
            if refl is not None:
                refl.credit = rate - rates[-1]
            rates.append(rate)
            if seen_passing(result, visible) or turn == self.max_turns - 1:
                break
            shown = feedback(result, visible) if res.ok else f"the tests could not run: {res.error}"
            body = f"Task: {q}\nCode:\n{code}\nTests: {shown}"
            refl = await ctx.call("reflector", few_shot(REFLECTOR_SYSTEM, REFLECTOR_EXAMPLES, body))
            prompt = (f"{q}\nYour previous code:\n{code}\nTests: {shown}\n"
                      f"Reviewer: {refl.parsed.get('reflection') or ''}\nWrite the corrected function.")
        if planner is not None:
            planner.credit = rates[-1]
        ctx.finish(code, rates=rates)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        rates = trace.state.get("rates") or [0.0]
        success = next((i + 1 for i, r in enumerate(rates) if r >= 1.0), self.max_turns + 1)
        out = {"outcome": rates[-1], "pass_rate": rates[-1], "all_passed": float(rates[-1] >= 1.0),
               "turns_to_success": float(success),
               "pass_rate_turn0": rates[0], "coder/pass_rate": sum(rates) / len(rates),
               "coder/accuracy": float(rates[-1] >= 1.0)}
        gains = [b - a for a, b in zip(rates, rates[1:])]  # a reflection comes before every later coder turn
        if gains:
            out["reflector/gain"] = sum(gains) / len(gains)
            out["reflector/accuracy"] = float(gains[-1] > 0)  # its reflection fixed something
        if self.plan:
            out["planner/accuracy"] = float(rates[-1] >= 1.0)
        return out


class CodeSolver:
    """Single-agent baseline: one coder writes the function once; no plan, no tests, no review."""

    name = "code_solver"

    def roles(self) -> dict[str, AgentRole]:
        return {"coder": AgentRole("coder", parse_code, "writes the function", 160, ("</code>",))}

    def tools(self, services) -> dict[str, Tool]:
        return code_tools(services)

    async def run(self, task: Task, ctx) -> None:
        coder = await ctx.call("coder", few_shot(CODER_SYSTEM, SOLVER_EXAMPLES, question_of(task)))
        code = coder.parsed.get("code") or ""
        spec, _ = _full_spec(task)
        res = await ctx.tool("run_tests", code=program_of(task, code), tests=spec)  # scoring only: the coder never sees it
        rate = float(res.value["pass_rate"]) if res.ok else 0.0
        coder.credit = rate
        ctx.finish(code, rates=[rate])

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        rate = (trace.state.get("rates") or [0.0])[-1]
        return {"outcome": rate, "pass_rate": rate, "all_passed": float(rate >= 1.0),
                "coder/pass_rate": rate, "coder/accuracy": float(rate >= 1.0)}

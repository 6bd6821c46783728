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

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.families.code.roles import (
    CODER_EXAMPLES,
    CODER_SYSTEM,
    PLANNER_EXAMPLES,
    PLANNER_SYSTEM,
    REFLECTOR_EXAMPLES,
    REFLECTOR_SYSTEM,
    SOLVER_EXAMPLES,
    feedback,
    full_spec,
    parse_code,
    parse_plan,
    parse_reflection,
    program_of,
    question_of,
    seen_passing,
)
from masrl.tools.base import Tool
from masrl.tools.code_tests import code_tools
from masrl.trace import Trace
from masrl.workflows.prompting import few_shot


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
        q = question_of(task)
        plan_text, planner = "", None
        if self.plan:
            planner = await ctx.call("planner", few_shot(PLANNER_SYSTEM, PLANNER_EXAMPLES, q))
            plan_text = planner.parsed.get("plan") or ""
        prompt = f"{q}\nPlan: {plan_text}" if self.plan else q
        code, rates = await coder_turns(ctx, task, prompt, CODER_EXAMPLES, self.max_turns, review=True)
        if planner is not None:
            planner.credit = rates[-1]
        ctx.finish(code, rates=rates)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        rates = trace.state.get("rates") or [0.0]
        out = rate_metrics(rates, self.max_turns)
        gains = [b - a for a, b in zip(rates, rates[1:])]  # a reflection comes before every later coder turn
        if gains:
            out["reflector/gain"] = sum(gains) / len(gains)
            out["reflector/accuracy"] = float(gains[-1] > 0)  # its reflection fixed something
        if self.plan:
            out["planner/accuracy"] = float(rates[-1] >= 1.0)
        return out


async def coder_turns(ctx, task: Task, prompt: str, examples, max_turns: int, review: bool) -> tuple[str, list[float]]:
    """Up to ``max_turns`` coder turns, each tested in the sandbox, until the visible tests pass. A
    failed turn's code and test feedback go into the next turn's prompt, with the reflector's review
    first when ``review``. Credit: turn 0 its pass rate, each later turn (and the reflection before it)
    the change in pass rate. Returns the last code and every turn's pass rate."""
    spec, visible = full_spec(task)
    q = question_of(task)
    rates: list[float] = []
    refl = None  # the reflection the next coder turn follows
    code = ""
    for turn in range(max_turns):
        coder = await ctx.call("coder", few_shot(CODER_SYSTEM, examples, prompt))
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
        if seen_passing(result, visible) or turn == max_turns - 1:
            break
        shown = feedback(result, visible) if res.ok else f"the tests could not run: {res.error}"
        note = ""
        if review:
            body = f"Task: {q}\nCode:\n{code}\nTests: {shown}"
            refl = await ctx.call("reflector", few_shot(REFLECTOR_SYSTEM, REFLECTOR_EXAMPLES, body))
            note = f"Reviewer: {refl.parsed.get('reflection') or ''}\n"
        prompt = f"{q}\nYour previous code:\n{code}\nTests: {shown}\n{note}Write the corrected function."
    return code, rates


def rate_metrics(rates: list[float], max_turns: int) -> dict[str, float]:
    """The pass-rate metrics of a coder's turns (``rates``: one per turn, the last is the outcome)."""
    success = next((i + 1 for i, r in enumerate(rates) if r >= 1.0), max_turns + 1)
    return {"outcome": rates[-1], "pass_rate": rates[-1], "all_passed": float(rates[-1] >= 1.0),
            "turns_to_success": float(success), "pass_rate_turn0": rates[0],
            "coder/pass_rate": sum(rates) / len(rates), "coder/accuracy": float(rates[-1] >= 1.0)}


class CodeSolver:
    """Single-agent baseline: one coder writes the function; no plan, no review.

    ``max_turns: 1`` (default): it writes once and never sees a test. ``max_turns: 2`` or more: the
    tool-equal single agent for ``code_team``: after a turn whose visible tests fail it is shown its
    code and the same test feedback the team's coder gets, and writes the function again itself (no
    reviewer). Credit as the team's coder: turn 0 its pass rate, each later turn the change it made.
    """

    name = "code_solver"

    def __init__(self, max_turns: int = 1):
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.max_turns = max_turns

    def roles(self) -> dict[str, AgentRole]:
        return {"coder": AgentRole("coder", parse_code, "writes the function", 160, ("</code>",))}

    def tools(self, services) -> dict[str, Tool]:
        return code_tools(services)

    async def run(self, task: Task, ctx) -> None:
        # with max_turns 1 the one test run only scores: the coder never sees it
        code, rates = await coder_turns(ctx, task, question_of(task), SOLVER_EXAMPLES, self.max_turns, review=False)
        ctx.finish(code, rates=rates)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        out = rate_metrics(trace.state.get("rates") or [0.0], self.max_turns)
        if self.max_turns == 1:  # one try: no turns to count
            del out["pass_rate_turn0"], out["turns_to_success"]
        return out

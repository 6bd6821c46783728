"""The math team: solver -> verifier -> refiner -> finalizer.

solver     <solution>work</solution><answer>number</answer>
verifier   <status>correct|incorrect|uncertain</status><feedback>sentence</feedback>
refiner    <solution>corrected work</solution>
finalizer  <answer>number</answer>            (the trace's final answer)

A near-miss output never stops the workflow: fields are read leniently (an unparseable
verifier counts as "uncertain"; a missing refined solution keeps the solver's), while the
format score, which the format reward pays, stays strict. Turn scores (for the turn-delta
reward) are the correctness of the number each solution-bearing agent states.

Role credit (``role_credit: true``, paid by the ``credit`` reward) pays each agent for its own job
rather than for the team's answer, which every agent shares:

  solver     1 when its answer is right
  verifier   1 when its verdict is right (``correct`` on a right answer, ``incorrect`` on a wrong
             one), 0 when wrong, 0.25 for ``uncertain`` (so hedging pays less than judging well;
             a verifier that always approves earns the solver's accuracy, no more)
  refiner    +1 when it fixes a wrong answer, -1 when it breaks a right one, 0 otherwise
  finalizer  1 when the number it states is the refined solution's (its job is to report it)
"""

from __future__ import annotations

from masrl.agents import AgentRole
from masrl.data.answers import answer_score, answers_equivalent, to_number
from masrl.data.tasks import Task
from masrl.families.math import roles as P
from masrl.families.math.roles import (
    parse_finalizer,
    parse_refiner,
    parse_solver,
    parse_verifier,
)
from masrl.trace import Trace
from masrl.workflows.prompting import few_shot


def verdict_credit(status: str, solver_correct: float) -> float:
    """The verifier's role credit: 1 for the right verdict, 0 for the wrong one, 0.25 for a hedge."""
    if status == "uncertain":
        return 0.25
    return 1.0 if (status == "correct") == (solver_correct == 1.0) else 0.0


class MathTeam:
    name = "math_team"

    def __init__(self, verify: bool = True, role_credit: bool = False):
        self.verify = verify
        self.role_credit = role_credit

    def roles(self) -> dict[str, AgentRole]:
        return {
            "solver": AgentRole("solver", parse_solver, "writes a solution and an answer", 64, ("</answer>",)),
            "verifier": AgentRole("verifier", parse_verifier, "judges the solution", 48, ("</feedback>",)),
            "refiner": AgentRole("refiner", parse_refiner, "rewrites the solution using the check", 64, ("</solution>",)),
            "finalizer": AgentRole("finalizer", parse_finalizer, "states the final answer", 16, ("</answer>",)),
        }

    async def run(self, task: Task, ctx) -> None:
        q = task.question
        sol = await ctx.call("solver", few_shot(P.SOLVER_SYSTEM, P.SOLVER_EXAMPLES, q))
        solution = sol.parsed.get("solution") or sol.completion.strip()
        first = sol.parsed.get("answer")
        sol.turn_score = answer_score(first, task.answer)
        body = f"Question: {q}\nSolution: {solution}"

        ver = await ctx.call("verifier", few_shot(P.VERIFIER_SYSTEM, P.VERIFIER_EXAMPLES, body))
        status = (ver.parsed.get("status") or "").strip().lower()
        status = status if status in ("correct", "incorrect", "uncertain") else "uncertain"
        feedback = ver.parsed.get("feedback") or ""

        ref = await ctx.call(
            "refiner", few_shot(P.REFINER_SYSTEM, P.REFINER_EXAMPLES, f"{body}\nCheck: {status}. {feedback}".strip())
        )
        refined = ref.parsed.get("solution") or solution
        ref.turn_score = answer_score(to_number(refined), task.answer)

        fin = await ctx.call(
            "finalizer", few_shot(P.FINALIZER_SYSTEM, P.FINALIZER_EXAMPLES, f"Question: {q}\nSolution: {refined}")
        )
        answer = fin.parsed.get("answer")
        fin.turn_score = answer_score(answer, task.answer)
        if self.role_credit:
            sol.credit = sol.turn_score
            ver.credit = verdict_credit(status, sol.turn_score)
            ref.credit = ref.turn_score - sol.turn_score
            stated = to_number(refined)
            fin.credit = 1.0 if stated is not None and answers_equivalent(answer, stated) else 0.0
        ctx.state.update(first_answer=first, status=status, refined=refined)
        ctx.finish(answer)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        outcome = answer_score(trace.final_answer, task.answer)
        first = answer_score(trace.state.get("first_answer"), task.answer)
        status = trace.state.get("status")
        judged = {"correct": 1.0, "incorrect": 0.0}.get(status)
        return {
            "outcome": outcome,
            "solver_correct": first,
            "verifier_accurate": float(judged == first) if judged is not None else 0.0,
        }

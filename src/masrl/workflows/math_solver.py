"""Single-agent baseline: one solver answers directly. Compare the team against this."""

from __future__ import annotations

from masrl.agents import AgentRole
from masrl.data.answers import answers_equivalent
from masrl.data.tasks import Task
from masrl.trace import Trace
from masrl.workflows import math_prompts as P
from masrl.workflows.math_team import parse_solver


class MathSolver:
    name = "math_solver"

    def roles(self) -> dict[str, AgentRole]:
        return {"solver": AgentRole("solver", parse_solver, "writes a solution and an answer", 64, ("</answer>",))}

    async def run(self, task: Task, ctx) -> None:
        sol = await ctx.call("solver", P.few_shot(P.SOLVER_SYSTEM, P.SOLVER_EXAMPLES, task.question))
        ctx.finish(sol.parsed.get("answer"))

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        ok = trace.final_answer is not None and answers_equivalent(trace.final_answer, task.answer)
        return {"outcome": 1.0 if ok else 0.0}

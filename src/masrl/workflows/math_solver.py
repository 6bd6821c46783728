"""Single-agent baseline: one solver answers directly. Compare the team against this.

With ``calculator: true`` the solver's written calculation (the ``<solution>`` before any "=") is
computed by the ``calculator`` tool and that value is its answer (its stated ``<answer>`` when the
calculation does not compute): the single agent with the tool the checked math team's checker has.
"""

from __future__ import annotations

from masrl.agents import AgentRole
from masrl.data.answers import answer_score
from masrl.data.tasks import Task
from masrl.tools.base import Tool
from masrl.tools.calculator import calculator_tool
from masrl.trace import Trace
from masrl.workflows import math_roles as P
from masrl.workflows.math_roles import parse_solver
from masrl.workflows.prompting import few_shot


class MathSolver:
    name = "math_solver"

    def __init__(self, calculator: bool = False):
        self.calculator = calculator

    def roles(self) -> dict[str, AgentRole]:
        return {"solver": AgentRole("solver", parse_solver, "writes a solution and an answer", 64, ("</answer>",))}

    def tools(self, services) -> dict[str, Tool]:
        return {"calculator": calculator_tool()} if self.calculator else {}

    async def run(self, task: Task, ctx) -> None:
        sol = await ctx.call("solver", few_shot(P.SOLVER_SYSTEM, P.SOLVER_EXAMPLES, task.question))
        answer = sol.parsed.get("answer")
        work = (sol.parsed.get("solution") or "").strip()
        if self.calculator and work:
            res = await ctx.tool("calculator", expression=work)
            answer = res.value if res.ok else answer
        ctx.finish(answer)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        return {"outcome": answer_score(trace.final_answer, task.answer)}

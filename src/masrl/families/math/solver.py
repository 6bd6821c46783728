"""Single-agent baseline: one solver answers directly. Compare the team against this.

With ``calculator: true`` the solver's written calculation (the ``<solution>`` before any "=") is
computed by the ``calculator`` tool and that value is its answer (its stated ``<answer>`` when the
calculation does not compute): the single agent with the tool the checked math team's checker has.
With ``style: expression`` as well, the solver is prompted as that checker is (the question in, one
``<expr>`` out, the calculator's value the answer): the single agent with the checker's tool and its
prompt, the control that says whether the checked team's win is the team or the checker's prompt.
"""

from __future__ import annotations

from masrl.agents import AgentRole
from masrl.data.answers import answer_score
from masrl.data.tasks import Task
from masrl.families.math import roles as P
from masrl.families.math.roles import parse_checker, parse_solver
from masrl.tools.base import Tool
from masrl.tools.calculator import calculator_tool
from masrl.trace import Trace
from masrl.workflows.prompting import few_shot


class MathSolver:
    name = "math_solver"

    def __init__(self, calculator: bool = False, style: str = "solution"):
        if style not in ("solution", "expression"):
            raise ValueError(f"style must be 'solution' or 'expression', got {style!r}")
        if style == "expression" and not calculator:
            raise ValueError("style 'expression' needs calculator: true (the calculator computes the expression)")
        self.calculator, self.style = calculator, style

    def roles(self) -> dict[str, AgentRole]:
        if self.style == "expression":
            return {"solver": AgentRole("solver", parse_checker, "writes the expression the calculator computes", 32,
                                        ("</expr>",))}
        return {"solver": AgentRole("solver", parse_solver, "writes a solution and an answer", 64, ("</answer>",))}

    def tools(self, services) -> dict[str, Tool]:
        return {"calculator": calculator_tool()} if self.calculator else {}

    async def run(self, task: Task, ctx) -> None:
        if self.style == "expression":
            sol = await ctx.call("solver", few_shot(P.CHECKER_SYSTEM, P.CHECKER_EXAMPLES, task.question))
            answer, work = None, (sol.parsed.get("expr") or "").strip()
        else:
            sol = await ctx.call("solver", few_shot(P.SOLVER_SYSTEM, P.SOLVER_EXAMPLES, task.question))
            answer, work = sol.parsed.get("answer"), (sol.parsed.get("solution") or "").strip()
        if self.calculator and work:
            res = await ctx.tool("calculator", expression=work)
            answer = res.value if res.ok else answer
        ctx.finish(answer)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        return {"outcome": answer_score(trace.final_answer, task.answer)}

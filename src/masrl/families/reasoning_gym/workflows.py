"""Workflows for reasoning-gym tasks (``source: reasoning_gym``), every answer scored by the library's own scorer.

rg_solver    one agent answers (``<answer>``). With ``calculator: true`` it may first write an arithmetic
             ``<expr>`` that the ``calculator`` tool computes, and that value is its answer where it computes
             (its stated answer otherwise; an answer written as arithmetic, "14 * 43", is computed too): one
             agent with the team's tool and both of its prompts' examples, the control the team must beat.
rg_checked   the checked team: a solver answers as ``rg_solver`` does, a checker writes an expression (or
             ``none``) that the calculator computes, and a finalizer states the team's answer from the two.
             Role credit (``role_credit: true``, paid by the ``credit`` reward): each call earns the library's
             score of its own answer (the checker: of the calculator's value).

Per-agent metrics: ``solver/accuracy``, ``checker/accuracy``, ``finalizer/accuracy``; held-out figures come
per dataset (``by_source``). Where the tool cannot apply (spelling, sorting, a GCD) only the solver can be
right; the finalizer's job is to know which.
"""

from __future__ import annotations

import re

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.errors import DataError
from masrl.families.reasoning_gym import roles as P
from masrl.families.reasoning_gym import tasks as rg_data
from masrl.tools.base import Tool
from masrl.tools.calculator import calculator_tool
from masrl.trace import Trace
from masrl.workflows.prompting import few_shot


def library_score(answer, task: Task) -> float:
    if not rg_data.is_reasoning_gym(task):
        raise DataError(f"task {task.id}: the reasoning-gym workflows score with the library's own scorer and need "
                        f"tasks of source reasoning_gym (data.train.source / data.eval.source)")
    return rg_data.score(answer, task)


_ARITHMETIC = re.compile(r"[-\d\s.()]*\d\s*[-+*/%]\s*[-\d\s.()+*/%]*")  # numbers with an operator, nothing else


async def _calculate(ctx, expr: str | None):
    """The calculator's value of ``expr`` (None where there is none or it does not compute) and how it reads."""
    if not expr or expr.strip().lower() == "none":
        return None, "none"
    res = await ctx.tool("calculator", expression=expr)
    return (res.value, f"{expr} = {res.value}") if res.ok else (None, f"could not compute '{expr}'")


class ReasoningGymSolver:
    name = "rg_solver"

    def __init__(self, calculator: bool = False, max_new_tokens: int = 64):
        self.calculator, self.max_new_tokens = calculator, max_new_tokens

    def roles(self) -> dict[str, AgentRole]:
        parser = P.parse_calc_solver if self.calculator else P.parse_answer
        return {"solver": AgentRole("solver", parser, "answers the question", self.max_new_tokens, ("</answer>",))}

    def tools(self, services) -> dict[str, Tool]:
        return {"calculator": calculator_tool()} if self.calculator else {}

    async def run(self, task: Task, ctx) -> None:
        if self.calculator:
            sol = await ctx.call("solver", few_shot(P.CALC_SOLVER_SYSTEM, P.calc_solver_examples(task), task.question))
            expr, stated = sol.parsed.get("expr"), sol.parsed.get("answer")
            if not expr and stated and _ARITHMETIC.fullmatch(stated.strip()):
                expr = stated  # the answer written as arithmetic: the calculator computes it too
            computed, _ = await _calculate(ctx, expr)
            ctx.finish(computed if computed is not None else stated)
            return
        sol = await ctx.call("solver", few_shot(P.SOLVER_SYSTEM, P.solver_examples(task), task.question))
        ctx.finish(sol.parsed.get("answer"))

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        return {"outcome": library_score(trace.final_answer, task)}


class ReasoningGymChecked:
    name = "rg_checked"

    def __init__(self, role_credit: bool = True, max_new_tokens: int = 64):
        self.role_credit, self.max_new_tokens = role_credit, max_new_tokens

    def roles(self) -> dict[str, AgentRole]:
        return {
            "solver": AgentRole("solver", P.parse_answer, "answers the question", self.max_new_tokens, ("</answer>",)),
            "checker": AgentRole("checker", P.parse_expr, "writes the expression the calculator computes", 32,
                                 ("</expr>",)),
            "finalizer": AgentRole("finalizer", P.parse_answer, "states the team's answer", self.max_new_tokens,
                                   ("</answer>",)),
        }

    def tools(self, services) -> dict[str, Tool]:
        return {"calculator": calculator_tool()}

    async def run(self, task: Task, ctx) -> None:
        q = task.question
        sol = await ctx.call("solver", few_shot(P.SOLVER_SYSTEM, P.solver_examples(task), q))
        first = sol.parsed.get("answer")
        chk = await ctx.call("checker", few_shot(P.CHECKER_SYSTEM, P.checker_examples(task), q))
        computed, shown = await _calculate(ctx, chk.parsed.get("expr"))
        fin = await ctx.call("finalizer", few_shot(P.FINALIZER_SYSTEM, P.finalizer_examples(task),
                                                     P.finalizer_prompt(q, first, shown)))
        answer = fin.parsed.get("answer")
        for call, value in ((sol, first), (chk, computed), (fin, answer)):
            call.turn_score = library_score(value, task)
        if self.role_credit:
            sol.credit, chk.credit, fin.credit = sol.turn_score, chk.turn_score, fin.turn_score
        ctx.state.update(first_answer=first, computed=computed)
        ctx.finish(answer)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        outcome = library_score(trace.final_answer, task)
        return {"outcome": outcome, "solver/accuracy": library_score(trace.state.get("first_answer"), task),
                "checker/accuracy": library_score(trace.state.get("computed"), task), "finalizer/accuracy": outcome}

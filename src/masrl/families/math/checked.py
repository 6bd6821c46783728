"""The checked math team: solver -> checker (with a calculator) -> finalizer.

solver     <solution>work</solution><answer>number</answer>     (works it out, as ``math_solver`` does)
checker    <expr>arithmetic</expr>                            (translates the question; the ``calculator``
                                                               tool computes it exactly)
finalizer  <answer>number</answer>                            (weighs the solver's answer against the
                                                               calculator's, states the team's)

Why this team: in the four-agent ``math_team`` the verifier has nothing the solver lacks (a 135M
model checks sums no better than it does them), so the team's answer is the solver's. Here the
checker's job is only to translate words into an expression; the calculator does the arithmetic,
which is where a small model's answers go wrong, and the finalizer learns which of the two
answers to trust. This is the reasoner-plus-tool-agent pattern of PettingLLMs' math teams.

Role credit (``role_credit: true``, paid by the ``credit`` reward): the solver earns 1 for a right
answer, the checker 1 when its expression computes to the right answer, the finalizer 1 for a
right final answer. Per-agent metrics: ``solver/accuracy``, ``checker/accuracy``,
``finalizer/accuracy``, and ``agree`` (the solver's and calculator's answers are equal).
"""

from __future__ import annotations

from masrl.agents import AgentRole
from masrl.data.answers import answer_score, answers_equivalent
from masrl.data.tasks import Task
from masrl.families.math import roles as P
from masrl.families.math.roles import parse_checker, parse_finalizer, parse_solver
from masrl.tools.base import Tool
from masrl.tools.calculator import calculator_tool
from masrl.trace import Trace
from masrl.workflows.prompting import few_shot

FINALIZER_SYSTEM = ("You give the final answer to a math word problem from a solver's answer and a calculator's "
                    "result. Write one number in <answer></answer>.")
FINALIZER_EXAMPLES = [
    ("Question: Ana has 3 pens and buys 4 more. How many pens does Ana have now?\n"
     "Solver: 3 + 4 = 8, answer 8\nCalculator: 3 + 4 = 7", "<answer>7</answer>"),
    ("Question: Omar had 15 cards and gave away 6. How many cards are left?\n"
     "Solver: 15 - 6 = 9, answer 9\nCalculator: 15 - 6 = 9", "<answer>9</answer>"),
]



class MathChecked:
    name = "math_checked"

    def __init__(self, role_credit: bool = True):
        self.role_credit = role_credit

    def roles(self) -> dict[str, AgentRole]:
        return {
            "solver": AgentRole("solver", parse_solver, "writes a solution and an answer", 64, ("</answer>",)),
            "checker": AgentRole("checker", parse_checker, "writes the expression the calculator computes", 32,
                                 ("</expr>",)),
            "finalizer": AgentRole("finalizer", parse_finalizer, "states the team's answer", 16, ("</answer>",)),
        }

    def tools(self, services) -> dict[str, Tool]:
        return {"calculator": calculator_tool()}

    async def run(self, task: Task, ctx) -> None:
        q = task.question
        sol = await ctx.call("solver", few_shot(P.SOLVER_SYSTEM, P.SOLVER_EXAMPLES, q))
        work = (sol.parsed.get("solution") or "").strip()
        first = sol.parsed.get("answer")
        chk = await ctx.call("checker", few_shot(P.CHECKER_SYSTEM, P.CHECKER_EXAMPLES, q))
        expr = (chk.parsed.get("expr") or "").strip()
        res = await ctx.tool("calculator", expression=expr) if expr else None
        computed = res.value if res is not None and res.ok else None
        shown = f"{expr} = {computed}" if computed is not None else (
            f"could not compute '{expr}': {res.error}" if res is not None else "no expression")
        stated = f"{work}, answer {first}" if work else f"answer {first}"
        fin = await ctx.call("finalizer", few_shot(FINALIZER_SYSTEM, FINALIZER_EXAMPLES,
                                                     f"Question: {q}\nSolver: {stated}\nCalculator: {shown}"))
        answer = fin.parsed.get("answer")
        for call, value in ((sol, first), (chk, computed), (fin, answer)):
            call.turn_score = answer_score(value, task.answer)
        if self.role_credit:
            sol.credit, chk.credit, fin.credit = sol.turn_score, chk.turn_score, fin.turn_score
        ctx.state.update(first_answer=first, computed=computed)
        ctx.finish(answer)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        first, computed = trace.state.get("first_answer"), trace.state.get("computed")
        outcome = answer_score(trace.final_answer, task.answer)
        agree = first is not None and computed is not None and answers_equivalent(first, computed)
        return {"outcome": outcome, "solver/accuracy": answer_score(first, task.answer),
                "checker/accuracy": answer_score(computed, task.answer), "finalizer/accuracy": outcome,
                "agree": float(agree)}


"""A workflow written outside masrl: solve, check with a calculator tool, retry once if wrong.

  solver   -> <solution>..</solution><answer>..</answer>
  (tool)   calculator evaluates the arithmetic in the solution
  solver   again, shown the calculator's result, when its answer disagrees with it (turn 1)

It shows the three things a workflow does: ``ctx.call`` an agent (with an explicit ``turn`` so
GRPO groups first tries with first tries), ``ctx.tool`` a tool (it returns a ``ToolResult``; an
expression the model wrote that the calculator cannot read is a ``ToolUseError``, which comes back
as ``ok=False`` and is recorded on the trace), and ``ctx.finish`` with the answer. ``score``
returns the outcome the reward pays.
"""

from __future__ import annotations

import ast
import operator
import re

from masrl.agents import AgentRole
from masrl.data.answers import answers_equivalent, to_number
from masrl.families.math import roles as P
from masrl.families.math.roles import parse_solver
from masrl.tools.base import ToolUseError, tool
from masrl.workflows.prompting import few_shot

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculator(expression: str) -> float:
    """Evaluate + - * / over numbers, nothing else (no eval of model text)."""
    try:
        return _evaluate(expression)
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError) as exc:
        raise ToolUseError(f"cannot evaluate {expression!r}: {exc}") from None


def _evaluate(expression: str) -> float:

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"unsupported expression: {ast.dump(node)[:60]}")

    return ev(ast.parse(expression, mode="eval"))


class SolveWithCalculator:
    name = "solve_with_calculator"

    def __init__(self, retries: int = 1):
        self.retries = retries

    def roles(self):
        return {"solver": AgentRole("solver", parse_solver, "solves, maybe twice", 48, ("</answer>",))}

    def tools(self, services):
        return {"calculator": tool(calculator, description="Evaluate an arithmetic expression (+ - * /)")}

    async def run(self, task, ctx):
        msgs = few_shot(P.SOLVER_SYSTEM, P.SOLVER_EXAMPLES, task.question)
        answer = None
        for attempt in range(self.retries + 1):
            call = await ctx.call("solver", msgs, turn=attempt)
            answer = call.parsed.get("answer")
            call.turn_score = 1.0 if answer is not None and answers_equivalent(answer, task.answer) else 0.0
            expr = re.split(r"=", call.parsed.get("solution") or "")[0].strip()
            res = await ctx.tool("calculator", expression=expr)
            if not res.ok:
                break  # recorded on the trace; keep the answer we have
            value = res.value
            if to_number(answer) == value:
                break
            msgs = msgs + [{"role": "assistant", "content": call.completion},
                           {"role": "user", "content": f"The calculator says {expr} = {value:g}. Try again."}]
        ctx.finish(answer)

    def score(self, trace, task):
        ok = trace.final_answer is not None and answers_equivalent(trace.final_answer, task.answer)
        return {"outcome": 1.0 if ok else 0.0, "tool_failures": float(sum(t.error is not None for t in trace.tool_calls))}

"""Problems that chain several events (``source: math_chain``): a team of steppers against one solver.

``math_chain_team``: one stepper call per event, in order. Each sees only the count so far and its event, as a
problem of its own ("Ana has 29 apples. Ana gives away 9. How many apples does Ana have now?"), and writes
one ``<expr>``; the calculator computes it and that value is the next stepper's count. The last value is
the team's answer; an expression that does not compute ends the chain (no answer).

``math_chain_agent`` (the single-agent control, the same calculator): with ``stepwise: false`` one call
writes one expression for the whole chain (brackets and all), prompted as the math checker is with worked
chains of every kind of event; with ``stepwise: true`` one agent works through the events in one
conversation, a turn and a calculator call per event as the team does, seeing the whole problem, its
earlier turns and each result (the team's calls, the team's information, one context).

Credit (``step_credit: true``, the default, paid by the ``credit`` reward): a step earns 1 when its value is
its event applied to the count it was given (right even after an earlier step went wrong), else 0;
``step_credit: false`` pays every call the outcome. The one-expression agent's call earns the outcome.
Metrics: ``outcome``, ``step/accuracy`` (steps right from their count), ``steps_done`` (of the events, the
share reached before the chain ended).
"""

from __future__ import annotations

from masrl.agents import AgentRole
from masrl.data.answers import answer_score, to_number
from masrl.data.tasks import Task
from masrl.errors import DataError
from masrl.families.math.chain import apply, step_question
from masrl.families.math.roles import CHECKER_SYSTEM, parse_checker
from masrl.tools.base import Tool
from masrl.tools.calculator import calculator_tool
from masrl.trace import Trace
from masrl.workflows.base import state_means
from masrl.workflows.prompting import few_shot

# one worked example of each kind of event (data/chain.py), each alone
STEP_EXAMPLES = [
    ("Ana has 3 pens. Ana buys 4 more. How many pens does Ana have now?", "<expr>3 + 4</expr>"),
    ("Omar has 15 cards. Omar gives away 6. How many cards does Omar have now?", "<expr>15 - 6</expr>"),
    ("Kofi has 3 shells. Kofi buys 2 packs with 5 in each pack. How many shells does Kofi have now?",
     "<expr>3 + 2 * 5</expr>"),
    ("Lena has 12 stamps. Lena splits them into 3 equal piles and keeps one pile. How many stamps does Lena have "
     "now?", "<expr>12 / 3</expr>"),
    ("Sara has 7 coins. The number of coins doubles. How many coins does Sara have now?", "<expr>7 * 2</expr>"),
]
# the same five kinds of event, chained: what the one-expression agent has to write
CHAIN_EXAMPLES = [
    ("Ana has 3 pens. Then Ana buys 4 more. Then Ana gives away 2. How many pens does Ana have now?",
     "<expr>3 + 4 - 2</expr>"),
    ("Kofi has 6 shells. Then Kofi buys 2 packs with 5 in each pack. Then Kofi splits them into 4 equal piles and "
     "keeps one pile. How many shells does Kofi have now?", "<expr>(6 + 2 * 5) / 4</expr>"),
    ("Sara has 7 coins. Then the number of coins doubles. Then Sara loses 4 of them. Then Sara finds 3 more. How many "
     "coins does Sara have now?", "<expr>7 * 2 - 4 + 3</expr>"),
]
STEPWISE_SYSTEM = ("You work through a math word problem one event at a time. For each event write one arithmetic "
                   "expression for the count after it in <expr></expr>; a calculator computes it.")
# one worked conversation over every kind of event: (problem, start, [(event, expression, calculator value)])
_STEPWISE_EXAMPLE = (
    "Kofi has 3 shells. Then Kofi buys 2 packs with 5 in each pack. Then Kofi gives away 1. Then Kofi splits them "
    "into 4 equal piles and keeps one pile. Then Kofi finds 4 more. Then the number of shells doubles. How many "
    "shells does Kofi have now?", 3,
    [("Kofi buys 2 packs with 5 in each pack.", "3 + 2 * 5", 13), ("Kofi gives away 1.", "13 - 1", 12),
     ("Kofi splits them into 4 equal piles and keeps one pile.", "12 / 4", 3), ("Kofi finds 4 more.", "3 + 4", 7),
     ("The number of shells doubles.", "7 * 2", 14)],
)


def _expr_role(name: str, what: str) -> AgentRole:
    return AgentRole(name, parse_checker, what, 32, ("</expr>",))


def chain_of(task: Task) -> dict:
    meta = task.meta or {}
    if not meta.get("events") or "start" not in meta:
        raise DataError(f"task {task.id}: the math_chain workflows need the events of a chained problem in meta "
                        f"(start, events, name, item): use data source math_chain")
    return meta


def _stepwise_turn(k: int, event: str, count: object) -> str:
    return f"Count now: {count}.\nEvent {k + 1}: {event}"


def stepwise_messages(question: str) -> list[dict[str, str]]:
    """The stepwise agent's system prompt and worked conversation, then ``question`` (its first event follows)."""
    problem, count, steps = _STEPWISE_EXAMPLE
    msgs = [{"role": "system", "content": STEPWISE_SYSTEM}]
    for k, (event, expr, value) in enumerate(steps):
        head = f"Problem: {problem}\n" if k == 0 else ""
        msgs += [{"role": "user", "content": head + _stepwise_turn(k, event, count)},
                 {"role": "assistant", "content": f"<expr>{expr}</expr>"}]
        count = value
    return [*msgs, {"role": "user", "content": f"Problem: {question}"}]


async def _compute(ctx, call) -> float | None:
    """The calculator's value of a call's ``<expr>`` (None when there is none or it does not compute)."""
    expr = (call.parsed.get("expr") or "").strip()
    if not expr:
        return None
    res = await ctx.tool("calculator", expression=expr)
    return to_number(res.value) if res.ok else None


def _shown(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class _Chain:
    """What both stepping workflows share: walk the events, credit each step from the count it was given."""

    def __init__(self, step_credit: bool = True):
        self.step_credit = step_credit

    def tools(self, services) -> dict[str, Tool]:
        return {"calculator": calculator_tool()}

    async def _walk(self, task: Task, ctx, step) -> None:
        """``step(k, count)`` makes event ``k``'s call from ``count`` and returns it; values chain."""
        events = chain_of(task)["events"]
        count: float | None = chain_of(task)["start"]
        calls, right = [], []
        for k, ev in enumerate(events):
            call = await step(k, _shown(count))
            value = await _compute(ctx, call)
            right.append(float(value is not None and abs(value - apply(ev["op"], ev["args"], count)) < 1e-9))
            call.credit = right[-1]
            calls.append(call)
            count = value
            if value is None:  # the chain ends: no count for the next event
                break
        answer = _shown(count) if count is not None else None
        if not self.step_credit:
            for c in calls:
                c.credit = answer_score(answer, task.answer)
        ctx.finish(answer, steps=right, done=[(len(calls) - (count is None)) / len(events)])

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        out = {"outcome": answer_score(trace.final_answer, task.answer)}
        return out | state_means(trace, {"steps": "step/accuracy", "done": "steps_done"})


class MathChainTeam(_Chain):
    name = "math_chain_team"

    def roles(self) -> dict[str, AgentRole]:
        return {"stepper": _expr_role("stepper", "writes the expression for one event, from the count so far")}

    async def run(self, task: Task, ctx) -> None:
        meta = chain_of(task)

        async def step(k: int, count: str):
            return await ctx.call("stepper", few_shot(CHECKER_SYSTEM, STEP_EXAMPLES, step_question(meta, k, count)))

        await self._walk(task, ctx, step)


class MathChainAgent(_Chain):
    """The single-agent control: one expression for the chain, or (``stepwise``) one conversation of steps."""

    name = "math_chain_agent"

    def __init__(self, stepwise: bool = False, step_credit: bool = True):
        super().__init__(step_credit)
        self.stepwise = stepwise

    def roles(self) -> dict[str, AgentRole]:
        what = "writes the expression for each event in turn" if self.stepwise else "writes one expression for the problem"
        return {"solver": _expr_role("solver", what)}

    async def run(self, task: Task, ctx) -> None:
        meta = chain_of(task)
        if not self.stepwise:
            call = await ctx.call("solver", few_shot(CHECKER_SYSTEM, CHAIN_EXAMPLES, task.question))
            value = await _compute(ctx, call)
            answer = _shown(value) if value is not None else None
            call.credit = answer_score(answer, task.answer)
            ctx.finish(answer)
            return
        msgs = stepwise_messages(task.question)

        async def step(k: int, count: str):
            event = meta["events"][k]["text"]
            turn = _stepwise_turn(k, event, count)
            msgs[-1]["content"] = (msgs[-1]["content"] + "\n" + turn) if k == 0 else turn
            call = await ctx.call("solver", [dict(m) for m in msgs])
            msgs.extend([{"role": "assistant", "content": call.completion}, {"role": "user", "content": ""}])
            return call

        await self._walk(task, ctx, step)

"""Writing a function from its documentation: a team of readers against one coder that reads it all.

The tasks (``source: code_docs``) ask for a function by an invented name and carry documentation entries
in ``meta.context``: the asked function's among others'. The sandbox scores the code on the task's tests.

``code_docs_team``: the entries split into chunks of ``docs_per_reader``:
reader      <doc>n</doc>: the entry of its chunk whose name the task asks for (one call per chunk, in
            parallel; each must name one: on the reading family, trained readers never said "none")
coder       <code>def ...</code> from the readers' picks only, prompted as the single coder is

``code_docs_agent`` (the single-agent control): the same coder prompt over every entry, one call.

Both coders are shown the same worked examples; only the number of entries differs. Credit (the
``credit`` reward): the coder earns the pass rate over all test cases; with ``found_credit: true`` (the
default) a reader whose chunk holds the asked entry earns 1 when its pick is that entry and 0 when not,
and a reader whose chunk lacks it earns nothing (its pick cannot matter), as the reading team's readers;
``found_credit: false`` pays every reader the pass rate. Metrics: ``pass_rate`` (``outcome``),
``all_passed``, ``reader/accuracy`` (holding readers that picked the asked entry), ``coder/covered`` (the
asked entry is among the coder's entries: the team's ceiling), ``coder/pass_rate``.
"""

from __future__ import annotations

import asyncio

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.errors import DataError
from masrl.families.code.docs_tasks import holds
from masrl.families.code.roles import parse_code
from masrl.families.code.team import coder_turns, rate_metrics
from masrl.families.qa.reading import parse_doc, picked
from masrl.tools.base import Tool
from masrl.tools.code_tests import code_tools
from masrl.trace import Trace
from masrl.workflows.base import state_means
from masrl.workflows.prompting import few_shot

# worked examples: names the generator never draws (code_docs.EXAMPLE_NAMES)
_E = {
    "pomet": "pomet(x): Returns x multiplied by 7. For example, pomet(2) returns 14. It has no side effects.",
    "sarvik": "sarvik(xs): Returns the sum of the numbers in the list xs. For example, sarvik([1, 5]) returns 6. "
              "The ledger team maintains it.",
    "dulo": "dulo(a, b): Returns a minus b. For example, dulo(9, 4) returns 5. It was added in version 2.1.",
    "kenbra": "kenbra(s): Returns how many times the letter 'e' appears in the string s. For example, kenbra('tree') "
              "returns 2. It logs nothing.",
}
_Q = "Write the Python function `{}` that the documentation describes."
_CODE = {"pomet": "def pomet(x):\n    return x * 7", "dulo": "def dulo(a, b):\n    return a - b"}
_SIG = {name: e.split(":")[0] for name, e in _E.items()}  # "pomet(x)": an entry starts with its signature


def docs_prompt(entries: list[str], question: str) -> str:
    listed = "\n".join(f"[{i}] {e}" for i, e in enumerate(entries, 1))
    return f"Documentation:\n{listed}\nTask: {question}"


READER_SYSTEM = ("You find the documentation of the function a task asks for. Each entry starts with a function's "
                 "name. Write the number of the entry whose name is the one the task asks for in <doc></doc>; if "
                 "none is, the closest.")
# the asked entry second, first, third: no position is always right
READER_EXAMPLES = [
    (docs_prompt([_E["dulo"], _E["pomet"], _E["kenbra"]], _Q.format(_SIG["pomet"])), "<doc>2</doc>"),
    (docs_prompt([_E["sarvik"], _E["kenbra"]], _Q.format(_SIG["sarvik"])), "<doc>1</doc>"),
    (docs_prompt([_E["pomet"], _E["sarvik"], _E["kenbra"]], _Q.format(_SIG["kenbra"])), "<doc>3</doc>"),
]
CODER_EXAMPLES = [
    (docs_prompt([_E["kenbra"], _E["dulo"]], _Q.format(_SIG["dulo"])), f"<code>{_CODE['dulo']}</code>"),
    (docs_prompt([_E["pomet"], _E["sarvik"], _E["dulo"]], _Q.format(_SIG["pomet"])), f"<code>{_CODE['pomet']}</code>"),
]


def entries_of(task: Task) -> list[str]:
    ctx = (task.meta or {}).get("context")
    if not ctx or not task.meta.get("fn_name"):
        raise DataError(f"task {task.id}: the code_docs workflows need documentation entries in meta.context and the "
                        f"function's name in meta.fn_name: use data source code_docs (with data.world.context_docs, "
                        f"e.g. 24)")
    return [str(e) for e in ctx]


def _coder_role() -> AgentRole:
    return AgentRole("coder", parse_code, "writes the function from the documentation", 160, ("</code>",))


def _score(trace: Trace) -> dict[str, float]:
    """The single coder's metrics (one turn: no turns to count), and the readers' where they ran."""
    out = rate_metrics(trace.state.get("rates") or [0.0], 1)
    del out["pass_rate_turn0"], out["turns_to_success"]
    return out | state_means(trace, {"grounded": "reader/accuracy", "covered": "coder/covered"})


class CodeDocsTeam:
    name = "code_docs_team"

    def __init__(self, docs_per_reader: int = 8, found_credit: bool = True):
        if docs_per_reader < 1:
            raise ValueError("docs_per_reader must be at least 1")
        self.docs_per_reader = docs_per_reader
        self.found_credit = found_credit

    def roles(self) -> dict[str, AgentRole]:
        return {"reader": AgentRole("reader", parse_doc, "names the asked function's entry, among a few", 8, ("</doc>",)),
                "coder": _coder_role()}

    def tools(self, services) -> dict[str, Tool]:
        return code_tools(services)

    async def run(self, task: Task, ctx) -> None:
        entries, k = entries_of(task), self.docs_per_reader
        chunks = [entries[i:i + k] for i in range(0, len(entries), k)]
        readers = list(await asyncio.gather(*[
            ctx.call("reader", few_shot(READER_SYSTEM, READER_EXAMPLES, docs_prompt(c, task.question))) for c in chunks]))
        picks = [picked(r, c) for r, c in zip(readers, chunks)]
        right = [float(p is not None and holds(p, task)) for p in picks]
        held = [any(holds(e, task) for e in c) for c in chunks]
        notes = [p for p in picks if p is not None]
        code, rates = await coder_turns(ctx, task, docs_prompt(notes, task.question), CODER_EXAMPLES, 1, review=False)
        for r, ok, h in zip(readers, right, held):
            if not self.found_credit:
                r.credit = rates[-1]
            elif h:  # a reader whose chunk lacks the entry gets no credit: its pick cannot matter
                r.credit = ok
        ctx.finish(code, rates=rates, grounded=[ok for ok, h in zip(right, held) if h], covered=[max(right)])

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        return _score(trace)


class CodeDocsAgent:
    """The single-agent control: one coder call over every documentation entry."""

    name = "code_docs_agent"

    def roles(self) -> dict[str, AgentRole]:
        return {"coder": _coder_role()}

    def tools(self, services) -> dict[str, Tool]:
        return code_tools(services)

    async def run(self, task: Task, ctx) -> None:
        entries = entries_of(task)
        code, rates = await coder_turns(ctx, task, docs_prompt(entries, task.question), CODER_EXAMPLES, 1, review=False)
        ctx.finish(code, rates=rates)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        return _score(trace)

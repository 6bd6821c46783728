"""Two-hop reading: a question that takes two passages, found among many, by a team or by one call.

The QA world's level-2 questions ("In what year was the founder of Vexora Labs born?") need the passage
the question names (Vexora Labs: founded by Dalen Morvik) and then the passage about what that one leads
to (the bridge: Dalen Morvik, born in 1950). Each task carries its passages in ``meta.context``
(``data.world.context_docs``: both supporting documents among same-kind distractors) and its bridge in
``meta.bridge``.

``reading_hops`` (the team, 8 calls a question, every agent on one policy as configured):
  reader    (x chunks) names the passage of its chunk whose title the question names   (<doc>n</doc>)
  bridger   reads the readers' picks and names what the question leads to           (<answer>bridge</answer>)
  reader    (x chunks) names the passage of its chunk about that bridge                (<doc>n</doc>)
  answerer  reads the second round's picks, told the bridge, and answers            (<answer>text</answer>)
The work splits twice: by passages (each reader sees ``docs_per_reader``) and by hops (no call has to
find two passages and chain them). Credit: a reader whose chunk holds what its round looks for (the passage
the question names in round one, the bridge's own in round two) earns 1 when its pick holds it and 0 when
not, a reader whose chunk lacks it earns none; the bridger earns its bridge's token F1, the answerer the
answer's.

``bridger: pick`` (5 calls a question) has the bridger choose instead of write: it reads the first round's
picks and the numbered titles of every passage and names the title the question leads to
(``<doc>n</doc>``, paid 1 when that title is the bridge); the answerer then reads that passage, and there
is no second reading round. A choice among titles that stand in the picked passage's text is a copying
match a small model can hit by chance and learn from, where a written name paid its F1 starts near zero
(0.02 for SmolLM2-135M on the H200, docs/results.md) and leaves the bridger nothing to learn from.

``reading_hops_agent`` (the single-agent control): one call reads every passage and answers, with a
worked example of each kind of two-hop question. ``bridge: true`` has it name the bridge first
(``<bridge>..</bridge><answer>..</answer>``) and pays its call the mean of the bridge's F1 and the
answer's: the same intermediate step and the same check of it as the team's.
Metrics: ``f1``/``em``; ``hop1/accuracy``, ``hop2/accuracy`` (readers whose pick holds what their round
looks for, among those whose chunk holds it), ``bridge/f1``, ``answerer/covered`` (a second-round pick
holds the answer); the agent's ``bridge/f1`` with ``bridge``.
"""

from __future__ import annotations

import asyncio

from masrl.agents import AgentRole
from masrl.data.qa_scoring import normalize_answer, token_f1
from masrl.data.tasks import Task
from masrl.errors import DataError
from masrl.families.qa.reading import (
    _C1,
    _C2,
    _O1,
    _O2,
    _P1,
    _P2,
    PICK_EXAMPLES,
    PICK_SYSTEM,
    parse_doc,
    passages_of,
    picked,
    reading_prompt,
)
from masrl.families.qa.search_roles import answer_scores, f1_of, mentions, parse_answer
from masrl.parsing import ParseResult, TagSpec, nonempty, parse_tags
from masrl.trace import Trace
from masrl.workflows.base import state_means
from masrl.workflows.prompting import few_shot

# (passages, the first hop's, the second's, question, bridge, answer): one of each kind of two-hop question,
# in the QA world's style
HOP_CASES = [
    ([_P2, _O1, _P1], _O1, _P1, "In what year was the founder of Quillan Works born?", "Bren Talomar", "1948"),
    ([_O2, _P2, _C2], _P2, _O2, "In which city is the employer of Mira Oskal headquartered?", "Dovren Labs", "Keldra"),
    ([_C1, _P1, _C2], _P1, _C1, "Who is the mayor of the city where Bren Talomar was born?", "Tavesso", "Mira Oskal"),
]

BRIDGE_SYSTEM = ("You read documents to answer a question that takes two steps. Name the person, city or "
                 "organisation the question leads to first in <answer></answer>.")
BRIDGE_EXAMPLES = [(reading_prompt([first], q), f"<answer>{b}</answer>") for _, first, _, q, b, _ in HOP_CASES]
FINAL_SYSTEM = ("You answer a question from documents, told what it leads to. Write only the short answer in "
                "<answer></answer>.")
FINAL_EXAMPLES = [(f"{reading_prompt([second], q)}\nIt leads to: {b}", f"<answer>{a}</answer>")
                  for _, _, second, q, b, a in HOP_CASES]
BRIDGE_PICK_SYSTEM = ("You read documents to answer a question that takes two steps. Below them is the list of "
                      "titles of all documents. Write the number of the title the question leads to first in "
                      "<doc></doc>.")


def titles_prompt(passages: list[str], titles: list[str], question: str) -> str:
    """The picking bridger's prompt: the passages it reads, the question, and every title, numbered."""
    shown = "\n".join(f"{i}. {t}" for i, t in enumerate(titles, 1))
    return f"{reading_prompt(passages, question)}\nTitles:\n{shown}"


BRIDGE_PICK_EXAMPLES = [(titles_prompt([first], [d.partition(":")[0] for d in docs], q),
                         f"<doc>{[d.partition(':')[0] for d in docs].index(b) + 1}</doc>")
                        for docs, first, _, q, b, _ in HOP_CASES]
AGENT_SYSTEM = ("You answer a question that takes two steps from documents: find what the question leads to, "
                "then the answer in that one's document. Write only the short answer in <answer></answer>.")
AGENT_EXAMPLES = [(reading_prompt(docs, q), f"<answer>{a}</answer>") for docs, _, _, q, _, a in HOP_CASES]
AGENT_BRIDGE_SYSTEM = ("You answer a question that takes two steps from documents: name what the question leads to "
                       "in <bridge></bridge>, then write only the short answer in <answer></answer>.")
AGENT_BRIDGE_EXAMPLES = [(reading_prompt(docs, q), f"<bridge>{b}</bridge><answer>{a}</answer>")
                         for docs, _, _, q, b, a in HOP_CASES]


def bridge_of(task: Task) -> str:
    b = (task.meta or {}).get("bridge")
    if not b:
        raise DataError(f"task {task.id}: the two-hop reading workflows need meta.bridge (what the question leads "
                        f"to); the QA world gives it for level-2 questions: set data.train.levels and "
                        f"data.eval.levels to [2]")
    return str(b)


def title_of(passage: str) -> str:
    """A ``Title: text`` passage's title, normalised as answers are."""
    head, sep, _ = passage.partition(":")
    return normalize_answer(head) if sep else ""


def parse_bridge_answer(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("bridge", nonempty), TagSpec("answer", nonempty)])


def bridge_f1(said, bridge: str) -> float:
    return token_f1(str(said), [bridge]) if said else 0.0


class ReadingHops:
    name = "reading_hops"

    def __init__(self, docs_per_reader: int = 8, bridger: str = "name"):
        if docs_per_reader < 1:
            raise ValueError("docs_per_reader must be at least 1")
        if bridger not in ("name", "pick"):
            raise ValueError(f"bridger must be 'name' (write what the question leads to) or 'pick' (choose its "
                             f"title from a numbered list), not {bridger!r}")
        self.docs_per_reader = docs_per_reader
        self.bridger = bridger

    def roles(self) -> dict[str, AgentRole]:
        bridger = (AgentRole("bridger", parse_doc, "picks the title a two-step question leads to", 8, ("</doc>",))
                   if self.bridger == "pick" else
                   AgentRole("bridger", parse_answer, "names what a two-step question leads to", 24, ("</answer>",)))
        return {"reader": AgentRole("reader", parse_doc, "names the passage of a few that a question is about", 8,
                                    ("</doc>",)),
                "bridger": bridger,
                "answerer": AgentRole("answerer", parse_answer, "answers from the passages about the bridge", 24,
                                      ("</answer>",))}

    async def _round(self, ctx, chunks: list[list[str]], question: str, wanted):
        """One reading round: each chunk's pick, and found credit for the readers whose chunk holds a
        passage ``wanted`` accepts."""
        calls = list(await asyncio.gather(*[
            ctx.call("reader", few_shot(PICK_SYSTEM, PICK_EXAMPLES, reading_prompt(c, question))) for c in chunks]))
        picks = [picked(r, c) for r, c in zip(calls, chunks)]
        right = []
        for r, c, p in zip(calls, chunks, picks):
            if any(wanted(x) for x in c):  # a reader whose chunk lacks it gets no credit: its pick cannot matter
                r.credit = float(p is not None and wanted(p))
                right.append(r.credit)
        return [p for p in picks if p is not None], right

    async def run(self, task: Task, ctx) -> None:
        passages, k, bridge = passages_of(task), self.docs_per_reader, bridge_of(task)
        chunks = [passages[i:i + k] for i in range(0, len(passages), k)]
        q, target = f" {normalize_answer(task.question)} ", normalize_answer(bridge)
        first, hop1 = await self._round(ctx, chunks, task.question,
                                        lambda p: bool(title_of(p)) and f" {title_of(p)} " in q)
        if self.bridger == "pick":
            return await self._pick_and_answer(ctx, task, passages, first, hop1, target)
        b = await ctx.call("bridger", few_shot(BRIDGE_SYSTEM, BRIDGE_EXAMPLES, reading_prompt(first, task.question)))
        said = (b.parsed.get("answer") or "").strip()
        b.credit = bridge_f1(said, bridge)
        second, hop2 = await self._round(ctx, chunks, f"What does the document about {said or 'it'} say?",
                                         lambda p: title_of(p) == target)
        ans = await ctx.call("answerer", few_shot(FINAL_SYSTEM, FINAL_EXAMPLES,
                                                  f"{reading_prompt(second, task.question)}\nIt leads to: {said}"))
        answer = ans.parsed.get("answer")
        ans.credit = f1_of(answer, task)
        ctx.finish(answer, hop1=hop1, hop2=hop2, bridge=[b.credit],
                   covered=[float(any(mentions(p, task.answer) for p in second))])

    async def _pick_and_answer(self, ctx, task: Task, passages: list[str], first: list[str], hop1: list[float],
                               target: str) -> None:
        """``bridger: pick``: the bridger chooses the bridge's title among every passage's; the answerer
        reads the passage it chose."""
        titles = [p.partition(":")[0].strip() for p in passages]
        b = await ctx.call("bridger", few_shot(BRIDGE_PICK_SYSTEM, BRIDGE_PICK_EXAMPLES,
                                               titles_prompt(first, titles, task.question)))
        chosen = picked(b, passages)
        b.credit = float(chosen is not None and title_of(chosen) == target)
        said = chosen.partition(":")[0].strip() if chosen is not None else ""
        second = [chosen] if chosen is not None else []
        ans = await ctx.call("answerer", few_shot(FINAL_SYSTEM, FINAL_EXAMPLES,
                                                  f"{reading_prompt(second, task.question)}\nIt leads to: {said}"))
        answer = ans.parsed.get("answer")
        ans.credit = f1_of(answer, task)
        ctx.finish(answer, hop1=hop1, bridge=[b.credit], covered=[float(any(mentions(p, task.answer) for p in second))])

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        out = answer_scores(trace.final_answer, task)
        out |= state_means(trace, {"hop1": "hop1/accuracy", "hop2": "hop2/accuracy", "bridge": "bridge/f1",
                                   "covered": "answerer/covered"})
        return out


class ReadingHopsAgent:
    """The single-agent control: one call reads every passage and answers the two-step question."""

    name = "reading_hops_agent"

    def __init__(self, bridge: bool = False):
        self.bridge = bridge

    def roles(self) -> dict[str, AgentRole]:
        if self.bridge:
            return {"agent": AgentRole("agent", parse_bridge_answer, "names the bridge, then answers", 40,
                                       ("</answer>",))}
        return {"agent": AgentRole("agent", parse_answer, "answers a two-step question from every passage", 24,
                                   ("</answer>",))}

    async def run(self, task: Task, ctx) -> None:
        system, examples = (AGENT_BRIDGE_SYSTEM, AGENT_BRIDGE_EXAMPLES) if self.bridge else (AGENT_SYSTEM, AGENT_EXAMPLES)
        bridge = bridge_of(task) if self.bridge else None
        call = await ctx.call("agent", few_shot(system, examples, reading_prompt(passages_of(task), task.question)))
        answer = call.parsed.get("answer")
        call.credit = f1_of(answer, task)
        state = {}
        if bridge is not None:
            bf = bridge_f1(call.parsed.get("bridge"), bridge)
            call.credit = (call.credit + bf) / 2
            state["bridge"] = [bf]
        ctx.finish(answer, **state)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        out = answer_scores(trace.final_answer, task)
        if trace.state.get("bridge"):
            out["bridge/f1"] = trace.state["bridge"][0]
        return out

"""Reading many documents: a team of readers against one agent that reads them all.

Each task carries its passages in ``meta.context`` (the QA world's ``data.world.context_docs``: the
supporting documents among same-kind distractors, or a file row's ``context``). No search: every
fact needed is in front of the model; the question is whether one small model can find it there.

``reading_team``: the passages split into chunks of ``docs_per_reader``:
reader      <evidence>the sentence that answers</evidence> or <evidence>nothing useful</evidence>,
            one call per chunk, all in parallel
answerer    <answer>text</answer> from the readers' evidence

``readers: select`` instead: each reader names the passage that answers (``<doc>n</doc>`` or
``<doc>none</doc>``) and the answerer reads the named passages whole, so no reader can put words in
a note that its passages do not hold.

``readers: pick``: each reader must name one passage of its chunk (no "none": trained selecting readers
never said it anyway), and the answerer is prompted as the selecting single agent is, over the readers'
picks only: it names one of them, then answers. A selection among all passages split into a selection
within each chunk and one among the chunks' winners. With ``found_credit: true`` a reader whose chunk holds
the answer earns 1 when its pick holds it and 0 when not, and a reader whose chunk lacks it earns no
credit (its pick cannot matter); the selecting agent's option of the same name pays its call the mean of
that and its F1, so both arms get the same check of their selection. ``answer_only: true`` prompts the
answerer as the plain single agent instead (read the picks, write the answer, name none): on the H200
the plain prompt trained faster than the selecting one for the single agent over 24 passages.

``reading_agent`` (the single-agent control): one call that sees every passage and answers; with
``evidence: true`` it is prompted as the team's reader is (copy the sentence, then answer), with
``select: true`` as the selecting team is (name the passage, then answer).

What the team has that the one call lacks is a short context per call: each reader looks for one
name among ``docs_per_reader`` passages instead of all of them. Credit (the ``credit`` reward):
every call earns the final answer's token F1. On the H200 this team collapsed either way (every
reader writing "nothing useful" by step 10, held-out F1 0.000; paying each reader for its own part
instead collapsed faster, since 3 of 4 readers hold nothing) while the one-call agent learned:
docs/results.md. It ships as the measured baseline for the next reading team. With ``verbatim: true``
a reader's evidence reaches the answerer only if it stands word for word in that reader's passages
(``quoted``): untrained readers reword a distractor's sentence around the asked name, and the answerer
answered from those. Metrics: ``f1``/``em``
(``outcome`` is F1); ``reader/accuracy`` (readers whose evidence names the answer, among those whose passages held it),
``reader/quiet`` (readers that wrote "nothing useful" when their passages did not hold it),
``reader/quoted`` (evidence other than "nothing useful" that stands word for word in the reader's
passages), ``answerer/notes`` (notes the answerer was shown),
``answerer/accuracy`` (exact match), ``answerer/chosen`` (with ``readers: pick``: the answerer named a pick that
holds the answer), ``answerer/covered`` (with ``readers: pick``: one of the picks holds it); the agent's
``agent/accuracy`` and, with ``evidence``,
``agent/grounded`` (its evidence names the answer).
"""

from __future__ import annotations

import asyncio
import re

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.errors import DataError
from masrl.families.qa.search_roles import (
    ANSWERER_SYSTEM,
    answer_scores,
    f1_of,
    mentions,
    parse_answer,
    parse_evidence,
)
from masrl.parsing import ParseResult, TagSpec, nonempty, parse_tags
from masrl.trace import Trace
from masrl.workflows.base import state_means
from masrl.workflows.prompting import few_shot, numbered

NOTHING = "nothing useful"
# worked examples in the QA world's style (names that never occur in it); one of each kind of question
_P1 = ("Bren Talomar: Bren Talomar enjoys chess on weekends. Bren Talomar was born in 1948 in Tavesso. "
       "Bren Talomar works for Quillan Works as a chemist.")
_P2 = ("Mira Oskal: Mira Oskal works for Dovren Labs as a painter. Friends describe Mira Oskal as patient and "
       "curious. Mira Oskal was born in 1961 in Keldra.")
_C1 = "Tavesso: The mayor of Tavesso is Mira Oskal. Tavesso is a city in Keshar, founded in 1204."
_C2 = "Keldra: Keldra has about 40000 inhabitants. The mayor of Keldra is Bren Talomar."
_O1 = ("Quillan Works: Quillan Works is a glassmaking company founded in 1911 by Bren Talomar. Quillan Works has "
       "its headquarters in Tavesso.")
_O2 = "Dovren Labs: Dovren Labs has its headquarters in Keldra. The logo of Dovren Labs is teal."
# (passages, question, the sentence that answers, answer)
_CASES = [
    ([_P2, _P1], "In what year was Bren Talomar born?", "Bren Talomar was born in 1948 in Tavesso.", "1948"),
    ([_C1, _C2], "Who is the mayor of Keldra?", "The mayor of Keldra is Bren Talomar.", "Bren Talomar"),
    ([_P1, _P2], "Which organisation does Mira Oskal work for?", "Mira Oskal works for Dovren Labs as a painter.",
     "Dovren Labs"),
    ([_O2, _O1], "In which city does Quillan Works have its headquarters?", "Quillan Works has its headquarters in "
     "Tavesso.", "Tavesso"),
]


def show_passages(passages: list[str]) -> str:
    return "\n".join(f"[{i}] {p}" for i, p in enumerate(passages, 1))


def reading_prompt(passages: list[str], question: str) -> str:
    return f"Documents:\n{show_passages(passages)}\nQuestion: {question}"


READER_SYSTEM = ("You read documents to answer a question. Copy the one sentence that answers it into "
                 f"<evidence></evidence>, or write <evidence>{NOTHING}</evidence> if no document answers it.")
# one passage at a time: the passage that answers, then one of the same kind about someone else (most of a
# team's readers hold no answer)
READER_EXAMPLES = [ex for docs, q, s, _ in _CASES for ex in (
    (reading_prompt([docs[1]], q), f"<evidence>{s}</evidence>"),
    (reading_prompt([docs[0]], q), f"<evidence>{NOTHING}</evidence>"))]
ANSWERER_EXAMPLES = [(f"Question: {q}\nNotes: 1. {s}", f"<answer>{a}</answer>") for _, q, s, a in _CASES[:2]]
AGENT_SYSTEM = "You answer a question from documents. Write only the short answer in <answer></answer>."
AGENT_EXAMPLES = [(reading_prompt(docs, q), f"<answer>{a}</answer>") for docs, q, _, a in _CASES]
AGENT_EVIDENCE_SYSTEM = ("You answer a question from documents. Copy the one sentence that answers it into "
                         "<evidence></evidence>, then write only the short answer in <answer></answer>.")
AGENT_EVIDENCE_EXAMPLES = [(reading_prompt(docs, q), f"<evidence>{s}</evidence><answer>{a}</answer>")
                           for docs, q, s, a in _CASES]


SELECT_SYSTEM = ("You find the document that answers a question. Each document starts with its title: the person, "
                 "city or organisation it is about. Write the number of the document whose title is the one the "
                 "question asks about in <doc></doc>, or <doc>none</doc> if no title is.")


def _alternating(i: int, docs: list[str]) -> tuple[list[str], int]:
    """Case ``i``'s passages with the answering one (``docs[1]``) second for even ``i``, first for odd, and
    its number: worked examples where no position is always right."""
    return (docs, 2) if i % 2 == 0 else (docs[::-1], 1)


# the answering passage second, first, then alone among others: no position is always right
SELECT_EXAMPLES = [(reading_prompt(shown, q), f"<doc>{n}</doc>")
                   for i, (docs, q, _, _) in enumerate(_CASES) for shown, n in [_alternating(i, docs)]]
SELECT_EXAMPLES += [(reading_prompt([docs[0]], q), "<doc>none</doc>") for docs, q, _, _ in _CASES[::2]]
PICK_SYSTEM = ("You find the document that answers a question. Each document starts with its title: the person, "
               "city or organisation it is about. Write the number of the document whose title is the one the "
               "question asks about in <doc></doc>; if none is, the closest.")
PICK_EXAMPLES = SELECT_EXAMPLES[:len(_CASES)]  # the selecting reader's, without the "none" ones
# the answerer of selected passages: one passage, then the answering one beside another
ANSWERER_PASSAGE_EXAMPLES = [
    (f"Question: {_CASES[0][1]}\nNotes: 1. {_CASES[0][0][1]}", f"<answer>{_CASES[0][3]}</answer>"),
    (f"Question: {_CASES[1][1]}\nNotes: {numbered(_CASES[1][0])}", f"<answer>{_CASES[1][3]}</answer>"),
]
AGENT_SELECT_SYSTEM = ("You answer a question from documents. Each document starts with its title: the person, city or "
                       "organisation it is about. Write the number of the document whose title is the one the question "
                       "asks about in <doc></doc>, then only the short answer in <answer></answer>.")
AGENT_SELECT_EXAMPLES = [(reading_prompt(shown, q), f"<doc>{n}</doc><answer>{a}</answer>")
                         for i, (docs, q, _, a) in enumerate(_CASES) for shown, n in [_alternating(i, docs)]]


def _doc_number(s: str) -> bool:
    return s.strip().lower() == "none" or s.strip().isdigit()


def parse_doc(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("doc", _doc_number)])


def parse_doc_answer(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("doc", _doc_number), TagSpec("answer", nonempty)])


def picked(call, chunk: list[str]) -> str | None:
    """The passage of ``chunk`` a ``<doc>n</doc>`` reply names (1-based), or None."""
    n = (call.parsed.get("doc") or "").strip()
    return chunk[int(n) - 1] if n.isdigit() and 1 <= int(n) <= len(chunk) else None


def parse_evidence_answer(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("evidence", nonempty), TagSpec("answer", nonempty)])


def passages_of(task: Task) -> list[str]:
    """The task's passages: ``meta.context`` as a list, or text split at blank lines."""
    ctx = (task.meta or {}).get("context")
    if isinstance(ctx, str):
        ctx = [p.strip() for p in re.split(r"\n\s*\n", ctx) if p.strip()]
    if not ctx:
        raise DataError(f"task {task.id}: the reading workflows need its passages in meta.context; for the QA world "
                        f"set data.world.context_docs (e.g. 8), for a file give each row a `context` (a list of "
                        f"passages, or text with passages separated by blank lines)")
    return [str(p) for p in ctx]


def _squash(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def quoted(evidence: str, passages: list[str]) -> bool:
    """Whether ``evidence`` stands word for word in one of ``passages`` (case, spacing and punctuation aside)."""
    words = _squash(evidence)
    return bool(words) and any(f" {words} " in f" {_squash(p)} " for p in passages)


class ReadingTeam:
    name = "reading_team"

    def __init__(self, docs_per_reader: int = 2, verbatim: bool = False, readers: str = "quote",
                 found_credit: bool = False, answer_only: bool = False):
        if docs_per_reader < 1:
            raise ValueError("docs_per_reader must be at least 1")
        if readers not in ("quote", "select", "pick"):
            raise ValueError(f"readers must be 'quote' (copy the sentence), 'select' (name the passage or none) or "
                             f"'pick' (name one passage; the answerer picks among the picks), not {readers!r}")
        if found_credit and readers == "quote":
            raise ValueError("found_credit pays a reader for the passage it names: use it with readers: select or pick")
        if answer_only and readers != "pick":
            raise ValueError("answer_only prompts the answerer of readers: pick as the plain single agent (answer, "
                             "no choice among the picks): set readers: pick, or drop answer_only")
        self.docs_per_reader = docs_per_reader
        self.verbatim = verbatim
        self.readers = readers
        self.select = readers != "quote"
        self.found_credit = found_credit
        self.answer_only = answer_only  # pick: the answerer reads the picks and answers, naming none

    def roles(self) -> dict[str, AgentRole]:
        reader = (AgentRole("reader", parse_doc, "names the passage that answers, among a few", 8, ("</doc>",))
                  if self.select else
                  AgentRole("reader", parse_evidence, "copies the sentence that answers, from a few passages", 48,
                            ("</evidence>",)))
        answerer = (AgentRole("answerer", parse_doc_answer, "names one of the readers' picks, then answers", 32,
                              ("</answer>",)) if self.readers == "pick" and not self.answer_only else
                    AgentRole("answerer", parse_answer, "answers from the readers' evidence", 24, ("</answer>",)))
        return {"reader": reader, "answerer": answerer}

    def _prompts(self):
        """(reader system, reader examples) for this kind of reader."""
        if self.readers == "pick":
            return PICK_SYSTEM, PICK_EXAMPLES
        return (SELECT_SYSTEM, SELECT_EXAMPLES) if self.select else (READER_SYSTEM, READER_EXAMPLES)

    def _answer(self, ctx, notes: list[str], task: Task):
        if self.answer_only:  # the plain single agent's prompt, over the picks
            return ctx.call("answerer", few_shot(AGENT_SYSTEM, AGENT_EXAMPLES, reading_prompt(notes, task.question)))
        if self.readers == "pick":  # the selecting agent's prompt, over the picks
            return ctx.call("answerer", few_shot(AGENT_SELECT_SYSTEM, AGENT_SELECT_EXAMPLES,
                                                 reading_prompt(notes, task.question)))
        return ctx.call("answerer", few_shot(ANSWERER_SYSTEM,
                                             ANSWERER_PASSAGE_EXAMPLES if self.select else ANSWERER_EXAMPLES,
                                             f"Question: {task.question}\nNotes: {numbered(notes)}"))

    async def run(self, task: Task, ctx) -> None:
        passages, k = passages_of(task), self.docs_per_reader
        chunks = [passages[i:i + k] for i in range(0, len(passages), k)]
        system, examples = self._prompts()
        readers = list(await asyncio.gather(*[
            ctx.call("reader", few_shot(system, examples, reading_prompt(c, task.question))) for c in chunks]))
        held = [mentions(" ".join(c), task.answer) for c in chunks]  # whose passages hold the answer
        notes, state = (self._selected if self.select else self._quoted)(readers, chunks, held, task)
        ans = await self._answer(ctx, notes, task)
        answer = ans.parsed.get("answer")
        f1 = f1_of(answer, task)
        ans.credit = f1
        found = iter(state["grounded"])  # found credit: each holding reader's pick, as the metric scored it
        for r, h in zip(readers, held):
            if not self.found_credit:
                r.credit = f1
            elif h:  # a reader whose chunk lacks the answer gets no credit: its pick cannot matter
                r.credit = next(found)
        if self.readers == "pick":  # the answer was in one of the answerer's passages: the team's ceiling
            state["covered"] = [float(any(mentions(p, task.answer) for p in notes))]
            if not self.answer_only:
                p = picked(ans, notes)
                state["chosen"] = [float(p is not None and mentions(p, task.answer))]
        ctx.finish(answer, notes=float(len(notes)), **state)

    def _quoted(self, readers, chunks, held, task):
        """Evidence sentences (``readers: quote``), quotes only with ``verbatim``; and the readers' metrics."""
        evidence = [(r.parsed.get("evidence") or "").strip() for r in readers]
        said = [(e, c) for e, c in zip(evidence, chunks) if e and NOTHING not in e.lower()]
        notes = [e for e, c in said if not self.verbatim or quoted(e, c)]
        return notes, {"grounded": [float(mentions(e, task.answer)) for e, h in zip(evidence, held) if h],
                       "quiet": [float(NOTHING in e.lower()) for e, h in zip(evidence, held) if not h],
                       "quoted": [float(quoted(e, c)) for e, c in said]}

    def _selected(self, readers, chunks, held, task):
        """The passages the readers named (``readers: select``), whole; and the readers' metrics."""
        picks = [picked(r, c) for r, c in zip(readers, chunks)]
        state = {"grounded": [float(p is not None and mentions(p, task.answer)) for p, h in zip(picks, held) if h]}
        if self.readers == "select":  # a picking reader has no "none" to say: no quiet rate for it
            state["quiet"] = [float((r.parsed.get("doc") or "").strip().lower() == "none")
                              for r, h in zip(readers, held) if not h]
        return [p for p in picks if p is not None], state

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        out = answer_scores(trace.final_answer, task)
        out["answerer/accuracy"] = out["em"]
        out |= state_means(trace, {"grounded": "reader/accuracy", "quiet": "reader/quiet", "quoted": "reader/quoted",
                                   "chosen": "answerer/chosen", "covered": "answerer/covered"})
        if trace.state.get("notes") is not None:
            out["answerer/notes"] = trace.state["notes"]
        return out


class ReadingAgent:
    """The single-agent control: one call reads every passage and answers."""

    name = "reading_agent"

    def __init__(self, evidence: bool = False, select: bool = False, found_credit: bool = False):
        if evidence and select:
            raise ValueError("reading_agent: choose evidence (copy the sentence) or select (name the passage), not both")
        if found_credit and not select:
            raise ValueError("reading_agent: found_credit pays the passage the call names; set select: true too")
        self.evidence = evidence
        self.select = select
        self.found_credit = found_credit

    def roles(self) -> dict[str, AgentRole]:
        if self.select:
            return {"agent": AgentRole("agent", parse_doc_answer, "names the passage that answers, then answers", 32,
                                       ("</answer>",))}
        if self.evidence:
            return {"agent": AgentRole("agent", parse_evidence_answer, "copies the sentence that answers, then answers",
                                       72, ("</answer>",))}
        return {"agent": AgentRole("agent", parse_answer, "answers from every passage", 24, ("</answer>",))}

    async def run(self, task: Task, ctx) -> None:
        system, examples = ((AGENT_SELECT_SYSTEM, AGENT_SELECT_EXAMPLES) if self.select
                            else (AGENT_EVIDENCE_SYSTEM, AGENT_EVIDENCE_EXAMPLES) if self.evidence
                            else (AGENT_SYSTEM, AGENT_EXAMPLES))
        passages = passages_of(task)
        call = await ctx.call("agent", few_shot(system, examples, reading_prompt(passages, task.question)))
        answer = call.parsed.get("answer")
        call.credit = f1_of(answer, task)
        grounded = None
        if self.evidence:
            grounded = float(mentions(call.parsed.get("evidence") or "", task.answer))
        elif self.select:
            p = picked(call, passages)
            grounded = float(p is not None and mentions(p, task.answer))
            if self.found_credit:
                call.credit = (call.credit + grounded) / 2
        ctx.finish(answer, grounded=grounded)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        out = answer_scores(trace.final_answer, task)
        out["agent/accuracy"] = out["em"]
        if trace.state.get("grounded") is not None:
            out["agent/grounded"] = trace.state["grounded"]
        return out

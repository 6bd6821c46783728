"""The iterative search team, and the single search agent to compare it with.

planner     <subquestions>q1 | q2</subquestions><answer>first guess</answer>
answerer    <answer>text</answer>                          (after the plan, then after every search turn)
then per turn (up to ``max_turns``):
searcher    <query>text</query>, or <stop></stop>          -> the ``search`` tool (the retriever)
summarizer  <evidence>facts from the results</evidence>    ("nothing useful" when there are none)
updater     <subquestion>k</subquestion>                   (which sub-question the evidence answers; 0: none)
answerer    <answer>text</answer>

What the team has that one model call lacks: retrieved documents, read by an agent that only
summarises them, and notes that say which part of the question each piece answers.

Credit (paid by the ``credit`` reward), as token F1 against the gold answers: the planner earns
the final answer's F1; each answerer call the F1 of the answer it wrote; the searcher, summarizer
and updater of a turn earn the change in F1 of the answer written after their turn (a searcher
that stops earns 0). Metrics: ``f1`` and ``em`` of the final answer (``outcome`` is F1), ``turns``,
and per agent: ``planner/accuracy`` (its first guess's F1), ``searcher/hit_rate`` (searches that
found a supporting document), ``summarizer/accuracy`` (turns whose evidence names the answer when
the results held it), ``updater/gain`` and ``answerer/accuracy`` (final EM).

``SearchAgent`` is the single-agent baseline: one model that calls ``search`` itself (model-issued
tool calls, ``tools.calls``) and answers, in at most ``max_calls`` calls.
"""

from __future__ import annotations

import re

from masrl.agents import AgentRole
from masrl.data.qa_scoring import exact_match, normalize_answer, token_f1
from masrl.data.tasks import Task
from masrl.parsing import ParseResult, TagSpec, nonempty, parse_tags
from masrl.tools.base import Tool
from masrl.tools.calls import parse_tool_calls
from masrl.tools.search import search_tools, show_docs
from masrl.trace import Trace
from masrl.workflows.math_prompts import few_shot

Q1 = "In what year was the founder of Quillan Works born?"
Q2 = "Who is the mayor of Tavesso?"
DOC1 = ("[1] Quillan Works: Quillan Works is a glassmaking company founded in 1911 by Bren Talomar. "
        "Quillan Works has its headquarters in Tavesso.")
DOC2 = "[1] Bren Talomar: Bren Talomar was born in 1948 in Ostrava. Bren Talomar enjoys chess on weekends."
DOC3 = "[1] Tavesso: The mayor of Tavesso is Mira Oskal. Tavesso is a city in Keshar, founded in 1204."

PLANNER_SYSTEM = ("You plan how to answer a question by searching documents. Write the sub-questions in "
                  "<subquestions></subquestions>, separated by |, then your best first guess in <answer></answer>.")
PLANNER_EXAMPLES = [
    (f"Question: {Q1}", "<subquestions>Who founded Quillan Works? | In what year was that person born?</subquestions>"
                        "<answer>unknown</answer>"),
    (f"Question: {Q2}", "<subquestions>Who is the mayor of Tavesso?</subquestions><answer>unknown</answer>"),
]
SEARCHER_SYSTEM = ("You search a document collection to answer a question. Write one short search query in "
                   "<query></query>, or <stop></stop> when the notes already answer the question.")
SEARCHER_EXAMPLES = [
    (f"Question: {Q1}\nSub-questions: 1. Who founded Quillan Works? 2. In what year was that person born?\n"
     "Notes: none", "<query>Quillan Works founder</query>"),
    (f"Question: {Q1}\nSub-questions: 1. Who founded Quillan Works? 2. In what year was that person born?\n"
     "Notes: 1. Quillan Works was founded by Bren Talomar.", "<query>Bren Talomar born</query>"),
]
SUMMARIZER_SYSTEM = ("You read search results. Copy the facts that help answer the question into "
                     "<evidence></evidence>, or write <evidence>nothing useful</evidence>.")
SUMMARIZER_EXAMPLES = [
    (f"Question: {Q1}\nSearch: Quillan Works founder\nResults:\n{DOC1}",
     "<evidence>Quillan Works was founded in 1911 by Bren Talomar.</evidence>"),
    (f"Question: {Q2}\nSearch: Tavesso mayor\nResults:\n{DOC3}", "<evidence>The mayor of Tavesso is Mira Oskal."
                                                                 "</evidence>"),
]
UPDATER_SYSTEM = ("You file a piece of evidence under the sub-question it answers. Reply with the sub-question's "
                  "number in <subquestion></subquestion>, or 0 if it answers none.")
UPDATER_EXAMPLES = [
    ("Sub-questions: 1. Who founded Quillan Works? 2. In what year was that person born?\n"
     "Evidence: Bren Talomar was born in 1948 in Ostrava.", "<subquestion>2</subquestion>"),
    ("Sub-questions: 1. Who is the mayor of Tavesso?\nEvidence: The mayor of Tavesso is Mira Oskal.",
     "<subquestion>1</subquestion>"),
]
ANSWERER_SYSTEM = "You answer a question from notes. Write only the short answer in <answer></answer>."
ANSWERER_EXAMPLES = [
    (f"Question: {Q1}\nNotes: 1. Quillan Works was founded in 1911 by Bren Talomar. 2. Bren Talomar was born in "
     "1948 in Ostrava.\nDraft answer: unknown", "<answer>1948</answer>"),
    (f"Question: {Q2}\nNotes: 1. The mayor of Tavesso is Mira Oskal.\nDraft answer: unknown",
     "<answer>Mira Oskal</answer>"),
]


def parse_plan(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("subquestions", nonempty), TagSpec("answer", nonempty)])


def parse_answer(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("answer", nonempty)])


def parse_query(text: str) -> ParseResult:
    """``<query>...</query>`` or ``<stop></stop>`` (or ``<stop/>``); field ``stop`` = "1" when stopping.
    A near-miss (no tags) is read leniently as a query of its first line, scored as a format failure:
    only an explicit stop (or nothing at all) ends the search."""
    if re.search(r"<stop\s*/?>", text) and "<query>" not in text:
        outside = re.sub(r"<stop\s*/?>(\s*</stop>)?", "", text).strip()
        return ParseResult(not outside, 1.0 if not outside else 0.5, {"stop": "1"}, [] if not outside else
                           ["text outside <stop></stop>"])
    res = parse_tags(text, [TagSpec("query", nonempty)])
    if not res.fields.get("query"):
        line = next((ln for ln in re.sub(r"</?\w+>", " ", text).splitlines() if ln.strip()), "").strip()[:200]
        if line:
            res.fields["query"] = line
    return res


def parse_evidence(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("evidence", nonempty)])


def parse_subquestion(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("subquestion", lambda s: s.strip().isdigit())])


def split_subquestions(text: str | None) -> list[str]:
    return [s.strip() for s in re.split(r"\s*\|\s*|\n+", text or "") if s.strip()][:4]


def numbered(items: list[str]) -> str:
    return " ".join(f"{i}. {s}" for i, s in enumerate(items, 1)) or "none"


def f1_of(answer, task: Task) -> float:
    return token_f1(str(answer), task.answer) if answer else 0.0


def _mentions(text: str, golds) -> bool:
    t = f" {normalize_answer(text)} "
    return any(normalize_answer(g) and f" {normalize_answer(g)} " in t for g in golds)


class SearchTeam:
    name = "search_team"

    def __init__(self, max_turns: int = 2):
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.max_turns = max_turns

    def roles(self) -> dict[str, AgentRole]:
        return {
            "planner": AgentRole("planner", parse_plan, "drafts sub-questions and a first answer", 64, ("</answer>",)),
            "searcher": AgentRole("searcher", parse_query, "writes one search query, or stops", 24,
                                  ("</query>", "</stop>")),
            "summarizer": AgentRole("summarizer", parse_evidence, "copies the useful facts from the results", 64,
                                    ("</evidence>",)),
            "updater": AgentRole("updater", parse_subquestion, "files the evidence under a sub-question", 12,
                                 ("</subquestion>",)),
            "answerer": AgentRole("answerer", parse_answer, "answers from the notes", 24, ("</answer>",)),
        }

    def tools(self, services) -> dict[str, Tool]:
        return {"search": search_tools(services)["search"]}

    async def run(self, task: Task, ctx) -> None:
        q = task.question
        planner = await ctx.call("planner", few_shot(PLANNER_SYSTEM, PLANNER_EXAMPLES, f"Question: {q}"))
        subqs = split_subquestions(planner.parsed.get("subquestions")) or [q]
        draft = planner.parsed.get("answer") or "unknown"
        notes: list[str] = []

        async def answer():
            body = f"Question: {q}\nNotes: {numbered(notes)}\nDraft answer: {draft}"
            call = await ctx.call("answerer", few_shot(ANSWERER_SYSTEM, ANSWERER_EXAMPLES, body))
            text = call.parsed.get("answer")
            call.credit = call.turn_score = f1_of(text, task)
            return call, text

        ans_call, final = await answer()
        f1s, queries, hits, grounded, gains = [ans_call.credit], [], [], [], []
        supporting = set(task.meta.get("supporting") or ())
        for _ in range(self.max_turns):
            body = (f"Question: {q}\nSub-questions: {numbered(subqs)}\nNotes: {numbered(notes)}"
                    + (f"\nEarlier searches: {'; '.join(queries)}" if queries else ""))
            searcher = await ctx.call("searcher", few_shot(SEARCHER_SYSTEM, SEARCHER_EXAMPLES, body))
            query = searcher.parsed.get("query")
            searcher.credit = 0.0
            if not query:  # stopped (or wrote no query)
                break
            queries.append(query)
            res = await ctx.tool("search", query=query)
            docs = res.value if res.ok else []
            hits.append(float(bool(supporting & {str(d.get("id")) for d in docs})))
            shown = show_docs(docs) if res.ok else f"(search failed: {res.error})"
            summ = await ctx.call("summarizer", few_shot(SUMMARIZER_SYSTEM, SUMMARIZER_EXAMPLES,
                                                         f"Question: {q}\nSearch: {query}\nResults:\n{shown}"))
            evidence = summ.parsed.get("evidence") or ""
            if docs and _mentions(" ".join(str(d.get("contents", "")) for d in docs), task.answer):
                grounded.append(float(_mentions(evidence, task.answer)))
            upd = await ctx.call("updater", few_shot(UPDATER_SYSTEM, UPDATER_EXAMPLES,
                                                     f"Sub-questions: {numbered(subqs)}\nEvidence: {evidence}"))
            k = int(upd.parsed["subquestion"]) if upd.parsed.get("subquestion", "").strip().isdigit() else 0
            if evidence and "nothing useful" not in evidence.lower():
                notes.append(f"(for {k}) {evidence}" if 1 <= k <= len(subqs) else evidence)
            ans_call, final = await answer()
            gain = ans_call.credit - f1s[-1]
            searcher.credit = summ.credit = upd.credit = gain
            gains.append(gain)
            f1s.append(ans_call.credit)
        planner.credit = f1s[-1]
        planner.turn_score = f1_of(planner.parsed.get("answer"), task)
        ctx.finish(final, f1s=f1s, hits=hits, grounded=grounded, gains=gains, draft_f1=planner.turn_score)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        s = trace.state
        f1 = (s.get("f1s") or [0.0])[-1]
        em = exact_match(str(trace.final_answer), task.answer) if trace.final_answer else 0.0
        out = {"outcome": f1, "f1": f1, "em": em, "turns": float(len(s.get("gains") or [])),
               "planner/accuracy": s.get("draft_f1", 0.0), "answerer/accuracy": em}
        if s.get("hits"):
            out["searcher/hit_rate"] = sum(s["hits"]) / len(s["hits"])
        if s.get("grounded"):
            out["summarizer/accuracy"] = sum(s["grounded"]) / len(s["grounded"])
        if s.get("gains"):
            out["updater/gain"] = sum(s["gains"]) / len(s["gains"])
        return out


AGENT_SYSTEM = ("You answer questions about people, cities and organisations by searching a document collection. "
                "Search until you know the answer, then write only the short answer in <answer></answer>.")
AGENT_EXAMPLE = [
    {"role": "user", "content": "Question: In what year was Bren Talomar born?"},
    {"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": {"query": "Bren Talomar born"}}</tool_call>'},
    {"role": "tool", "content": DOC2},
    {"role": "assistant", "content": "<answer>1948</answer>"},
    {"role": "user", "content": f"Question: {Q2}"},
    {"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": {"query": "Tavesso mayor"}}</tool_call>'},
    {"role": "tool", "content": DOC3},
    {"role": "assistant", "content": "<answer>Mira Oskal</answer>"},
]


def parse_agent(text: str) -> ParseResult:
    """A turn of the search agent: one well-formed tool call, or an answer."""
    calls = parse_tool_calls(text)
    if calls.calls or calls.errors:
        ok = len(calls.calls) == 1 and not calls.errors and not calls.text
        fields = {"tool": calls.calls[0][0], "query": str(calls.calls[0][1].get("query", ""))} if calls.calls else {}
        return ParseResult(ok, 1.0 if ok else 0.5 if calls.calls else 0.0, fields, calls.errors)
    return parse_answer(text)


class SearchAgent:
    """Single-agent baseline: one model searches with its own tool calls and answers."""

    name = "search_agent"

    def __init__(self, max_calls: int = 3):
        if max_calls < 1:
            raise ValueError("max_calls must be at least 1")
        self.max_calls = max_calls

    def roles(self) -> dict[str, AgentRole]:
        return {"agent": AgentRole("agent", parse_agent, "searches with tool calls, then answers", 48,
                                   ("</answer>", "</tool_call>"))}

    def tools(self, services) -> dict[str, Tool]:
        return {"search": search_tools(services)["search"]}

    async def run(self, task: Task, ctx) -> None:
        messages = [{"role": "system", "content": AGENT_SYSTEM}, *AGENT_EXAMPLE,
                    {"role": "user", "content": f"Question: {task.question}"}]
        supporting = set(task.meta.get("supporting") or ())
        final, calls, hits = None, [], []
        for i in range(self.max_calls):
            call = await ctx.call("agent", [dict(m) for m in messages], tools=["search"], turn=i)
            calls.append(call)
            if "answer" in call.parsed:
                final = call.parsed["answer"]
                break
            parsed = parse_tool_calls(call.completion)
            messages.append({"role": "assistant", "content": call.completion})
            if not parsed.calls:
                break  # neither an answer nor a tool call: the episode ends without an answer
            name, args = parsed.calls[0]
            res = await ctx.model_tool(name, args)
            if res.ok and name == "search":
                hits.append(float(bool(supporting & {str(d.get("id")) for d in res.value})))
            messages.append({"role": "tool", "content": show_docs(res.value) if res.ok else f"error: {res.error}"})
        f1 = f1_of(final, task)
        for c in calls:
            c.credit = f1
        ctx.finish(final, f1=f1, hits=hits)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        s = trace.state
        f1 = s.get("f1", 0.0)
        em = exact_match(str(trace.final_answer), task.answer) if trace.final_answer else 0.0
        out = {"outcome": f1, "f1": f1, "em": em, "agent/accuracy": em, "answered": float(trace.final_answer is not None)}
        if s.get("hits"):
            out["agent/hit_rate"] = sum(s["hits"]) / len(s["hits"])
        return out

"""The search roles' prompts, parsers and scores, shared by the search team, the single search agent and RAG."""

from __future__ import annotations

import re

from masrl.data.qa_scoring import exact_match, normalize_answer, token_f1
from masrl.data.tasks import Task
from masrl.parsing import ParseResult, TagSpec, nonempty, parse_tags
from masrl.tools.calls import parse_tool_calls

Q1 = "In what year was the founder of Quillan Works born?"
Q2 = "Who is the mayor of Tavesso?"
DOC1 = ("[1] Quillan Works: Quillan Works is a glassmaking company founded in 1911 by Bren Talomar. "
        "Quillan Works has its headquarters in Tavesso.")
DOC2 = "[1] Bren Talomar: Bren Talomar was born in 1948 in Ostrava. Bren Talomar enjoys chess on weekends."
DOC3 = "[1] Tavesso: The mayor of Tavesso is Mira Oskal. Tavesso is a city in Keshar, founded in 1204."
DOC4 = "[1] Mira Oskal: Mira Oskal was born in 1961 in Tavesso. Mira Oskal works for Quillan Works."

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


def f1_of(answer, task: Task) -> float:
    return token_f1(str(answer), task.answer) if answer else 0.0


def answer_scores(answer, task: Task) -> dict[str, float]:
    """A final answer's ``f1`` and ``em`` against the gold answers; ``outcome`` is the F1."""
    f1 = f1_of(answer, task)
    return {"outcome": f1, "f1": f1, "em": exact_match(str(answer), task.answer) if answer else 0.0}


def mentions(text: str, golds) -> bool:
    t = f" {normalize_answer(text)} "
    return any(normalize_answer(g) and f" {normalize_answer(g)} " in t for g in golds)


AGENT_SYSTEM = ("You answer questions about people, cities and organisations by searching a document collection. "
                "Search until you know the answer, then write only the short answer in <answer></answer>.")
# one worked example of each kind of one-hop question the world asks (birth year, mayor, employer,
# headquarters): with only the first two, the untrained agent answered a year or a name to everything
# (held-out F1 0.000 on this CPU against 0.129 with all four; docs/results.md)
AGENT_EXAMPLE = [
    {"role": "user", "content": "Question: In what year was Bren Talomar born?"},
    {"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": {"query": "Bren Talomar born"}}</tool_call>'},
    {"role": "tool", "content": DOC2},
    {"role": "assistant", "content": "<answer>1948</answer>"},
    {"role": "user", "content": f"Question: {Q2}"},
    {"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": {"query": "Tavesso mayor"}}</tool_call>'},
    {"role": "tool", "content": DOC3},
    {"role": "assistant", "content": "<answer>Mira Oskal</answer>"},
    {"role": "user", "content": "Question: Which organisation does Mira Oskal work for?"},
    {"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": {"query": "Mira Oskal works for"}}</tool_call>'},
    {"role": "tool", "content": DOC4},
    {"role": "assistant", "content": "<answer>Quillan Works</answer>"},
    {"role": "user", "content": "Question: In which city does Quillan Works have its headquarters?"},
    {"role": "assistant",
     "content": '<tool_call>{"name": "search", "arguments": {"query": "Quillan Works headquarters"}}</tool_call>'},
    {"role": "tool", "content": DOC1},
    {"role": "assistant", "content": "<answer>Tavesso</answer>"},
]
# a question that takes two searches (level 2): the employer first, then its headquarters
# (``search_agent``'s option ``two_hop_example``; the team's workflow fixes that order itself)
AGENT_TWO_HOP_EXAMPLE = [
    {"role": "user", "content": "Question: In which city is the employer of Mira Oskal headquartered?"},
    {"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": {"query": "Mira Oskal works for"}}</tool_call>'},
    {"role": "tool", "content": DOC4},
    {"role": "assistant",
     "content": '<tool_call>{"name": "search", "arguments": {"query": "Quillan Works headquarters"}}</tool_call>'},
    {"role": "tool", "content": DOC1},
    {"role": "assistant", "content": "<answer>Tavesso</answer>"},
]


def parse_agent(text: str) -> ParseResult:
    """A turn of the search agent: one well-formed tool call, or an answer."""
    calls = parse_tool_calls(text)
    if calls.calls or calls.errors:
        ok = len(calls.calls) == 1 and not calls.errors and not calls.text
        fields = {"tool": calls.calls[0][0], "query": str(calls.calls[0][1].get("query", ""))} if calls.calls else {}
        return ParseResult(ok, 1.0 if ok else 0.5 if calls.calls else 0.0, fields, calls.errors)
    return parse_answer(text)

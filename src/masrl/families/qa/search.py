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

from masrl.agents import AgentRole
from masrl.data.qa_scoring import exact_match
from masrl.data.tasks import Task
from masrl.families.qa.search_roles import (
    AGENT_EXAMPLE,
    AGENT_SYSTEM,
    AGENT_TWO_HOP_EXAMPLE,
    ANSWERER_EXAMPLES,
    ANSWERER_SYSTEM,
    PLANNER_EXAMPLES,
    PLANNER_SYSTEM,
    SEARCHER_EXAMPLES,
    SEARCHER_SYSTEM,
    SUMMARIZER_EXAMPLES,
    SUMMARIZER_SYSTEM,
    UPDATER_EXAMPLES,
    UPDATER_SYSTEM,
    f1_of,
    mentions,
    parse_agent,
    parse_answer,
    parse_evidence,
    parse_plan,
    parse_query,
    parse_subquestion,
    split_subquestions,
)
from masrl.tools.base import Tool
from masrl.tools.calls import parse_tool_calls
from masrl.tools.search import search_tools, show_docs
from masrl.trace import Trace
from masrl.workflows.prompting import few_shot, numbered


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
            if docs and mentions(" ".join(str(d.get("contents", "")) for d in docs), task.answer):
                grounded.append(float(mentions(evidence, task.answer)))
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


class SearchAgent:
    """Single-agent baseline: one model searches with its own tool calls and answers."""

    name = "search_agent"

    def __init__(self, max_calls: int = 3, two_hop_example: bool = False):
        """``two_hop_example``: the prompt also shows a question answered with two searches (for
        level-2 questions; give it ``max_calls`` of at least 3)."""
        if max_calls < 1:
            raise ValueError("max_calls must be at least 1")
        self.max_calls = max_calls
        self.examples = [*AGENT_EXAMPLE, *(AGENT_TWO_HOP_EXAMPLE if two_hop_example else [])]

    def roles(self) -> dict[str, AgentRole]:
        return {"agent": AgentRole("agent", parse_agent, "searches with tool calls, then answers", 48,
                                   ("</answer>", "</tool_call>"))}

    def tools(self, services) -> dict[str, Tool]:
        return {"search": search_tools(services)["search"]}

    async def run(self, task: Task, ctx) -> None:
        messages = [{"role": "system", "content": AGENT_SYSTEM}, *self.examples,
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

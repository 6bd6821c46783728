"""Decompose-retrieve-answer RAG.

decomposer       {"queries": ["q1", "q2"]}                    (JSON; at most ``max_queries`` are searched)
retrieval        every sub-query in one ``search_many`` request (the retriever batches them)
evidence_writer  <evidence>facts</evidence>, one call per sub-query, all in parallel
answerer         <answer>text</answer>

The same workflow ships as a graph (``qa/graphs/rag.yaml``, ``workflow: {name: graph}``);
on the same seed both give the same traces (``tests/unit/test_graph.py``). Rewards come from
config: the ``outcome`` reward gives the answer's F1 in full to every call, or, with
``options: {split: true}``, divided evenly among the trace's calls.

Metrics: ``f1``/``em`` of the answer (``outcome`` is F1); per agent ``decomposer/hit_rate``
(share of the supporting documents that some sub-query retrieved), ``evidence_writer/accuracy``
(writers whose evidence names the answer, among those whose results held it) and
``answerer/accuracy`` (exact match).
"""

from __future__ import annotations

import asyncio

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.families.qa.search_roles import (
    ANSWERER_SYSTEM,
    Q1,
    Q2,
    SUMMARIZER_EXAMPLES,
    SUMMARIZER_SYSTEM,
    answer_scores,
    mentions,
    parse_answer,
    parse_evidence,
)
from masrl.parsing import ParseResult, parse_json_key
from masrl.tools.base import Tool
from masrl.tools.search import search_tools, show_docs
from masrl.trace import Trace
from masrl.workflows.prompting import few_shot, numbered

DECOMPOSER_SYSTEM = ('You split a question into short search queries. Reply with JSON only: {"queries": [...]}, '
                     "one to three queries.")
DECOMPOSER_EXAMPLES = [
    (f"Question: {Q1}", '{"queries": ["Quillan Works founder", "Bren Talomar born"]}'),
    (f"Question: {Q2}", '{"queries": ["Tavesso mayor"]}'),
]
ANSWERER_EXAMPLES = [
    (f"Question: {Q1}\nNotes: 1. Quillan Works was founded in 1911 by Bren Talomar. 2. Bren Talomar was born in "
     "1948 in Ostrava.", "<answer>1948</answer>"),
    (f"Question: {Q2}\nNotes: 1. The mayor of Tavesso is Mira Oskal.", "<answer>Mira Oskal</answer>"),
]


def parse_queries(text: str) -> ParseResult:
    return parse_json_key(text, "queries")


class RAG:
    name = "rag"

    def __init__(self, max_queries: int = 3):
        if max_queries < 1:
            raise ValueError("max_queries must be at least 1")
        self.max_queries = max_queries

    def roles(self) -> dict[str, AgentRole]:
        return {
            "decomposer": AgentRole("decomposer", parse_queries, "splits the question into search queries", 48,
                                    ("]}",)),
            "evidence_writer": AgentRole("evidence_writer", parse_evidence, "writes the evidence one query found",
                                         64, ("</evidence>",)),
            "answerer": AgentRole("answerer", parse_answer, "answers from the evidence", 24, ("</answer>",)),
        }

    def tools(self, services) -> dict[str, Tool]:
        return {"search_many": search_tools(services)["search_many"]}

    async def run(self, task: Task, ctx) -> None:
        q = task.question
        dec = await ctx.call("decomposer", few_shot(DECOMPOSER_SYSTEM, DECOMPOSER_EXAMPLES, f"Question: {q}"))
        queries = (dec.parsed.get("queries") or [q])[: self.max_queries]
        res = await ctx.tool("search_many", queries=queries)
        results = res.value if res.ok else [[] for _ in queries]
        writers = [ctx.call("evidence_writer", few_shot(SUMMARIZER_SYSTEM, SUMMARIZER_EXAMPLES,
                                                        f"Question: {q}\nSearch: {query}\nResults:\n{show_docs(docs)}"))
                   for query, docs in zip(queries, results)]
        evidence = [c.parsed.get("evidence") or "" for c in await asyncio.gather(*writers)]
        ans = await ctx.call("answerer", few_shot(ANSWERER_SYSTEM, ANSWERER_EXAMPLES,
                                                  f"Question: {q}\nNotes: {numbered(evidence)}"))
        found = {str(d.get("id")) for docs in results for d in docs}
        supporting = set(task.meta.get("supporting") or ())
        grounded = [float(mentions(e, task.answer)) for e, docs in zip(evidence, results)
                    if mentions(" ".join(str(d.get("contents", "")) for d in docs), task.answer)]
        ctx.finish(ans.parsed.get("answer"), hit=len(found & supporting) / len(supporting) if supporting else None,
                   grounded=grounded)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        out = answer_scores(trace.final_answer, task)
        out["answerer/accuracy"] = out["em"]
        if trace.state.get("hit") is not None:
            out["decomposer/hit_rate"] = trace.state["hit"]
        if trace.state.get("grounded"):
            out["evidence_writer/accuracy"] = sum(trace.state["grounded"]) / len(trace.state["grounded"])
        return out

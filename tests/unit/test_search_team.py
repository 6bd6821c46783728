"""The iterative search team and the single search agent: parsers, credit by hand, tools, failures."""

import json
from pathlib import Path

import pytest
from helpers import run_scripted

from masrl.config import RetrieverConfig, WorldConfig
from masrl.driver.rollout.services import Services
from masrl.errors import InfraError
from masrl.families.qa.search import SearchAgent, SearchTeam
from masrl.families.qa.search_roles import (
    parse_agent,
    parse_evidence,
    parse_plan,
    parse_query,
    parse_subquestion,
    split_subquestions,
)
from masrl.families.qa.world import ensure_world, world_tasks
from masrl.rewards import CreditReward, combine
from masrl.trace import Trace


def test_parsers_on_good_and_broken_outputs():
    p = parse_plan("<subquestions>Who founded X? | When was that person born?</subquestions><answer>unknown</answer>")
    assert p.ok and split_subquestions(p.fields["subquestions"]) == ["Who founded X?", "When was that person born?"]
    assert not parse_plan("<subquestions>a</subquestions>").ok
    assert parse_query("<query>X founder</query>").fields == {"query": "X founder"}
    stop = parse_query("<stop></stop>")
    assert stop.ok and stop.fields == {"stop": "1"} and "query" not in stop.fields
    assert parse_query("<stop/>").fields == {"stop": "1"}
    loose = parse_query("X founder year\nmore words")  # a near-miss is still searched, and scored as a miss
    assert loose.fields["query"] == "X founder year" and not loose.ok and loose.score == 0.0
    assert "query" not in parse_query("   ").fields  # nothing at all: the search ends
    assert parse_evidence("<evidence>X was born in 1950.</evidence>").ok
    assert parse_subquestion("<subquestion>2</subquestion>").fields["subquestion"] == "2"
    assert not parse_subquestion("<subquestion>two</subquestion>").ok
    call = parse_agent('<tool_call>{"name": "search", "arguments": {"query": "X"}}</tool_call>')
    assert call.ok and call.fields == {"tool": "search", "query": "X"}
    bad = parse_agent("<tool_call>{not json}</tool_call>")
    assert not bad.ok and bad.score == 0.0 and "not valid JSON" in bad.errors[0]
    assert parse_agent("<answer>1948</answer>").fields == {"answer": "1948"}


def _run(wf, task, outputs, tools, trace=None):
    return run_scripted(wf, task, outputs, tools, trace)


@pytest.fixture()
def world(tmp_path):
    w = WorldConfig(docs=40, seed=0, dir=str(tmp_path / "w"))
    ensure_world(w.docs, w.seed, w.dir)
    task = next(t for t in world_tasks(30, seed=3, world_docs=40, world_seed=0, levels=[1])
                if t.question.startswith("In what year was"))
    return w, task


def test_team_credit_by_hand(world):
    w, task = world
    gold = task.answer[0]
    name = task.question.removeprefix("In what year was ").removesuffix(" born?")
    wf = SearchTeam(max_turns=2)
    tools = wf.tools(Services(world=w, retriever=RetrieverConfig(topk=2)))
    tr, engine = _run(wf, task, {
        "planner": ["<subquestions>When was he born?</subquestions><answer>1900</answer>"],
        "answerer": ["<answer>unknown</answer>", f"<answer>{gold}</answer>", f"<answer>{gold}</answer>"],
        "searcher": [f"<query>{name} born</query>", "<stop></stop>"],
        "summarizer": [f"<evidence>{name} was born in {gold}.</evidence>"],
        "updater": ["<subquestion>1</subquestion>"],
    }, tools)
    assert [(c.agent, c.turn) for c in tr.calls] == [("planner", 0), ("answerer", 1), ("searcher", 2),
                                                     ("summarizer", 3), ("updater", 4), ("answerer", 5),
                                                     ("searcher", 6)]
    planner, ans0, searcher, summ, upd, ans1, stop = tr.calls
    assert ans0.credit == 0.0 and ans1.credit == 1.0  # each answer earns its own F1
    assert searcher.credit == summ.credit == upd.credit == 1.0  # the F1 gain after their turn
    assert stop.credit == 0.0 and planner.credit == 1.0  # planner: the final answer's F1
    assert [(t.name, t.turn) for t in tr.tool_calls] == [("search", 3)]  # after the searcher's call
    assert task.meta["supporting"][0] in {d["id"] for d in tr.tool_calls[0].result}
    m = tr.metrics
    assert m["outcome"] == m["f1"] == m["em"] == 1.0 and m["searcher/hit_rate"] == 1.0
    assert m["summarizer/accuracy"] == 1.0 and m["updater/gain"] == 1.0 and m["planner/accuracy"] == 0.0
    answer_prompt = [g for a, g in engine.seen if a == "answerer"][1].messages[-1]["content"]
    assert f"(for 1) {name} was born in {gold}." in answer_prompt  # the note filed under its sub-question
    totals = combine(tr, task, [CreditReward()])
    assert totals[searcher.call_id] == 1.0 and totals[ans0.call_id] == 0.0


def test_bad_query_is_the_models_mistake_but_a_dead_retriever_drops_the_trace(world):
    w, task = world
    wf = SearchTeam(max_turns=1)
    out = {"planner": ["<subquestions>a</subquestions><answer>x</answer>"], "answerer": ["<answer>x</answer>"] * 2,
           "searcher": ["<query> </query>"], "summarizer": ["<evidence>nothing useful</evidence>"],
           "updater": ["<subquestion>0</subquestion>"]}
    # an empty <query></query> is read leniently as... nothing, so the search ends
    tr, _ = _run(wf, task, out, wf.tools(Services(world=w)))
    assert [c.agent for c in tr.calls] == ["planner", "answerer", "searcher"] and not tr.tool_calls
    dead = RetrieverConfig(kind="http", endpoints=["http://127.0.0.1:9"], timeout_s=0.5, retries=0)
    out["searcher"] = ["<query>who</query>"]
    trace = Trace("t", task.id, 0)
    with pytest.raises(InfraError, match="retriever endpoint"):
        _run(wf, task, {k: list(v) for k, v in out.items()}, wf.tools(Services(retriever=dead)), trace)
    failed = trace.tool_calls[-1]  # the failure is on the trace, marked as infrastructure, in order
    assert failed.name == "search" and failed.infra and "127.0.0.1:9" in failed.error
    assert failed.turn == 3 and [c.agent for c in trace.calls] == ["planner", "answerer", "searcher"]


def test_empty_query_from_a_tool_call_comes_back_as_an_error_result(world):
    w, task = world
    wf = SearchAgent(max_calls=3)
    gold = task.answer[0]
    tr, engine = _run(wf, task, {"agent": [
        '<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>',
        '<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>',
        f"<answer>{gold}</answer>"]}, wf.tools(Services(world=w)))
    assert [t.name for t in tr.tool_calls] == ["search", "lookup"]
    assert "empty" in tr.tool_calls[0].error and "unknown tool 'lookup'" in tr.tool_calls[1].error
    assert tr.metrics["outcome"] == 1.0 and all(c.credit == 1.0 for c in tr.calls)
    last = engine.seen[-1][1]
    assert [m["role"] for m in last.messages[-4:]] == ["assistant", "tool", "assistant", "tool"]
    assert last.messages[-1]["content"].startswith("error: unknown tool 'lookup'")
    assert last.tools and last.tools[0]["function"]["name"] == "search"


def test_search_agent_finds_the_document_and_answers(world):
    w, task = world
    name = task.question.removeprefix("In what year was ").removesuffix(" born?")
    wf = SearchAgent(max_calls=2)
    tr, engine = _run(wf, task, {"agent": [
        json.dumps({"name": "search", "arguments": {"query": f"{name} born"}}),  # Llama-style bare JSON
        "<answer>1</answer>"]}, wf.tools(Services(world=w)))
    assert tr.metrics["agent/hit_rate"] == 1.0 and tr.metrics["outcome"] == 0.0
    assert name in engine.seen[1][1].messages[-1]["content"]  # the document came back to the model


def test_two_hop_example_shows_two_searches_before_the_question_and_only_when_asked(world):
    w, task = world
    prompts = {}
    for flag in (False, True):
        wf = SearchAgent(max_calls=3, two_hop_example=flag)
        _, engine = _run(wf, task, {"agent": [f"<answer>{task.answer[0]}</answer>"]}, wf.tools(Services(world=w)))
        prompts[flag] = engine.seen[0][1].messages
    plain, two = prompts[False], prompts[True]
    assert two[: len(plain) - 1] == plain[:-1] and two[-1] == plain[-1]  # the same prompt, one example more
    added = two[len(plain) - 1: -1]
    assert [m["role"] for m in added] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    queries = [json.loads(m["content"].removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]["query"]
               for m in added if m["content"].startswith("<tool_call>")]
    assert len(queries) == 2 and queries[0] != queries[1]
    assert added[-1]["content"] == "<answer>Tavesso</answer>" and "Tavesso" in added[-2]["content"]


def test_the_default_corpus_comes_from_a_family_declaration_and_its_absence_is_named(world, monkeypatch):
    """The driver's services name no family: the QA family declares the default corpus (``SERVICES['corpus']``);
    without any such declaration a run that searches is told to set retriever.corpus."""
    import masrl.families as families
    from masrl.errors import ConfigError

    w, _ = world
    got = Services(world=w).retriever()
    corpus = families.SERVICES["corpus"](w)
    lines = Path(corpus).read_text().splitlines()
    assert corpus.endswith("corpus.jsonl") and len(got.index.ids) == len(lines) == w.docs
    monkeypatch.setattr(families, "SERVICES", {})
    with pytest.raises(ConfigError, match="retriever.corpus"):
        Services(world=w).retriever()

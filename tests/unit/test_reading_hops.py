"""Two-hop reading: the team that splits by passages and by hops, and its one-call control."""


import pytest
from helpers import run_scripted

from masrl.config import load_config
from masrl.errors import ConfigError, DataError
from masrl.families import build_workflow, config_path
from masrl.families.qa.reading_hops import HOP_CASES, ReadingHops, ReadingHopsAgent, title_of
from masrl.families.qa.world import world_tasks


def _task(kind="In what year was the founder of"):
    tasks = world_tasks(60, seed=3, world_docs=60, world_seed=0, levels=[2], context_docs=24)
    return next(t for t in tasks if t.question.startswith(kind))


def _where(ctx, title):
    i = next(i for i, p in enumerate(ctx) if title_of(p) == title_of(title + ": x"))
    return i // 8, i % 8


def test_a_two_hop_question_carries_both_passages_and_its_bridge():
    t = _task()
    org = t.question.removeprefix("In what year was the founder of ").removesuffix(" born?")
    titles = [p.split(":")[0] for p in t.meta["context"]]
    assert len(titles) == 24 and org in titles and t.meta["bridge"] in titles
    assert any(f"by {t.meta['bridge']}" in p for p in t.meta["context"] if p.startswith(org + ":"))


def test_the_team_reads_in_two_rounds_tells_the_answerer_the_bridge_and_pays_found_credit():
    t = _task()
    ctx, bridge, gold = t.meta["context"], t.meta["bridge"], t.answer[0]
    org = t.question.removeprefix("In what year was the founder of ").removesuffix(" born?")
    (c1, w1), (c2, w2) = _where(ctx, org), _where(ctx, bridge)
    first = ["<doc>1</doc>"] * 3
    first[c1] = f"<doc>{w1 + 1}</doc>"
    second = ["<doc>2</doc>"] * 3
    second[c2] = f"<doc>{w2 + 1}</doc>"
    second[(c2 + 1) % 3] = "<doc>99</doc>"  # a bad pick beside good ones: that reader passes nothing on
    tr, engine = run_scripted(ReadingHops(docs_per_reader=8), t, {
        "reader": first + second, "bridger": [f"<answer>{bridge}</answer>"], "answerer": [f"<answer>{gold}</answer>"]})
    assert [c.agent for c in tr.calls] == ["reader"] * 3 + ["bridger"] + ["reader"] * 3 + ["answerer"]
    asked = [g.messages[-1]["content"] for _, g in engine.seen]
    assert all(q.endswith(f"Question: {t.question}") for q in asked[:3])
    assert ctx[8 * c1 + w1] in asked[3]  # the bridger reads the first round's picks
    assert all(q.endswith(f"Question: What does the document about {bridge} say?") for q in asked[4:7])
    assert ctx[8 * c2 + w2] in asked[7] and asked[7].endswith(f"It leads to: {bridge}")
    assert asked[7].count("\n[") == 2  # one of the three picks was out of range: two passages shown
    credits = [c.credit for c in tr.calls]
    assert credits[c1] == 1.0 and [credits[i] for i in range(3) if i != c1] == [None, None]
    assert credits[3] == 1.0 and credits[4 + c2] == 1.0 and credits[7] == 1.0
    m = tr.metrics
    assert m["f1"] == m["em"] == m["hop1/accuracy"] == m["hop2/accuracy"] == m["bridge/f1"] == 1.0
    assert m["answerer/covered"] == 1.0
    # the first round's holding reader names another passage, the bridger a wrong name: each earns nothing
    first[c1] = f"<doc>{(w1 + 1) % 8 + 1}</doc>"
    tr, engine = run_scripted(ReadingHops(docs_per_reader=8), t, {
        "reader": first + second, "bridger": ["<answer>Nobody Atall</answer>"], "answerer": ["<answer>1</answer>"]})
    assert tr.calls[c1].credit == 0.0 and tr.calls[3].credit == 0.0 and tr.calls[7].credit == 0.0
    assert engine.seen[4][1].messages[-1]["content"].endswith("about Nobody Atall say?")
    assert tr.metrics["hop1/accuracy"] == 0.0 and tr.metrics["f1"] == 0.0


def test_the_agent_reads_all_passages_and_with_bridge_is_paid_for_both_steps():
    t = _task("In which city is the employer of")
    bridge, gold = t.meta["bridge"], t.answer[0]
    tr, engine = run_scripted(ReadingHopsAgent(), t, {"agent": [f"<answer>{gold}</answer>"]})
    prompt = engine.seen[0][1].messages[-1]["content"]
    assert all(p in prompt for p in t.meta["context"]) and tr.calls[0].credit == 1.0
    shown = " ".join(m["content"] for m in engine.seen[0][1].messages)
    assert all(q in shown for _, _, _, q, _, _ in HOP_CASES)  # a worked example of each kind of two-hop question
    tr, _ = run_scripted(ReadingHopsAgent(bridge=True), t, {"agent": [f"<bridge>{bridge}</bridge><answer>x</answer>"]})
    assert tr.calls[0].credit == 0.5 and tr.metrics["bridge/f1"] == 1.0 and tr.metrics["f1"] == 0.0


def test_a_task_without_a_bridge_says_which_levels_to_set():
    one_hop = world_tasks(3, seed=3, world_docs=60, world_seed=0, levels=[1], context_docs=24)[0]
    with pytest.raises(DataError, match="levels"):
        run_scripted(ReadingHops(), one_hop, {"reader": ["<doc>1</doc>"] * 3})


@pytest.mark.parametrize("name", ["qa/reading_hops", "qa/reading_hops_agent"])
def test_the_shipped_two_hop_configs_load(name):
    cfg = load_config(config_path(name))
    assert cfg.data.train.levels == [2] and cfg.data.world.context_docs == 24


def test_the_picking_bridger_chooses_a_title_and_the_answerer_reads_that_passage():
    t = _task("In which city is the employer of")
    ctx, bridge, gold = t.meta["context"], t.meta["bridge"], t.answer[0]
    person = t.question.removeprefix("In which city is the employer of ").removesuffix(" headquartered?")
    c1, w1 = _where(ctx, person)
    at = next(i for i, p in enumerate(ctx) if title_of(p) == title_of(bridge + ": x"))
    first = ["<doc>1</doc>"] * 3
    first[c1] = f"<doc>{w1 + 1}</doc>"
    team = ReadingHops(bridger="pick")
    tr, engine = run_scripted(team, t, {"reader": first, "bridger": [f"<doc>{at + 1}</doc>"],
                                        "answerer": [f"<answer>{gold}</answer>"]})
    assert [c.agent for c in tr.calls] == ["reader"] * 3 + ["bridger", "answerer"]  # 5 calls, no second round
    asked = [g.messages[-1]["content"] for _, g in engine.seen]
    assert ctx[8 * c1 + w1] in asked[3]  # the bridger reads the first round's picks ...
    listed = asked[3].split("Titles:\n", 1)[1].splitlines()
    assert listed == [f"{i}. {p.partition(':')[0]}" for i, p in enumerate(ctx, 1)]  # ... and every title, numbered
    assert ctx[at] in asked[4] and asked[4].endswith(f"It leads to: {bridge}") and asked[4].count("\n[") == 1
    assert tr.calls[3].credit == 1.0 and tr.calls[4].credit == 1.0
    assert tr.metrics["bridge/f1"] == tr.metrics["f1"] == tr.metrics["answerer/covered"] == 1.0
    assert "hop2/accuracy" not in tr.metrics
    # the asked person's own title, then a number past the list: no credit; the second leaves the answerer nothing
    own = next(i for i, p in enumerate(ctx) if title_of(p) == title_of(person + ": x"))
    tr, engine = run_scripted(team, t, {"reader": first, "bridger": [f"<doc>{own + 1}</doc>"],
                                        "answerer": ["<answer>x</answer>"]})
    assert tr.calls[3].credit == 0.0 and engine.seen[4][1].messages[-1]["content"].endswith(f"It leads to: {person}")
    tr, engine = run_scripted(team, t, {"reader": first, "bridger": ["<doc>25</doc>"], "answerer": ["<answer>x</answer>"]})
    shown = engine.seen[4][1].messages[-1]["content"]
    assert tr.calls[3].credit == 0.0 and "\n[" not in shown and tr.metrics["answerer/covered"] == 0.0


def test_an_unknown_bridger_names_both_choices():
    with pytest.raises(ConfigError, match="workflow.options for 'reading_hops'.*'name'.*'pick'.*'write'"):
        build_workflow("reading_hops", {"bridger": "write"})
    assert build_workflow("reading_hops", {"bridger": "pick"}).roles()["bridger"].default_stop == ("</doc>",)

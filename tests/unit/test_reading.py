"""The reading family: questions with their passages inline, the team of readers and the one-call agent."""


import pytest
from helpers import run_scripted

from masrl.config import load_config
from masrl.data.tasks import Task
from masrl.errors import ConfigError, DataError
from masrl.families import config_path
from masrl.families.qa.reading import (
    READER_EXAMPLES,
    SELECT_EXAMPLES,
    ReadingAgent,
    ReadingTeam,
    passages_of,
    quoted,
)
from masrl.families.qa.world import world_tasks

TEAM = str(config_path("qa/reading_team"))


def _tasks(n=40, seed=3, context_docs=8):
    return world_tasks(n, seed=seed, world_docs=60, world_seed=0, levels=[1, 3], context_docs=context_docs)


def _subject(task):
    """The entity a one-hop question asks about (the title of its supporting passage)."""
    q = task.question
    for pre, post in (("In what year was ", " born?"), ("Which organisation does ", " work for?"),
                      ("In which city does ", " have its headquarters?"), ("Who is the mayor of ", "?")):
        if q.startswith(pre):
            return q.removeprefix(pre).removesuffix(post)
    return None


def test_each_question_carries_its_supporting_passage_among_same_kind_distractors():
    tasks = _tasks()
    assert all(len(t.meta["context"]) == 8 for t in tasks)
    one_hop = [t for t in tasks if t.meta["type"] == "one_hop"]
    comparisons = [t for t in tasks if t.meta["type"] == "comparison"]
    assert one_hop and comparisons
    for t in one_hop:
        titles = [p.split(":")[0] for p in t.meta["context"]]
        assert titles.count(_subject(t)) == 1 and len(set(titles)) == 8  # the answer's passage, once; no repeats
        if t.question.startswith("In what year"):  # every distractor is a person too: each has a birth year
            assert all(" was born in " in p for p in t.meta["context"])
    for t in comparisons:  # both compared entities are in the passages
        a, b = t.question.split(", ")[1].removesuffix("?").split(" or ")
        titles = [p.split(":")[0] for p in t.meta["context"]]
        assert a in titles and b in titles
    # the passages follow the question, not the split or its position: a question drawn again (another seed)
    # comes with the same passages; and the order is not always the answer first
    again = {t.question: t.meta["context"] for t in _tasks(n=200, seed=4)}
    shared = [t for t in tasks if t.question in again]
    assert shared and all(again[t.question] == t.meta["context"] for t in shared)
    assert len({[p.split(":")[0] for p in t.meta["context"]].index(_subject(t)) for t in one_hop}) > 1
    assert "context" not in _tasks(n=3, context_docs=0)[0].meta


def test_team_splits_the_passages_and_pays_every_call_the_answers_f1():
    task = next(t for t in _tasks() if t.question.startswith("In what year"))
    gold, name = task.answer[0], _subject(task)
    held = next(i for i, p in enumerate(task.meta["context"]) if p.startswith(name + ":")) // 2
    readers = ["<evidence>nothing useful</evidence>"] * 4
    readers[held] = f"<evidence>{name} was born in {gold}.</evidence>"
    readers[(held + 1) % 4] = "<evidence>Someone works for Nowhere Labs.</evidence>"  # a reader that should be quiet
    tr, engine = run_scripted(ReadingTeam(docs_per_reader=2), task,
                              {"reader": readers, "answerer": [f"<answer>{gold}</answer>"]})
    assert [c.agent for c in tr.calls] == ["reader"] * 4 + ["answerer"]
    shown = [g.messages[-1]["content"] for a, g in engine.seen if a == "reader"]
    for i, prompt in enumerate(shown):  # each reader sees its two passages and the question, nothing else
        assert all(p in prompt for p in task.meta["context"][2 * i: 2 * i + 2])
        assert sum(p in prompt for p in task.meta["context"]) == 2 and prompt.endswith(f"Question: {task.question}")
    notes = engine.seen[-1][1].messages[-1]["content"]
    assert f"{name} was born in {gold}." in notes and "Nowhere Labs" in notes and "nothing useful" not in notes
    assert all(c.credit == 1.0 for c in tr.calls)
    m = tr.metrics
    assert m["outcome"] == m["f1"] == m["em"] == m["answerer/accuracy"] == 1.0
    assert m["reader/accuracy"] == 1.0  # the one reader whose passages held the answer named it
    assert m["reader/quiet"] == pytest.approx(2 / 3)  # two of the three others said "nothing useful"


def test_verbatim_team_passes_on_quotes_only_and_a_reworded_sentence_is_dropped():
    task = next(t for t in _tasks() if t.question.startswith("In what year"))
    gold, name = task.answer[0], _subject(task)
    ctx = task.meta["context"]
    held = next(i for i, p in enumerate(ctx) if p.startswith(name + ":")) // 2
    true_sentence = next(s for s in ctx[next(i for i, p in enumerate(ctx) if p.startswith(name + ":"))].split(". ")
                         if " was born in " in s)
    other = (held + 1) % 4
    other_name = ctx[2 * other].split(":")[0]
    readers = ["<evidence>nothing useful</evidence>"] * 4
    readers[held] = f"<evidence>  {true_sentence.upper()} </evidence>"  # a quote: case and spacing aside
    readers[other] = f"<evidence>{name} was born in 1111 in {other_name}.</evidence>"  # reworded around the name
    tr, engine = run_scripted(ReadingTeam(docs_per_reader=2, verbatim=True), task,
                              {"reader": readers, "answerer": [f"<answer>{gold}</answer>"]})
    notes = engine.seen[-1][1].messages[-1]["content"]
    assert true_sentence.upper() in notes and "1111" not in notes
    assert tr.metrics["reader/quoted"] == 0.5 and tr.metrics["answerer/notes"] == 1.0  # 2 said something, 1 quoted
    assert quoted(true_sentence, ctx) and not quoted(f"{name} was born in 1111", ctx) and not quoted("  ", ctx)
    assert not quoted(true_sentence[: len(true_sentence) // 2] + "x", ctx)  # a word cut in half is no quote
    tr, engine = run_scripted(ReadingTeam(docs_per_reader=2), task,  # without verbatim both notes go through
                              {"reader": readers, "answerer": [f"<answer>{gold}</answer>"]})
    assert "1111" in engine.seen[-1][1].messages[-1]["content"] and tr.metrics["answerer/notes"] == 2.0


def test_selecting_readers_pass_the_whole_passage_they_name_and_a_bad_number_passes_nothing():
    task = next(t for t in _tasks() if t.question.startswith("Which organisation"))
    gold, name = task.answer[0], _subject(task)
    ctx = task.meta["context"]
    at = next(i for i, p in enumerate(ctx) if p.startswith(name + ":"))
    held, within = at // 4, at % 4
    readers = ["<doc>none</doc>", "<doc>none</doc>"]
    readers[held] = f"<doc>{within + 1}</doc>"
    readers[1 - held] = "<doc>7</doc>"  # out of its chunk's range: no note, and not quiet
    tr, engine = run_scripted(ReadingTeam(docs_per_reader=4, readers="select"), task,
                              {"reader": readers, "answerer": [f"<answer>{gold}</answer>"]})
    assert [c.agent for c in tr.calls] == ["reader", "reader", "answerer"]
    notes = engine.seen[-1][1].messages[-1]["content"]
    assert notes.endswith(f"Notes: 1. {ctx[at]}")  # the named passage, whole, and nothing else
    m = tr.metrics
    assert m["reader/accuracy"] == 1.0 and m["reader/quiet"] == 0.0 and m["answerer/notes"] == 1.0
    assert m["outcome"] == 1.0 and all(c.credit == 1.0 for c in tr.calls)
    shown = engine.seen[0][1].messages
    assert "<doc>" in shown[2]["content"] and "<evidence>" not in " ".join(x["content"] for x in shown)
    # the examples name first and second passages and "none", so no one reply is always right
    assert {a for _, a in SELECT_EXAMPLES} == {"<doc>1</doc>", "<doc>2</doc>", "<doc>none</doc>"}
    with pytest.raises(ValueError, match="readers must be 'quote'"):
        ReadingTeam(readers="choose")


def test_picking_readers_each_name_one_and_the_answerer_chooses_among_the_picks_with_found_credit():
    task = next(t for t in _tasks(context_docs=24) if t.question.startswith("Which organisation")  # (one
                and sum(t.answer[0].lower() in p.lower() for p in t.meta["context"]) == 1)  # passage names the answer)
    gold, name = task.answer[0], _subject(task)
    ctx = task.meta["context"]
    at = next(i for i, p in enumerate(ctx) if p.startswith(name + ":"))
    held, within = at // 8, at % 8
    readers = ["<doc>1</doc>"] * 3  # a bad batch beside good ones: one reader names a passage out of range
    readers[held] = f"<doc>{within + 1}</doc>"
    readers[(held + 1) % 3] = "<doc>9</doc>"
    picks = [ctx[8 * i + (within if i == held else 0)] for i in range(3) if i != (held + 1) % 3]
    right = picks.index(ctx[at]) + 1
    team = ReadingTeam(docs_per_reader=8, readers="pick", found_credit=True)
    tr, engine = run_scripted(team, task, {"reader": readers, "answerer": [f"<doc>{right}</doc><answer>{gold}</answer>"]})
    assert [c.agent for c in tr.calls] == ["reader"] * 3 + ["answerer"]
    reader_prompt = engine.seen[0][1].messages
    assert all("<doc>none</doc>" not in m["content"] for m in reader_prompt)  # a picking reader is never shown it
    ask = engine.seen[-1][1].messages
    assert ask[-1]["content"] == f"Documents:\n[1] {picks[0]}\n[2] {picks[1]}\nQuestion: {task.question}"
    assert "<doc>" in ask[2]["content"] and "<answer>" in ask[2]["content"]  # prompted as the selecting agent
    # found credit: the reader whose chunk held the answer earns its pick; the other two earn nothing
    credits = [c.credit for c in tr.calls]
    assert credits[held] == 1.0 and [credits[i] for i in range(3) if i != held] == [None, None] and credits[3] == 1.0
    assert tr.metrics["answerer/chosen"] == 1.0 and tr.metrics["reader/accuracy"] == 1.0
    # the holding reader names a wrong passage: it earns 0 whatever the answer; the answerer earns its F1
    readers[held] = f"<doc>{(within + 1) % 8 + 1}</doc>"
    tr, _ = run_scripted(team, task, {"reader": readers, "answerer": [f"<doc>1</doc><answer>{gold}</answer>"]})
    assert tr.calls[held].credit == 0.0 and tr.calls[3].credit == 1.0 and tr.metrics["answerer/chosen"] == 0.0
    tr, _ = run_scripted(ReadingTeam(docs_per_reader=8, readers="pick"), task,  # without it: everyone the F1
                         {"reader": readers, "answerer": ["<doc>1</doc><answer>zzz</answer>"]})
    assert [c.credit for c in tr.calls] == [0.0] * 4
    with pytest.raises(ValueError, match="found_credit"):
        ReadingTeam(found_credit=True)


def test_an_answer_only_answerer_reads_the_picks_as_the_plain_agent_and_covered_counts_the_ceiling():
    task = next(t for t in _tasks(context_docs=24) if t.question.startswith("Which organisation")
                and sum(t.answer[0].lower() in p.lower() for p in t.meta["context"]) == 1)
    gold, name = task.answer[0], _subject(task)
    ctx = task.meta["context"]
    at = next(i for i, p in enumerate(ctx) if p.startswith(name + ":"))
    held, within = at // 8, at % 8
    readers = ["<doc>1</doc>"] * 3
    readers[held] = f"<doc>{within + 1}</doc>"
    readers[(held + 1) % 3] = "no number at all"  # a bad reply beside good ones: that reader passes nothing
    team = ReadingTeam(docs_per_reader=8, readers="pick", found_credit=True, answer_only=True)
    assert team.roles()["answerer"].parser("<answer>x</answer>").ok  # no <doc> asked for
    tr, engine = run_scripted(team, task, {"reader": readers, "answerer": [f"<answer>{gold}</answer>"]})
    ask = engine.seen[-1][1].messages
    assert "<doc>" not in ask[0]["content"] + ask[2]["content"]  # the plain agent's system prompt and examples
    assert ask[-1]["content"].startswith("Documents:\n[1] ") and ask[-1]["content"].count("\n[") == 2  # two picks
    assert tr.calls[held].credit == 1.0 and tr.calls[3].credit == 1.0
    assert tr.metrics["answerer/covered"] == 1.0 and "answerer/chosen" not in tr.metrics
    assert "reader/quiet" not in tr.metrics  # a picking reader cannot say "none"
    readers[held] = f"<doc>{(within + 1) % 8 + 1}</doc>"  # the holding reader misses: no pick holds the answer
    tr, _ = run_scripted(team, task, {"reader": readers, "answerer": ["<answer>zzz</answer>"]})
    assert tr.metrics["answerer/covered"] == 0.0 and tr.calls[held].credit == 0.0
    with pytest.raises(ValueError, match="answer_only"):
        ReadingTeam(readers="select", answer_only=True)


def test_selecting_agent_names_a_passage_then_answers():
    task = next(t for t in _tasks() if t.question.startswith("In what year"))
    gold, name = task.answer[0], _subject(task)
    at = next(i for i, p in enumerate(task.meta["context"]) if p.startswith(name + ":"))
    tr, _ = run_scripted(ReadingAgent(select=True), task, {"agent": [f"<doc>{at + 1}</doc><answer>{gold}</answer>"]})
    assert tr.metrics["agent/grounded"] == 1.0 and tr.metrics["outcome"] == 1.0 and tr.calls[0].format_ok
    tr, _ = run_scripted(ReadingAgent(select=True), task, {"agent": [f"<doc>{(at + 1) % 8 + 1}</doc><answer>x</answer>"]})
    assert tr.metrics["agent/grounded"] == 0.0 and tr.metrics["outcome"] == 0.0
    with pytest.raises(ValueError, match="not both"):
        ReadingAgent(evidence=True, select=True)
    # found credit: the mean of the F1 and whether the named passage holds the answer
    tr, _ = run_scripted(ReadingAgent(select=True, found_credit=True), task,
                         {"agent": [f"<doc>{at + 1}</doc><answer>x</answer>"]})
    assert tr.calls[0].credit == 0.5
    tr, _ = run_scripted(ReadingAgent(select=True, found_credit=True), task,
                         {"agent": [f"<doc>{(at + 1) % 8 + 1}</doc><answer>{gold}</answer>"]})
    assert tr.calls[0].credit == 0.5
    with pytest.raises(ValueError, match="select: true"):
        ReadingAgent(found_credit=True)


def test_team_with_a_wrong_answer_pays_nothing_and_odd_chunks_are_read_too():
    task = _tasks(context_docs=7)[0]
    tr, _ = run_scripted(ReadingTeam(docs_per_reader=3), task,
                         {"reader": ["<evidence>nothing useful</evidence>"] * 3, "answerer": ["<answer>zzz</answer>"]})
    assert [c.agent for c in tr.calls] == ["reader"] * 3 + ["answerer"]  # 3 + 3 + 1 passages
    assert all(c.credit == 0.0 for c in tr.calls) and tr.metrics["outcome"] == 0.0


def test_agent_reads_every_passage_in_one_call_and_evidence_style_asks_for_the_sentence():
    task = next(t for t in _tasks() if t.meta["type"] == "one_hop")
    gold = task.answer[0]
    tr, engine = run_scripted(ReadingAgent(), task, {"agent": [f"<answer>{gold}</answer>"]})
    prompt = engine.seen[0][1].messages[-1]["content"]
    assert all(p in prompt for p in task.meta["context"]) and tr.calls[0].credit == 1.0
    assert tr.metrics["agent/accuracy"] == 1.0 and "agent/grounded" not in tr.metrics
    tr, engine = run_scripted(ReadingAgent(evidence=True), task,
                              {"agent": [f"<evidence>It says {gold}.</evidence><answer>{gold}</answer>"]})
    assert "<evidence>" in engine.seen[0][1].messages[2]["content"]  # its worked examples copy the sentence
    assert tr.metrics["agent/grounded"] == 1.0 and tr.calls[0].format_ok
    tr, _ = run_scripted(ReadingAgent(evidence=True), task, {"agent": [f"<answer>{gold}</answer>"]})
    assert not tr.calls[0].format_ok and tr.metrics["outcome"] == 1.0  # the answer still counts; the format does not


def test_reader_examples_show_both_kinds_of_reply():
    replies = [a for _, a in READER_EXAMPLES]
    assert sum("nothing useful" in r for r in replies) == sum("nothing useful" not in r for r in replies) == 4


def test_a_task_without_passages_says_how_to_give_them_and_text_passages_split_at_blank_lines():
    with pytest.raises(DataError, match="data.world.context_docs"):
        passages_of(Task("q1", "Who?", ["x"], {}))
    assert passages_of(Task("q2", "Who?", ["x"], {"context": "A: one.\n\nB: two.\n"})) == ["A: one.", "B: two."]


def test_context_docs_is_a_checked_setting(tmp_path):
    cfg = load_config(TEAM, ["data.world.context_docs=4"])
    assert cfg.data.world.context_docs == 4
    with pytest.raises(ConfigError, match="context_docs"):
        load_config(TEAM, ["data.world.context_docs=-1"])
    with pytest.raises(ConfigError, match="docs_per_reader"):
        from masrl.families import build_workflow

        build_workflow("reading_team", {"docs_per_reader": 0})


def test_a_reading_run_without_passages_stops_at_once_and_names_the_setting(tmp_path, capsys):
    from masrl.cli import main

    rc = main(["train", TEAM, "model=tiny-random", "data.world.context_docs=0",
               "data.world.docs=40", "train.steps=1", "train.eval_before=false", "data.eval.n=2",
               "rollout.tasks_per_step=2", "rollout.samples_per_task=2", f"output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc != 0 and "set data.world.context_docs" in err and "reading_team" in err
    assert not (tmp_path / "run" / "checkpoints" / "step_000001").exists()

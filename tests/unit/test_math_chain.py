"""Chained word problems: the generator, the team of steppers and the two single agents."""


import pytest
from helpers import run_scripted

from masrl.config import load_config
from masrl.data.tasks import Task
from masrl.errors import ConfigError, DataError
from masrl.families import build_tasks, config_path
from masrl.families.math.chain import apply, generate, step_question
from masrl.families.math.chain_team import MathChainAgent, MathChainTeam
from masrl.families.math.roles import CHECKER_SYSTEM

SIGN = {"add": "+", "sub": "-", "packs": "+", "split": "/", "times": "*"}


def _expr(ev: dict, count) -> str:
    """The right expression for event ``ev`` from ``count``."""
    rhs = " * ".join(map(str, ev["args"]))
    return f"<expr>{count} {SIGN[ev['op']]} {rhs}</expr>"


def test_problems_chain_their_events_and_the_answer_is_the_last_count():
    tasks = generate(200, seed=3, levels=[2, 3, 4, 5])
    assert [t.question for t in tasks] == [t.question for t in generate(200, seed=3, levels=[2, 3, 4, 5])]
    assert {len(t.meta["events"]) for t in tasks} == {2, 3, 4, 5}
    assert {e["op"] for t in tasks for e in t.meta["events"]} == set(SIGN)
    for t in tasks:
        count = t.meta["start"]
        for ev, value in zip(t.meta["events"], t.meta["values"]):
            count = apply(ev["op"], ev["args"], count)
            assert count == value and isinstance(count, int) and 1 <= count <= 200
        assert str(count) == t.answer and t.question.count("Then ") == t.meta["level"]
        assert "Then The" not in t.question and "Then A " not in t.question
    held = {t.question for t in tasks}
    assert not held & {t.question for t in generate(300, seed=3, levels=[2, 3, 4, 5], exclude=held)}
    with pytest.raises(ValueError, match="number of events"):
        generate(1, levels=[1])


def test_the_shipped_configs_build_their_splits_and_a_wrong_level_is_named():
    for name in ("math/chain_team", "math/chain_agent", "math/chain_stepwise"):
        cfg = load_config(config_path(name), ["data.train.n=50"])
        train, held_out = build_tasks(cfg)
        assert len(train) == 50 and len(held_out) == 64 and not {t.question for t in train} & {t.question for t in held_out}
    cfg = load_config(config_path("math/chain_team"), ["data.train.levels=[1]"])
    with pytest.raises(ConfigError, match=r"data.train.levels.*2, 3, 4, 5"):
        build_tasks(cfg)


def test_each_stepper_sees_only_its_event_from_the_count_so_far_and_earns_its_step():
    task = next(t for t in generate(50, seed=5, levels=[3]) if t.meta["events"][0]["op"] != "times")
    events, values = task.meta["events"], task.meta["values"]
    right = [_expr(ev, c) for ev, c in zip(events, [task.meta["start"], *values[:-1]])]
    wf = MathChainTeam()
    tr, engine = run_scripted(wf, task, {"stepper": right}, wf.tools(None))
    assert [c.agent for c in tr.calls] == ["stepper"] * 3 and tr.final_answer == task.answer
    shown = [g.messages[-1]["content"] for _, g in engine.seen]
    assert shown[0] == step_question(task.meta, 0, task.meta["start"])
    assert shown[2] == step_question(task.meta, 2, values[1]) and events[0]["text"] not in shown[2]
    assert all(g.messages[0]["content"] == CHECKER_SYSTEM for _, g in engine.seen)
    assert [c.credit for c in tr.calls] == [1.0] * 3 and tr.metrics["outcome"] == tr.metrics["step/accuracy"] == 1.0
    # step 1 goes wrong: the next steppers start from its value and are paid for their own step
    wrong = f"<expr>{task.meta['start']} + 1000</expr>"
    later = [_expr(ev, c) for ev, c in zip(events[1:], [task.meta["start"] + 1000, None])]
    tr2, engine2 = run_scripted(wf, task, {"stepper": [wrong, later[0], "<expr>1</expr>"]}, wf.tools(None))
    assert engine2.seen[1][1].messages[-1]["content"] == step_question(task.meta, 1, task.meta["start"] + 1000)
    assert [c.credit for c in tr2.calls] == [0.0, 1.0, 0.0] and tr2.metrics["outcome"] == 0.0
    assert tr2.metrics["step/accuracy"] == pytest.approx(1 / 3)
    # an expression that does not compute ends the chain; outcome credit pays every call the outcome
    tr3, _ = run_scripted(wf, task, {"stepper": [right[0], "<expr>lots</expr>", right[2]]}, wf.tools(None))
    assert len(tr3.calls) == 2 and tr3.final_answer is None and tr3.metrics["steps_done"] == pytest.approx(1 / 3)
    tr4, _ = run_scripted(MathChainTeam(step_credit=False), task, {"stepper": [wrong, *later[:1], "<expr>1</expr>"]},
                          wf.tools(None))
    assert [c.credit for c in tr4.calls] == [0.0] * 3


def test_the_one_expression_agent_writes_the_chain_in_one_call_and_earns_the_outcome():
    task = generate(10, seed=7, levels=[2])[0]
    wf = MathChainAgent()
    tr, engine = run_scripted(wf, task, {"solver": [f"<expr>{task.answer}</expr>"]}, wf.tools(None))
    assert len(tr.calls) == 1 and tr.calls[0].credit == 1.0 and tr.metrics["outcome"] == 1.0
    msgs = engine.seen[0][1].messages
    assert msgs[-1]["content"] == task.question and msgs[0]["content"] == CHECKER_SYSTEM
    assert any("(" in m["content"] for m in msgs if m["role"] == "assistant")  # a worked chain needs brackets
    tr2, _ = run_scripted(wf, task, {"solver": ["<expr>(1 + </expr>"]}, wf.tools(None))
    assert tr2.final_answer is None and tr2.calls[0].credit == 0.0


def test_the_stepwise_agent_keeps_one_conversation_over_the_events():
    task = generate(10, seed=8, levels=[3])[0]
    events, values = task.meta["events"], task.meta["values"]
    right = [_expr(ev, c) for ev, c in zip(events, [task.meta["start"], *values[:-1]])]
    wf = MathChainAgent(stepwise=True)
    tr, engine = run_scripted(wf, task, {"solver": right}, wf.tools(None))
    assert [c.agent for c in tr.calls] == ["solver"] * 3 and tr.final_answer == task.answer
    first, last = engine.seen[0][1].messages, engine.seen[2][1].messages
    assert last[: len(first)] == first  # each turn extends the last one
    assert task.question in first[-1]["content"] and f"Count now: {values[1]}." in last[-1]["content"]
    assert [m["content"] for m in last[len(first):] if m["role"] == "assistant"] == right[:2]
    assert [c.credit for c in tr.calls] == [1.0] * 3 and tr.metrics["step/accuracy"] == 1.0


def test_a_task_without_events_is_named():
    wf = MathChainTeam()
    with pytest.raises(DataError, match="source math_chain"):
        run_scripted(wf, Task("t1", "Ana has 3 pens.", "3", {}), {"stepper": []}, wf.tools(None))

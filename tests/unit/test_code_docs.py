"""Writing a function from its documentation: the generator, the team of readers and the one-call coder."""

import re

import pytest
from helpers import run_scripted

from masrl.config import SandboxConfig, load_config
from masrl.driver.rollout.services import Services
from masrl.errors import ConfigError
from masrl.families import build_tasks, config_path
from masrl.families.code.docs import CodeDocsAgent, CodeDocsTeam
from masrl.families.code.docs_tasks import EXAMPLE_NAMES, generate, holds

OPS = {"plus": "+", "multiplied by": "*", "minus": "-"}


def _linear(tasks):
    """A task whose asked entry reads "Returns x plus|minus|multiplied by K", and the code that solves it."""
    for t in tasks:
        entry = next(e for e in t.meta["context"] if holds(e, t))
        m = re.search(r"\): Returns x (plus|multiplied by|minus) (\d+)\.", entry)
        if m:
            name = t.meta["fn_name"]
            return t, f"<code>def {name}(x):\n    return x {OPS[m.group(1)]} {m.group(2)}</code>"
    raise AssertionError("no linear task among these")


def test_each_task_shows_its_functions_entry_once_among_others_under_invented_names():
    tasks = generate(30, seed=3, levels=[1, 2], docs=24)
    assert [t.question for t in tasks] == [t.question for t in generate(30, seed=3, levels=[1, 2], docs=24)]
    positions = set()
    for t in tasks:
        entries, name = t.meta["context"], t.meta["fn_name"]
        names = [e.split("(")[0] for e in entries]
        assert len(entries) == 24 and len(set(names)) == 24 and names.count(name) == 1
        assert not set(names) & EXAMPLE_NAMES and f"`{name}(" in t.question
        assert t.answer.fn_name == name and len(t.answer.cases) == 6 and len(t.meta["visible_tests"].cases) == 2
        assert t.meta["kind"] and not re.search(r"_\d+$", t.meta["kind"])  # the family, not its constant
        positions.add(names.index(name))
    assert len(positions) > 5  # the asked entry is not always in one place
    held = {t.question for t in tasks}
    assert not held & {t.question for t in generate(60, seed=3, levels=[1, 2], exclude=held)}
    with pytest.raises(ValueError, match="at least 2"):
        generate(1, docs=1)


def test_the_shipped_configs_build_their_splits_and_a_missing_entry_count_is_named():
    for name in ("code/docs_team", "code/docs_agent"):
        cfg = load_config(config_path(name), ["data.train.n=50"])
        train, held_out = build_tasks(cfg)
        assert len(train) == 50 and len(held_out) == 48 and not {t.question for t in train} & {t.question for t in held_out}
        assert all(len(t.meta["context"]) == 24 for t in train + held_out)
    cfg = load_config(config_path("code/docs_agent"), ["data.world.context_docs=0"])
    with pytest.raises(ConfigError, match="data.world.context_docs"):
        build_tasks(cfg)


def test_the_team_splits_the_entries_pays_the_reader_that_found_the_entry_and_the_coder_its_pass_rate():
    task, right = _linear(generate(40, seed=5, levels=[1]))
    entries = task.meta["context"]
    at = next(i for i, e in enumerate(entries) if holds(e, task))
    chunk, pos = divmod(at, 8)
    readers = ["<doc>1</doc>"] * 3
    readers[chunk] = f"<doc>{pos + 1}</doc>"
    wf = CodeDocsTeam(docs_per_reader=8)
    tools = wf.tools(Services(SandboxConfig()))
    tr, engine = run_scripted(wf, task, {"reader": readers, "coder": [right]}, tools)
    assert [c.agent for c in tr.calls] == ["reader"] * 3 + ["coder"]
    shown = [g.messages[-1]["content"] for a, g in engine.seen if a == "reader"]
    for i, prompt in enumerate(shown):  # each reader sees its 8 entries and the task, nothing else
        assert sum(e in prompt for e in entries) == 8 and all(e in prompt for e in entries[8 * i: 8 * i + 8])
        assert prompt.endswith(f"Task: {task.question}")
    coder_prompt = engine.seen[-1][1].messages[-1]["content"]
    picks = [entries[8 * i] if i != chunk else entries[at] for i in range(3)]
    assert sum(e in coder_prompt for e in entries) == 3 and all(p in coder_prompt for p in picks)
    credits = [c.credit for c in tr.calls]
    assert credits[chunk] == 1.0 and [credits[i] for i in range(3) if i != chunk] == [None, None]
    assert credits[3] == 1.0 and tr.metrics["pass_rate"] == tr.metrics["outcome"] == 1.0
    assert tr.metrics["reader/accuracy"] == tr.metrics["coder/covered"] == 1.0
    # the holding reader picks another entry: it earns 0, the coder cannot see the asked entry
    readers[chunk] = f"<doc>{(pos + 1) % 8 + 1}</doc>"
    wrong = f"<code>def {task.meta['fn_name']}(x):\n    return x</code>"
    tr2, _ = run_scripted(wf, task, {"reader": readers, "coder": [wrong]}, tools)
    assert tr2.calls[chunk].credit == 0.0 and tr2.metrics["coder/covered"] == 0.0
    assert tr2.calls[3].credit == tr2.metrics["pass_rate"] < 1.0
    # without found credit every reader earns the pass rate
    tr3, _ = run_scripted(CodeDocsTeam(found_credit=False), task, {"reader": readers, "coder": [right]}, tools)
    assert [c.credit for c in tr3.calls] == [1.0] * 4


def test_the_single_coder_reads_every_entry_in_one_call_with_the_team_coders_examples():
    task, right = _linear(generate(40, seed=6, levels=[1]))
    wf = CodeDocsAgent()
    tools = wf.tools(Services(SandboxConfig()))
    tr, engine = run_scripted(wf, task, {"coder": [right]}, tools)
    assert [c.agent for c in tr.calls] == ["coder"] and tr.calls[0].credit == 1.0 and tr.metrics["all_passed"] == 1.0
    msgs = engine.seen[0][1].messages
    assert all(e in msgs[-1]["content"] for e in task.meta["context"])
    team_coder_examples = run_scripted(CodeDocsTeam(), task, {"reader": ["<doc>1</doc>"] * 3, "coder": [right]},
                                       tools)[1].seen[-1][1].messages[:-1]
    assert msgs[:-1] == team_coder_examples  # the same system prompt and worked examples

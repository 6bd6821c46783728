"""A run says what its tasks hold: a split short of its `n`, training tasks mixed unlike the held-out
ones, and how often a training task comes back."""

from __future__ import annotations

import random

from masrl.config import DataSourceConfig
from masrl.data.mix import data_report, kind_of, mix, sampling_shift, shift
from masrl.data.tasks import Task
from masrl.families import more_tasks_hint
from masrl.families.code.docs_tasks import generate
from masrl.families.qa.world import world_tasks


def _tasks(kinds: dict[str, int]) -> list[Task]:
    return [Task(f"{k}-{i}", f"{k} {i}?", "a", {"kind": k}) for k, n in kinds.items() for i in range(n)]


def test_the_qa_world_is_finite_and_its_held_out_draw_leaves_training_another_mix():
    held_out = world_tasks(120, seed=2, levels=[1], world_docs=300, world_seed=0)
    train = world_tasks(2000, seed=1, levels=[1], world_docs=300, world_seed=0,
                        exclude={t.question for t in held_out})
    assert len(train) == 360 and {kind_of(t) for t in train} == {"born", "employer", "headquarters", "mayor"}
    lines = data_report(train=train, held_out=held_out, validation=[], train_n=2000, eval_n=120, draws=60 * 72,
                        hint=more_tasks_hint(DataSourceConfig(source="qa_world")))
    assert lines[0].startswith("data: 360 training tasks (") and "120 held-out (" in lines[0]
    assert lines[1] == "data: 4,320 training draws (12.0 per task)"
    short = [x for x in lines if x.startswith("warning: data.train.n")]
    assert len(short) == 1 and "asks for 2,000 tasks; the source gives 360" in short[0]
    assert "data.world.docs" in short[0] and "Set data.train.n: 360" in short[0]
    mixed = [x for x in lines if x.startswith("warning: the training tasks are mixed unlike")]
    assert len(mixed) == 1
    assert mix(held_out)["headquarters"] > 2 * mix(train)["headquarters"]  # 23% of held-out, 9% of training
    assert "headquarters 9%" in mixed[0] and "headquarters 23%" in mixed[0]
    assert not any("data.eval.n" in x for x in lines)  # the held-out set got its 120


def test_matching_mixes_and_full_splits_say_nothing_more():
    train, held_out = _tasks({"a": 60, "b": 40}), _tasks({"a": 13, "b": 7})
    lines = data_report(train=train[:90], held_out=held_out, validation=train[90:], train_n=100, eval_n=20, draws=50)
    assert lines == ["data: 90 training tasks (a 67%, b 33%), 10 held back for validation, 20 held-out (a 65%, b 35%)",
                     "data: 50 training draws (no task drawn twice)"]
    assert abs(shift(mix(train), mix(held_out)) - 0.05) < 1e-9


def test_a_short_held_out_split_and_a_kind_missing_from_training_are_named():
    lines = data_report(train=_tasks({"a": 10}), held_out=_tasks({"b": 5}), validation=[], train_n=None, eval_n=8,
                        draws=0)
    assert lines[0] == "data: 10 training tasks (a 100%), 5 held-out (b 100%)"
    assert "warning: data.eval.n asks for 8 tasks; the source gives 5. Set data.eval.n: 5" in lines[1]
    assert "(100% of tasks would have to change kind, where drawing 5 held-out tasks" in lines[2]


def test_a_task_kind_falls_back_to_its_type_then_its_level():
    assert kind_of(Task("1", "q", "a", {"type": "two_hop", "level": 2})) == "two_hop"
    assert kind_of(Task("1", "q", "a", {"level": 3})) == "3"
    assert kind_of(Task("1", "q", "a", {})) is None and mix([Task("1", "q", "a", {})]) == {}


def test_held_out_figures_are_broken_down_by_kind_when_there_are_several():
    from masrl.driver.observe.metrics import eval_line

    line = eval_line({"outcome": 0.5, "reward": 0.5, "failed": 0,
                      "by_kind": {"born": {"outcome": 0.75, "traces": 4}, "mayor": {"outcome": 0.25, "traces": 4}}})
    assert line.splitlines()[1] == "  by kind: born 0.750 (4), mayor 0.250 (4)"


def test_a_small_held_out_set_of_many_kinds_is_not_called_unlike_its_own_source():
    """code_docs draws both splits alike from twenty kinds: 120 held-out tasks differ from 1,936 training ones by
    about what sampling gives, and the run says nothing; the QA world's real shift (above) still warns."""
    held_out = generate(120, seed=2, levels=[1, 2])
    train = generate(1936, seed=1, levels=[1, 2], exclude={t.question for t in held_out})
    a, b = mix(train), mix(held_out)
    assert len(a) == 20 and shift(a, b) > 0.10  # past the flat threshold...
    assert shift(a, b) < 2 * sampling_shift(a, 120)  # ...but within what drawing 120 tasks gives
    lines = data_report(train=train, held_out=held_out, validation=[], train_n=1936, eval_n=120, draws=100)
    assert not any("mixed unlike" in x for x in lines)


def test_the_expected_sampling_shift_matches_drawing_the_tasks():
    rng = random.Random(0)
    m = {"a": 0.5, "b": 0.3, "c": 0.2}
    draws = [mix(_tasks(dict(zip(m, _counts(rng.choices(list(m), weights=list(m.values()), k=100)))))) for _ in range(400)]
    measured = sum(shift(m, d) for d in draws) / len(draws)
    assert abs(measured - sampling_shift(m, 100)) < 0.15 * sampling_shift(m, 100)
    assert sampling_shift(m, 0) == 0.0 and sampling_shift(m, 400) < sampling_shift(m, 100)


def _counts(picks: list[str]) -> list[int]:
    return [picks.count(k) for k in ("a", "b", "c")]

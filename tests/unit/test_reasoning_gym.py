"""source: reasoning_gym — the library's questions and scorers as they are, and errors that name the key."""

from __future__ import annotations

import pytest

rg = pytest.importorskip("reasoning_gym")

from masrl.config import DataSourceConfig  # noqa: E402
from masrl.errors import ConfigError  # noqa: E402
from masrl.families import check_source, load_tasks  # noqa: E402
from masrl.families.reasoning_gym import tasks as R  # noqa: E402

MIX = {"datasets": {
    "basic_arithmetic": {"weight": 2, "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}},
    "leg_counting": {"config": {"min_animals": 1, "max_animals": 2}},
    "decimal_arithmetic": {"config": {"max_terms": 2}},  # its scorer reads its config (the precision)
    "word_sorting": {"config": {"max_words": 3}},  # partial credit in its scorer
    "spell_backward": {},
}}


def test_every_answer_is_scored_as_the_library_scores_its_own_entry():
    tasks = R.generate(60, seed=3, options=MIX)
    assert {t.meta["data_source"] for t in tasks} == set(MIX["datasets"])
    for t in tasks:
        name = t.meta["reasoning_gym"]["dataset"]
        ds = rg.create_dataset(name, seed=3, size=1, **MIX["datasets"][name].get("config", {}))
        entry = {"question": t.question, "answer": t.answer, "metadata": t.meta["reasoning_gym"]["metadata"]}
        for guess in (t.answer, t.answer + "0", t.answer[:-1], "", None, "7"):
            assert R.score(guess, t) == ds.score_answer(guess, entry), (name, guess)
        assert R.score(t.answer, t) == 1.0
    # word_sorting pays part of a near-miss; the score is the library's, not a right/wrong of masrl's own
    ws = next(t for t in tasks if t.meta["data_source"] == "word_sorting" and len(set(t.answer.split(", "))) == 3)
    assert 0 < R.score(", ".join(reversed(ws.answer.split(", "))), ws) < 1


def test_draws_are_seeded_distinct_and_skip_the_held_out_questions_and_the_examples():
    held_out = R.generate(40, seed=2, options=MIX)
    train = R.generate(300, seed=1, options=MIX, exclude={t.question for t in held_out})
    again = R.generate(300, seed=1, options=MIX, exclude={t.question for t in held_out})
    assert [t.question for t in train] == [t.question for t in again]
    assert len({t.question for t in train}) == len(train) == 300
    assert not {t.question for t in train} & {t.question for t in held_out}
    examples = {e["question"] for e in train[0].meta["examples"]}
    assert len(train[0].meta["examples"]) == len(MIX["datasets"])  # one worked example of each dataset
    assert not examples & ({t.question for t in train} | {t.question for t in held_out})
    assert {e["dataset"] for e in train[0].meta["examples"]} == set(MIX["datasets"])


def test_the_weights_are_the_library_composites():
    tasks = R.generate(400, seed=5, options={"datasets": {"spell_backward": {"weight": 3}, "word_sorting": {}}})
    share = sum(t.meta["data_source"] == "spell_backward" for t in tasks) / len(tasks)
    assert 0.65 < share < 0.85  # 3:1


def test_an_unknown_dataset_names_the_close_matches_and_the_key():
    src = DataSourceConfig(source="reasoning_gym", options={"datasets": {"basic_arithmatic": {}}})
    with pytest.raises(ConfigError, match=r"data\.train\.options\.datasets\.basic_arithmatic: .*no dataset "
                                          r"'basic_arithmatic'; did you mean basic_arithmetic"):
        check_source(src, "data.train")


@pytest.mark.parametrize("config, says", [
    ({"min_terms": 0}, "AssertionError: min_terms must be positive"),
    ({"min_digits": 3, "max_digits": 1}, "max_digits must be >= min_digits"),
    ({"min_termz": 2}, "unexpected keyword argument 'min_termz'"),
])
def test_a_config_the_library_refuses_is_reported_with_its_message_and_the_key(config, says):
    src = DataSourceConfig(source="reasoning_gym", options={"datasets": {"basic_arithmetic": {"config": config}}})
    with pytest.raises(ConfigError) as err:
        check_source(src, "data.eval")
    assert "data.eval.options.datasets.basic_arithmetic.config" in str(err.value) and says in str(err.value)


def test_options_are_typed_seed_and_size_are_the_splits():
    bad = [({"datasets": {}}, "at least one"), ({"datasets": {"gcd": {"wieght": 2}}}, "wieght"),
           ({"datasets": {"gcd": {"weight": 0}}}, "weight"), ({"dataset": ["gcd"]}, "dataset"),
           ({"datasets": {"gcd": {"config": {"seed": 4}}}}, "config.seed: masrl sets each split's seed")]
    for options, says in bad:
        with pytest.raises(ConfigError, match=says):
            check_source(DataSourceConfig(source="reasoning_gym", options=options), "data.train")
    # a list of names takes each dataset at its defaults
    tasks = load_tasks(DataSourceConfig(source="reasoning_gym", n=6, seed=1, options={"datasets": ["gcd", "lcm"]}))
    assert len(tasks) == 6 and {t.meta["kind"] for t in tasks} <= {"gcd", "lcm"}


def test_other_sources_still_refuse_options():
    with pytest.raises(ConfigError, match="takes no options"):
        check_source(DataSourceConfig(source="arithmetic", options={"datasets": ["gcd"]}), "data.train")


def test_prompts_show_one_example_of_each_dataset_in_the_librarys_answer_format():
    from masrl.families.reasoning_gym import roles as P

    task = R.generate(1, seed=1, options=MIX)[0]
    shown = P.solver_examples(task)
    assert [a for _, a in shown] == [f"<answer>{e['answer']}</answer>" for e in task.meta["examples"]]
    checker = dict(P.checker_examples(task))
    arith = next(e for e in task.meta["examples"] if e["dataset"] == "basic_arithmetic")
    legs = next(e for e in task.meta["examples"] if e["dataset"] == "leg_counting")
    spell = next(e for e in task.meta["examples"] if e["dataset"] == "spell_backward")
    assert checker[arith["question"]] == f"<expr>{arith['metadata']['expression']}</expr>"
    assert checker[spell["question"]] == "<expr>none</expr>"
    from masrl.tools.calculator import calculate

    legs_expr = checker[legs["question"]][len("<expr>"):-len("</expr>")]
    assert calculate(legs_expr) == int(legs["answer"])  # the legs from the library's own table add up
    fin = P.finalizer_examples(task)
    assert len(fin) == 2 and "Calculator: none" in fin[1][0]


def test_the_calculator_solver_parses_an_answer_alone_or_an_expression_and_an_answer():
    from masrl.families.reasoning_gym.roles import parse_calc_solver
    from masrl.families.reasoning_gym.workflows import _ARITHMETIC

    assert parse_calc_solver("<answer>nus</answer>").ok
    both = parse_calc_solver("<expr>3 * 4</expr><answer>12</answer>")
    assert both.ok and both.fields == {"expr": "3 * 4", "answer": "12"}
    assert not parse_calc_solver("<expr>3 * 4</expr>").ok
    assert [bool(_ARITHMETIC.fullmatch(t)) for t in ("14 * 43", "-1 - 2", "-3", "12", "a, b", "1, 2")] == \
        [True, True, False, False, False, False]


def _all_datasets() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(n for n in DATASETS if n != "composite")  # the mix itself, not a dataset


def test_every_datasets_worked_example_gets_full_marks_from_its_own_scorer():
    """All 106 of the library's datasets (composite is the mix): the example a prompt shows is answered with what
    the dataset's own scorer gives 1.0, not ``None`` (open-ended datasets: their metadata's answer, or a search
    with the library's own rules for rush_hour and boxnet)."""
    names = _all_datasets()
    assert len(names) >= 100
    short = []
    for name in names:
        [example] = R._examples(R.parse_options({"datasets": {name: {}}}, "data.train.options"))
        ds = R._dataset(name, R._key({}), seed=R.EXAMPLES_SEED, size=R.EXAMPLE_DRAWS)
        entry = next(ds[i] for i in range(R.EXAMPLE_DRAWS) if ds[i]["question"] == example["question"])  # the library's
        if ds.score_answer(example["answer"], entry) < 1.0 or example["answer"] == "None":
            short.append(name)
    assert short == []

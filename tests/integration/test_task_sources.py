"""A user's own task source by 'module:function', end to end: read, checked, trained on."""

from __future__ import annotations

import asyncio

import pytest
from tinycfg import prepared_trainer, tiny_config

from masrl.config import load_config
from masrl.driver.checks import check_run
from masrl.errors import ConfigError, DataError
from masrl.families import build_tasks, load_tasks


def _data(tmp_path, train: dict, evals: dict | None = None) -> dict:
    data = tiny_config("math/solver", tmp_path / "run", steps=1)
    data["data"] = {"train": train, "eval": evals or {"source": "helpers:word_sums", "n": 2, "seed": 100}}
    return data


def test_a_source_of_your_own_gives_the_tasks_and_a_run_trains_on_them(tmp_path):
    train = {"source": "helpers:word_sums", "n": 6, "seed": 3, "options": {"offset": 10}}
    cfg = load_config(data=_data(tmp_path, train))
    train_tasks, eval_tasks = build_tasks(cfg)
    # dict rows read as math rows (its `problem` and `uid` aliases), the first n kept
    assert [t.id for t in train_tasks] == [f"sum-3-{i}" for i in range(6)]
    assert train_tasks[1].question.startswith("Ada has 4 apples and gets 12 more") and train_tasks[1].answer == "16"
    assert [t.id for t in eval_tasks] == ["sum-100-0", "sum-100-1"]
    # a held-out question never trains, and a ready-made Task passes as it is
    overlap = {"source": "helpers:word_sums", "seed": 100}  # no n: its 10 rows and the ready-made task
    got = load_tasks(load_config(data=_data(tmp_path, overlap)).data.train,
                     exclude={t.question for t in eval_tasks}, key="data.train")
    assert {t.id for t in got} == {f"sum-100-{i}" for i in range(2, 10)} | {"ready-made"}
    tr, _, _ = prepared_trainer(cfg.model_dump(), tmp_path / "run")
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["traces"] == 2 * 3 and {t.task_id for t in tr.last_traces} <= {t.id for t in train_tasks}
    tr.rt.close()


@pytest.mark.parametrize("source, options, match", [
    ("helpers:no_such_source", {}, "data.train.source 'helpers:no_such_source': module 'helpers' has no attribute"),
    ("arithmetc", {}, "data.train.source: unknown source 'arithmetc'; did you mean arithmetic\\? use one of "
                      "arithmetic, code_docs"),
    ("arithmetic", {"offset": 1}, "data.train.options: source 'arithmetic' takes no options"),
    ("helpers:TextHashReward", {}, None),  # callable, but not a source: its failure is named below
])
def test_a_bad_source_is_named_before_anything_loads(tmp_path, source, options, match):
    cfg = load_config(data=_data(tmp_path, {"source": source, "options": options}))
    if match is None:
        with pytest.raises(DataError, match="data.train.source .helpers:TextHashReward. returned TextHashReward"):
            build_tasks(cfg)
        return
    with pytest.raises(ConfigError, match=match):
        check_run(cfg)


def test_a_bad_row_from_your_source_names_the_source_and_the_row(tmp_path):
    cfg = load_config(data=_data(tmp_path, {"source": "helpers:broken_rows"}))
    with pytest.raises(DataError, match=r"data.train.source 'helpers:broken_rows' row 1: no answer; give one of the fields"):
        build_tasks(cfg)


def test_a_run_says_when_its_training_split_is_short_of_its_n_and_how_often_a_task_comes_back(tmp_path):
    import io
    import json

    from rich.console import Console

    from masrl.driver.run.loop import Trainer

    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(5)))
    data = _data(tmp_path, {"source": "file", "path": str(rows), "n": 20})
    data["train"]["steps"] = 5
    out = io.StringIO()
    tr = Trainer(load_config(data=data), console=Console(file=out, width=400), run_dir=tmp_path / "run")
    tr.prepare(resume=False)
    tr.rt.close()
    log = out.getvalue()
    assert "[masrl] data: 5 training tasks, 2 held-out\n" in log  # file rows carry no kind: no mix is shown
    assert "[masrl] data: 10 training draws (2.0 per task)" in log  # 5 steps x 2 tasks a step
    assert ("[masrl] warning: data.train.n asks for 20 tasks; the source gives 5 once the held-out questions are "
            "removed. The file holds no more rows. Set data.train.n: 5") in log
    kept = json.loads((tmp_path / "run" / "data.json").read_text())  # the run's folder keeps what the log said
    assert kept["train_tasks"] == 5 and kept["held_out_tasks"] == 2 and kept["train_mix"] == {}
    assert [f"[masrl] {x}" for x in kept["report"]] == [x for x in log.splitlines() if x.startswith("[masrl] data:")
                                                        or x.startswith("[masrl] warning: data")]


def test_a_seating_given_to_a_workflow_that_seats_no_players_is_named_with_those_that_do(tmp_path):
    data = tiny_config("hidden_sum/shared", tmp_path / "run", steps=1)
    check_run(load_config(data=data))  # as shipped: no seating, no error
    data["data"]["train"]["options"] = {"players": ["a", "b"]}
    with pytest.raises(ConfigError, match=r"data.train.options: the seating of source 'episodes' is read by the "
                                          r"workflows that seat players \(openspiel, pettingzoo, textarena\), not 'env'"):
        check_run(load_config(data=data))
    game = tiny_config("games/spiel_kuhn_poker_selfplay", tmp_path / "game", steps=1)
    game["data"]["train"]["options"] = {"seats": 2}  # the games family checks its seating's keys
    with pytest.raises(ConfigError, match="source 'episodes' takes players, swap_seats.*not seats"):
        check_run(load_config(data=game))


def test_a_row_kind_is_a_registered_one_the_framework_or_a_familys(tmp_path):
    """``data.X.kind`` is read through the registry the families add to: a family's kind (qa) reads a file's rows,
    beside it a misspelled kind is refused by the run's check, naming the key and the kinds there are."""
    import json

    rows = tmp_path / "qa.jsonl"
    rows.write_text("\n".join(json.dumps({"id": f"q{i}", "question": f"Who founded Vexora {i}?",
                                          "answers": ["Ada Lin"], "supporting": ["doc-1"]}) for i in range(3)))
    good = load_tasks(load_config(data=_data(tmp_path, {"source": "file", "path": str(rows), "kind": "qa"})).data.train)
    assert [t.answer for t in good] == [["Ada Lin"]] * 3 and good[0].meta["supporting"] == ["doc-1"]
    bad = load_config(data=_data(tmp_path, {"source": "file", "path": str(rows), "kind": "qaa"}))
    with pytest.raises(ConfigError, match=r"data\.train\.kind: unknown row kind 'qaa'; use one of code, math, qa"):
        check_run(bad)

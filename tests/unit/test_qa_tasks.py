"""QA tasks: the world generator's tasks and the JSONL/Parquet loader, with errors that name the row."""

import json

import pytest

from masrl.errors import DataError
from masrl.families.qa.tasks import load_qa_tasks
from masrl.families.qa.world import ensure_world, world_tasks


def test_world_tasks_are_seeded_split_by_level_and_carry_supporting_facts(tmp_path):
    a = world_tasks(20, seed=1, world_docs=60, world_seed=0, levels=[1])
    assert [t.question for t in a] == [t.question for t in world_tasks(20, seed=1, world_docs=60, world_seed=0, levels=[1])]
    assert all(t.meta["type"] == "one_hop" and len(t.meta["supporting"]) == 1 for t in a)
    two = world_tasks(10, seed=1, world_docs=60, world_seed=0, levels=[2])
    assert all(t.meta["type"] == "two_hop" and len(t.meta["supporting"]) == 2 and t.meta["bridge"] for t in two)
    held = {t.question for t in a}
    assert not held & {t.question for t in world_tasks(40, seed=2, world_docs=60, world_seed=0, levels=[1], exclude=held)}
    d = ensure_world(60, 0, str(tmp_path))
    ids = {json.loads(line)["id"] for line in (d / "corpus.jsonl").read_text().splitlines()}
    assert all(set(t.meta["supporting"]) <= ids for t in a + two)  # the facts are in the searched corpus
    assert ensure_world(60, 0, str(tmp_path)) == d  # written once


def test_loader_reads_answers_and_supporting_facts(tmp_path):
    p = tmp_path / "qa.jsonl"
    rows = [{"id": "h1", "question": "Who?", "answers": ["Ann", "Ann B."], "supporting_facts": [["Ann", 0], ["Bo", 2]],
             "type": "bridge", "data_source": "hotpot"},
            {"question": "When?", "golden_answers": "1950", "context": "Ann was born in 1950."},
            {"prompt": [{"role": "user", "content": "Where?"}], "reward_model": {"ground_truth": {"target": ["Oslo"]}}}]
    p.write_text("\n".join(json.dumps(r) for r in rows))
    t = load_qa_tasks(p)
    assert t[0].answer == ["Ann", "Ann B."] and t[0].meta["supporting"] == ["Ann", "Bo"] and t[0].id == "h1"
    assert t[0].meta["data_source"] == "hotpot" and t[0].meta["type"] == "bridge"
    assert t[1].answer == ["1950"] and t[1].meta["context"].startswith("Ann")
    assert t[2].question == "Where?" and t[2].answer == ["Oslo"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "Who?", "answers": ["Ann"], "supporting": ["doc-1"]}]),
                   tmp_path / "qa.parquet")
    assert load_qa_tasks(tmp_path / "qa.parquet")[0].meta["supporting"] == ["doc-1"]


def test_loader_errors_name_the_line_and_the_fix(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"question": "Who?", "answers": ["A"]}) + "\n" + json.dumps({"question": "Why?"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: no answer; give `answers`"):
        load_qa_tasks(p)
    p.write_text(json.dumps({"question": "Who?", "answers": [" "]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: field 'answers' holds no non-empty answer"):
        load_qa_tasks(p)
    p.write_text(json.dumps({"answers": ["A"]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: no question"):
        load_qa_tasks(p)

import json

import pytest

from masrl.data.answers import answers_equivalent, extract_gold, to_number
from masrl.data.loader import load_math_tasks
from masrl.errors import DataError
from masrl.families.math import arithmetic


def test_arithmetic_is_seeded_and_distinct():
    a = arithmetic.generate(50, seed=3, levels=[1, 2, 3, 4])
    b = arithmetic.generate(50, seed=3, levels=[1, 2, 3, 4])
    assert a == b
    assert len({t.question for t in a}) == 50
    assert {t.meta["level"] for t in a} == {1, 2, 3, 4}
    assert a != arithmetic.generate(50, seed=4, levels=[1, 2, 3, 4])


def test_arithmetic_answers_are_right():
    for t in arithmetic.generate(200, seed=0, levels=[1, 2, 3, 4]):
        assert float(t.answer) == int(t.answer) and int(t.answer) >= 0


def test_exclude_keeps_eval_out_of_train():
    ev = arithmetic.generate(64, seed=2)
    tr = arithmetic.generate(300, seed=1, exclude={t.question for t in ev})
    assert not {t.question for t in ev} & {t.question for t in tr}


def test_gold_extraction():
    assert extract_gold("Half of 10 is 5.\n#### 5") == "5"
    assert extract_gold("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_gold(" 42 ") == "42"


def test_equivalence():
    assert answers_equivalent("7", "7") and answers_equivalent("7.0", "#### 7")
    assert answers_equivalent("1,000", "1000") and answers_equivalent("$5", "5")
    assert answers_equivalent("\\frac{1}{2}", "0.5")
    assert not answers_equivalent("8", "7") and not answers_equivalent(None, "7") and not answers_equivalent("", "7")
    assert not answers_equivalent("x", "7")
    assert to_number("I have $1,200.50 left") == 1200.5


def test_loader_aliases_jsonl(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [{"problem": "1+1?", "solution": "so 2\n#### 2"}, {"query": "2+2?", "target": "\\boxed{4}", "id": "x"},
            {"question": "3+3?", "ground_truth": 6}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tasks = load_math_tasks(p)
    assert [(t.question, t.answer) for t in tasks] == [("1+1?", "2"), ("2+2?", "4"), ("3+3?", "6")]
    assert tasks[1].id == "x"


def test_loader_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"question": ["a?", "b?"], "answer": ["1", "2"]}), p)
    assert [t.answer for t in load_math_tasks(p)] == ["1", "2"]


def test_loader_names_the_bad_row(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"question": "ok?", "answer": "1"}\n{"question": "no answer here"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: no answer; give one of the fields answer"):
        load_math_tasks(p)
    p.write_text('{"answer": "1"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: no question"):
        load_math_tasks(p)
    p.write_text('{"question": "x", \n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: not valid JSON"):
        load_math_tasks(p)
    with pytest.raises(DataError, match="does not exist"):
        load_math_tasks(tmp_path / "missing.jsonl")

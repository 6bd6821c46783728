import asyncio

import pytest

from masrl.data import checkers
from masrl.data.test_spec import parse_spec
from masrl.errors import DataError
from masrl.families.code.extract import extract_code
from masrl.families.code.tasks import humaneval_program, load_code_tasks, load_humaneval
from masrl.sandbox import Limits
from masrl.tools.code_tests import CodeVerifier, verify

L = Limits(wall_s=6, cpu_s=4, case_timeout_s=1.0)
ADD = parse_spec({"kind": "stdio", "cases": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"},
                                             {"input": "2 2\n", "output": "5"}]})


def test_stdio_cases_in_one_process_with_per_case_verdicts():
    r = verify("a, b = map(int, input().split())\nprint(a + b)", ADD, L)
    assert r.verdicts == ["OK", "OK", "WA"] and r.pass_rate == pytest.approx(2 / 3) and not r.all_passed
    assert "expected '5', got '4" in r.first_failure


def test_per_case_time_limit_leaves_other_cases_judged():
    r = verify("a, b = map(int, input().split())\nwhile a == 5:\n    pass\nprint(a + b)", ADD, L)
    assert r.verdicts == ["OK", "TLE", "WA"]


def test_call_based_and_value_normalisation():
    spec = parse_spec({"kind": "call", "fn_name": "f", "cases": [
        {"args": [1, 2], "expected": [1, 2]}, {"args": [0.1, 0.2], "expected": 0.3}, {"args": [3], "expected": 3}]})
    code = "def f(*a):\n    if len(a) == 1: return a[0]\n    if isinstance(a[0], float): return a[0] + a[1]\n    return tuple(a)"
    assert verify(code, spec, L).verdicts == ["OK", "OK", "OK"]
    r = verify("def f(*a):\n    return 1 / 0", spec, L)
    assert r.verdicts == ["RE"] * 3 and "ZeroDivisionError" in r.first_failure
    r = verify("def g(): pass", spec, L)
    assert r.verdicts == ["RE"] * 3 and "no function named 'f'" in r.first_failure


def test_compile_error_memory_and_output_verdicts():
    assert verify("def (", ADD, L).verdicts == ["CE"] * 3
    r = verify("x = bytearray(10**10)", ADD, L)
    assert set(r.verdicts) == {"MLE"}
    r = verify("while True:\n    print('y' * 100)", ADD, Limits(output_bytes=1000, case_timeout_s=2, wall_s=8))
    assert r.verdicts[0] == "OLE"


def test_assert_spec_like_humaneval():
    spec = parse_spec({"kind": "assert", "test": "def check(c):\n    assert c(2, 3) == 5", "entry_point": "add"})
    assert verify("def add(a, b):\n    return a + b", spec, L).verdicts == ["OK"]
    assert verify("def add(a, b):\n    return a - b", spec, L).verdicts == ["WA"]
    assert verify("def add(a, b):\n    while True: pass", spec, Limits(wall_s=2, cpu_s=1)).verdicts == ["TLE"]


def test_checkers():
    assert checkers.lines("1 2  \n3\n\n", "1 2\n3")
    assert not checkers.lines("1 2 3", "1 2\n3")
    assert checkers.floats("0.3333333 2", "0.33333331 2.0") and not checkers.floats("0.34", "0.33")
    assert checkers.tokens_ci("YES no", "yes NO") and not checkers.tokens_ci("yes", "yes yes")
    assert checkers.tokens_unordered("3 1 2", "1 2 3") and not checkers.tokens_unordered("1 1 2", "1 2 2")
    assert checkers.exact("a\n", "a\n") and not checkers.exact("a", "a\n")


def test_malformed_specs_name_the_field():
    with pytest.raises(DataError, match=r"row 3: field 'tests'.kind"):
        parse_spec({"kind": "fuzz"}, where="row 3: field 'tests'")
    with pytest.raises(DataError, match=r"cases\[1\].output"):
        parse_spec({"kind": "stdio", "cases": [{"input": "", "output": "1"}, {"input": "2"}]})
    with pytest.raises(DataError, match=r"fn_name"):
        parse_spec({"kind": "call", "cases": [{"args": [], "expected": 1}]})
    with pytest.raises(DataError, match=r"checker"):
        parse_spec({"kind": "stdio", "checker": "fuzzy", "cases": [{"output": "1"}]})
    with pytest.raises(DataError, match=r"not valid JSON"):
        parse_spec("{nope")


def test_code_task_loader(tmp_path):
    import json

    p = tmp_path / "code.jsonl"
    rows = [
        {"question": "add two numbers", "tests": json.dumps([{"input": "1 2", "output": "3"}])},
        {"problem": "square", "fn_name": "sq", "test_cases": [{"args": [3], "expected": 9}], "starter_code": "def sq(x):"},
        {"query": "echo", "tests": {"kind": "stdio", "cases": [{"input": "a", "output": "a"}], "checker": "exact"}},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows))
    tasks = load_code_tasks(p)
    assert [t.answer.kind for t in tasks] == ["stdio", "call", "stdio"]
    assert tasks[1].answer.fn_name == "sq" and tasks[1].meta["starter_code"] == "def sq(x):"
    p.write_text(json.dumps({"question": "x", "tests": "[{\"input\": 1"}) + "\n")
    with pytest.raises(DataError, match=r"code.jsonl:1: field 'tests' is not valid JSON"):
        load_code_tasks(p)
    p.write_text(json.dumps({"question": "x", "tests": [{"input": "1"}]}) + "\n")
    with pytest.raises(DataError, match=r"code.jsonl:1: field 'tests'.cases\[0\].expected"):
        load_code_tasks(p)
    p.write_text(json.dumps({"tests": []}) + "\n")
    with pytest.raises(DataError, match=r"code.jsonl:1: no problem statement"):
        load_code_tasks(p)


def test_extract_code():
    assert extract_code("Here:\n<code>print(1)</code>") == "print(1)"
    text = "```python\ndef f(:\n```\nfixed:\n```python\ndef f():\n    return 1\n```\n```text\nnot code\n```"
    assert extract_code(text) == "def f():\n    return 1"
    assert extract_code("```\nx = 1\n```") == "x = 1"
    assert extract_code("no code at all, sorry") is None
    assert extract_code("def f():\n    return 2") == "def f():\n    return 2"


def test_humaneval_canonical_all_pass_and_corrupted_all_fail():
    tasks = load_humaneval()
    assert len(tasks) == 164
    v = CodeVerifier(max_workers=2, limits=Limits(wall_s=10, cpu_s=6))

    async def main(completions):
        return await asyncio.gather(*(v.verify(humaneval_program(t, c), t.answer) for t, c in zip(tasks, completions)))

    good = asyncio.run(main([t.meta["canonical_solution"] for t in tasks]))
    failed = [t.id for t, r in zip(tasks, good) if not r.all_passed]
    assert failed == []
    bad = asyncio.run(main(["    return None\n"] * len(tasks)))
    passed = [t.id for t, r in zip(tasks, bad) if r.all_passed]
    assert passed == []

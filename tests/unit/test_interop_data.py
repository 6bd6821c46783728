"""verl-format parquet as verl's preprocessing writes it (math, QA, code), read unchanged."""

import json

import pytest
from verl_rows import INSTRUCTION, gsm8k_row, math_row, nq_row, write

from masrl.data.loader import load_math_tasks
from masrl.errors import DataError
from masrl.families.code.tasks import load_code_tasks


def test_verl_math_rows_load_unchanged(tmp_path):
    path = write(tmp_path / "gsm8k.parquet", [gsm8k_row(0, "Tom has 3 apples and buys 4. How many?", 7),
                                              math_row(1, "What is $2^3$?", "8")])
    tasks = load_math_tasks(path)
    assert tasks[0].question.startswith("Tom has 3 apples") and tasks[0].question.endswith(INSTRUCTION)
    assert tasks[0].answer == "7" and tasks[1].answer == "8"
    assert tasks[0].id == "0" and tasks[1].id == "1"
    assert tasks[0].meta["data_source"] == "openai/gsm8k" and tasks[0].meta["ability"] == "math"


def test_flat_rows_and_extra_info_fallbacks(tmp_path):
    rows = [{"uid": "u1", "query": "1+1?", "extra_info": {"answer": "#### 2"}},
            {"extra_info": {"question": "2+2?", "answer": "4", "index": 9}}]
    path = tmp_path / "flat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    a, b = load_math_tasks(path)
    assert (a.id, a.question, a.answer) == ("u1", "1+1?", "2")
    assert (b.id, b.question, b.answer) == ("9", "2+2?", "4")


def test_search_r1_qa_rows_keep_every_golden_answer(tmp_path):
    from masrl.data.answers import answers_equivalent

    path = write(tmp_path / "nq.parquet", [nq_row(0, "who wrote hamlet?", ["William Shakespeare", "Shakespeare"]),
                                           nq_row(1, "capital of france?", ["Paris"])])
    t0, t1 = load_math_tasks(path)
    assert t0.answer == ["William Shakespeare", "Shakespeare"] and t1.answer == "Paris"
    assert answers_equivalent("Shakespeare", t0.answer) and not answers_equivalent("Marlowe", t0.answer)


def test_verl_code_rows_load_unchanged(tmp_path):
    stdio = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}
    call = {"inputs": [[1, 2], [5, 5]], "outputs": [[3], [10]], "fn_name": "add"}
    rows = [
        {"data_source": "codecontests", "prompt": [{"role": "system", "content": "Write Python."},
                                                    {"role": "user", "content": "Read two ints, print the sum."}],
         "ability": "code", "reward_model": {"style": "rule", "ground_truth": json.dumps(stdio)},
         "extra_info": {"split": "train", "index": 0}},
        {"data_source": "apps", "prompt": [{"role": "user", "content": "Write add(a, b)."}], "ability": "code",
         "reward_model": {"style": "rule", "ground_truth": json.dumps(call)},
         "extra_info": {"split": "train", "index": 1, "starter_code": "def add(a, b):\n"}},
    ]
    path = write(tmp_path / "code.parquet", rows)
    a, b = load_code_tasks(path)
    apps = tmp_path / "apps.jsonl"  # APPS/TACO rows: input_output as a JSON string
    apps.write_text(json.dumps({"question": "Square a number.", "id": "sq",
                                "input_output": json.dumps({"inputs": ["3"], "outputs": ["9"]})}))
    (c,) = load_code_tasks(apps)
    assert a.question == "Read two ints, print the sum." and a.answer.kind == "stdio" and len(a.answer.cases) == 2
    assert a.answer.cases[1]["input"] == "3 4\n" and a.answer.cases[1]["output"] == "7\n"
    assert b.answer.kind == "call" and b.answer.fn_name == "add" and b.answer.cases[1]["expected"] == 10
    assert b.meta["starter_code"] == "def add(a, b):\n" and b.meta["data_source"] == "apps"
    assert c.id == "sq" and c.answer.kind == "stdio"


def test_bad_rows_name_file_row_and_field(tmp_path):
    path = write(tmp_path / "bad.parquet", [gsm8k_row(0, "ok?", 1), {"data_source": "x", "prompt": [{"role": "user",
                                                                                                    "content": "q?"}]}])
    with pytest.raises(DataError, match=r"bad\.parquet row 1: no answer; give one of the fields .*reward_model\.ground_truth"):
        load_math_tasks(path)
    path = write(tmp_path / "badcode.parquet", [{"prompt": "p", "reward_model": {"style": "rule", "ground_truth": "{oops"}}])
    with pytest.raises(DataError, match=r"badcode\.parquet row 0: field 'reward_model\.ground_truth' is not valid JSON"):
        load_code_tasks(path)


def test_chat_template_kwargs_reach_the_template_per_agent(tmp_path):
    """Qwen3's template reads enable_thinking; here a template that prints what it is given."""
    import asyncio

    from masrl.config import dump_config, load_config
    from masrl.driver.builder import build_runtime

    data = {"model": "tiny-random", "policies": {"p": {"chat_template_kwargs": {"enable_thinking": True, "style": "x"}}},
            "agents": {"solver": {"policy": "p", "chat_template_kwargs": {"enable_thinking": False}, "max_new_tokens": 2}},
            "workflow": {"name": "math_solver"}, "device": "cpu"}
    cfg = load_config(data=data)
    assert "enable_thinking: false" in dump_config(cfg)  # recorded in the resolved config
    rt = build_runtime(cfg, log=lambda *_: None)
    assert rt.agents["solver"].template_kwargs == {"enable_thinking": False, "style": "x"}
    worker = rt.workers[0]
    worker.held.tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "[thinking={{ enable_thinking if enable_thinking is defined else 'unset' }} style={{ style | default('-') }}]")
    seen = []
    real = worker.sampler.prompts.render_many

    def spy(prompts):  # what the worker rendered for each call of a batch
        out = real(prompts)
        seen.extend(worker.held.tokenizer.decode(ids) for _, ids in out)
        return out

    worker.sampler.prompts.render_many = spy
    from masrl.data.tasks import Task

    traces = asyncio.run(rt.controller.rollout([Task("t", "1+1?", "2")], 1, train=False))
    asyncio.run(rt.controller.aclose())
    assert not traces[0].failed and seen and "[thinking=False style=x]" in seen[0]


def test_the_plan_finds_the_workflow_s_optional_parts_once_and_the_run_reads_them_from_it():
    """check_run resolves a workflow's hooks into the plan; the runtime's controller reads the plan's (not its own
    lookup): a workflow with tools (the solver) has them, one without (the team) has none."""
    from masrl.config import load_config
    from masrl.driver.builder import build_runtime
    from masrl.driver.checks import check_run
    from masrl.families import config_path

    small = ["model=tiny-random", "device=cpu", "data.train.n=8", "data.eval.n=4"]
    with_tools = check_run(load_config(config_path("math/solver"), small))
    without = check_run(load_config(config_path("math/team_shared"), small))
    assert with_tools.hooks.tools is not None and without.hooks.tools is None
    assert without.hooks.check_split is None and without.hooks.aclose is None
    rt = build_runtime(without.cfg, log=lambda *_: None, plan=without)
    try:
        assert rt.controller.hooks is without.hooks
    finally:
        rt.close()

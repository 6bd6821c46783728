"""Rows laid out as verl's and Search-R1's preprocessing scripts write them (for the interop tests)."""

import pyarrow as pa
import pyarrow.parquet as pq

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def gsm8k_row(i, q, a):  # verl examples/data_preprocess/gsm8k.py
    return {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a)},
            "extra_info": {"split": "test", "index": i, "answer": f"Some work.\n#### {a}", "question": q}}


def math_row(i, q, boxed):  # a MATH-style source: the answer inside \boxed{}
    return {"data_source": "DigitalLearningGmbH/MATH-lighteval", "prompt": [{"role": "user", "content": q}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": boxed},
            "extra_info": {"split": "test", "index": i, "answer": f"so \\boxed{{{boxed}}}", "question": q}}


def nq_row(i, q, golds):  # Search-R1 scripts/data_process/nq_search.py
    return {"data_source": "nq", "prompt": [{"role": "user", "content": q}], "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
            "extra_info": {"split": "test", "index": i}}


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path

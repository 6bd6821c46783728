"""verl-format parquet trains unchanged: a GSM8K + MATH file reports held-out figures per source;
Search-R1 NQ rows (a list of golden answers) train too."""

import asyncio

from verl_rows import gsm8k_row, math_row, nq_row, write


def test_a_mixed_verl_dataset_trains_and_reports_each_source(tmp_path):
    from masrl.config import load_config
    from masrl.runtime.loop import Trainer
    from tinycfg import tiny_config

    def rows(offset):
        return ([gsm8k_row(offset + i, f"Tom has {offset + i} apples and buys 2. How many?", offset + i + 2)
                 for i in range(6)] + [math_row(offset + 10 + i, f"What is ${offset + i}+1$?", str(offset + i + 1))
                                       for i in range(4)])

    train, held_out = write(tmp_path / "train.parquet", rows(0)), write(tmp_path / "test.parquet", rows(100))
    data = tiny_config("math_solver", tmp_path / "run", steps=1)
    data["data"] = {"train": {"source": "file", "path": str(train)}, "eval": {"source": "file", "path": str(held_out)}}
    tr = Trainer(load_config(data=data), run_dir=tmp_path / "run")
    tr.prepare(resume=False)
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["traces"] == 6 and not rec["rollout"]["failed"]
    assert rec["policies"]["solver"]["n_seqs"] == 6
    summary = asyncio.run(tr.evaluate())
    assert set(summary["by_source"]) == {"openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval"}
    assert summary["by_source"]["openai/gsm8k"]["traces"] == 6 and summary["traces"] == 10
    asyncio.run(tr.rt.controller.aclose())


def test_search_r1_qa_rows_train_one_step(tmp_path):
    from masrl.config import load_config
    from masrl.runtime.loop import Trainer
    from tinycfg import tiny_config

    def rows(offset):
        return [nq_row(offset + i, f"who founded company {offset + i}?", [f"Founder {offset + i}", f"F{i}"])
                for i in range(4)]

    train, held_out = write(tmp_path / "nq_train.parquet", rows(0)), write(tmp_path / "nq_test.parquet", rows(50))
    data = tiny_config("math_solver", tmp_path / "run", steps=1)
    data["data"] = {"train": {"source": "file", "path": str(train)}, "eval": {"source": "file", "path": str(held_out)}}
    tr = Trainer(load_config(data=data), run_dir=tmp_path / "run")
    tr.prepare(resume=False)
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["traces"] == 6 and not rec["rollout"]["failed"] and rec["policies"]["solver"]["n_seqs"] == 6
    asyncio.run(tr.rt.controller.aclose())

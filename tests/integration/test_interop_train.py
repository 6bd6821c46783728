"""A verl-format parquet dataset with three sources (GSM8K, MATH, Search-R1 NQ) trains and reports held-out figures per source."""

import asyncio

from verl_rows import gsm8k_row, math_row, nq_row, write


def test_a_mixed_verl_dataset_trains_and_reports_each_source(tmp_path):
    from masrl.config import load_config
    from masrl.runtime.loop import Trainer
    from tinycfg import tiny_config

    def rows(offset):
        return ([gsm8k_row(offset + i, f"Tom has {offset + i} apples and buys 2. How many?", offset + i + 2)
                 for i in range(6)] + [math_row(offset + 10 + i, f"What is ${offset + i}+1$?", str(offset + i + 1))
                                       for i in range(4)]
                + [nq_row(offset + 20 + i, f"who founded company {offset + i}?", [f"Founder {i}", f"F{i}"])
                   for i in range(2)])

    train, held_out = write(tmp_path / "train.parquet", rows(0)), write(tmp_path / "test.parquet", rows(100))
    data = tiny_config("math_solver", tmp_path / "run", steps=1)
    data["data"] = {"train": {"source": "file", "path": str(train)}, "eval": {"source": "file", "path": str(held_out)}}
    tr = Trainer(load_config(data=data), run_dir=tmp_path / "run")
    tr.prepare(resume=False)
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["traces"] == 6 and not rec["rollout"]["failed"]
    assert rec["policies"]["solver"]["n_seqs"] == 6
    summary = asyncio.run(tr.evaluate())
    assert set(summary["by_source"]) == {"openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval", "nq"}
    assert summary["by_source"]["openai/gsm8k"]["traces"] == 6 and summary["traces"] == 12
    asyncio.run(tr.rt.controller.aclose())

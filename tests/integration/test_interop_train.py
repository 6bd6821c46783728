"""verl-format parquet trains unchanged: a GSM8K + MATH file reports held-out figures per source;
Search-R1 NQ rows (a list of golden answers) train too."""

import asyncio

from verl_rows import gsm8k_row, math_row, nq_row, write


def _trainer(tmp_path, train_rows, held_out_rows, stem):
    """A prepared one-step math_solver Trainer on tiny-random over two parquet files."""
    from tinycfg import tiny_config

    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    train = write(tmp_path / f"{stem}train.parquet", train_rows)
    held_out = write(tmp_path / f"{stem}test.parquet", held_out_rows)
    data = tiny_config("math/solver", tmp_path / "run", steps=1)
    data["data"] = {"train": {"source": "file", "path": str(train)}, "eval": {"source": "file", "path": str(held_out)}}
    tr = Trainer(load_config(data=data), run_dir=tmp_path / "run")
    tr.prepare(resume=False)
    return tr


def test_a_mixed_verl_dataset_trains_and_reports_each_source(tmp_path):
    def rows(offset):
        return ([gsm8k_row(offset + i, f"Tom has {offset + i} apples and buys 2. How many?", offset + i + 2)
                 for i in range(6)] + [math_row(offset + 10 + i, f"What is ${offset + i}+1$?", str(offset + i + 1))
                                       for i in range(4)])

    tr = _trainer(tmp_path, rows(0), rows(100), "")
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["traces"] == 6 and not rec["rollout"]["failed"]
    assert rec["policies"]["solver"]["n_seqs"] == 6
    summary = asyncio.run(tr.evaluate())
    assert set(summary["by_source"]) == {"openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval"}
    assert summary["by_source"]["openai/gsm8k"]["traces"] == 6 and summary["traces"] == 10
    asyncio.run(tr.rt.controller.aclose())


def test_search_r1_qa_rows_train_one_step(tmp_path):
    def rows(offset):
        return [nq_row(offset + i, f"who founded company {offset + i}?", [f"Founder {offset + i}", f"F{i}"])
                for i in range(4)]

    tr = _trainer(tmp_path, rows(0), rows(50), "nq_")
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["traces"] == 6 and not rec["rollout"]["failed"] and rec["policies"]["solver"]["n_seqs"] == 6
    asyncio.run(tr.rt.controller.aclose())

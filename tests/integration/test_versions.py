"""Every call carries the version of the weights that sampled it; an update reports how stale its
calls were and drops those past policies.X.max_staleness; masked importance sampling drops tokens."""

import asyncio
import dataclasses

import pytest
from tinycfg import prepared_trainer, tiny_config


def test_calls_carry_their_weight_version_and_stale_calls_are_dropped(tmp_path):
    data = tiny_config("math/solver", tmp_path, steps=2)
    data["policies"]["solver"]["max_staleness"] = 0
    tr, workers, _ = prepared_trainer(data, tmp_path)
    w = workers["solver"]
    rec1 = asyncio.run(tr.train_step())
    assert {c.policy_version for t in tr.last_traces for c in t.calls} == {0}
    m1 = rec1["policies"]["solver"]
    assert m1["staleness_max"] == 0 and m1["stale_dropped"] == 0 and m1["staleness_0"] == m1["n_seqs"]
    # the next step's calls are sampled by version 1; a call sampled by version 0 is one update too old
    old = next(iter(tr.last_traces)).calls[0]
    stale = dataclasses.replace(w.sampler.buffer.get(old.call_id) or _a_sample(w), call_id="stale-1", version=0, reward=1.0)
    rec2 = asyncio.run(_step_with(tr, w, stale))
    assert {c.policy_version for t in tr.last_traces for c in t.calls} == {1}
    m2 = rec2["policies"]["solver"]
    assert m2["stale_dropped"] == 1 and m2["staleness_max"] == 1 and m2["staleness_1"] == 1
    assert m2["n_seqs"] == m1["n_seqs"]  # the stale call did not train


def _a_sample(w):
    from masrl.worker.updater.batching import Sample

    return Sample("x", "solver", [1, 2, 3], [4, 5], [-1.0, -1.0], 1.0, {"task_id": "x", "agent": "solver", "turn": 0})


async def _step_with(tr, w, stale):
    """One training step with ``stale`` in the worker's buffer as it updates."""
    real = w.train_step

    def train_step(shared=None, **kw):
        w.sampler.buffer[stale.call_id] = stale
        return real(shared, **kw)

    w.train_step = train_step
    try:
        return await tr.train_step()
    finally:
        w.train_step = real


def test_masked_importance_sampling_drops_the_tokens_whose_ratio_leaves_its_band():
    """Samples whose recorded logprobs (-1.0 each) are not the trainer's: every ratio is exp(lp + 1)."""
    import torch

    from masrl.config import AlgorithmConfig, PolicyConfig
    from masrl.policies import PolicySpec
    from masrl.worker.model.held import HeldModel
    from masrl.worker.model.precision import MasterWeightsAdamW
    from masrl.worker.updater import training
    from masrl.worker.updater.batching import Sample

    def run(mis):
        host = HeldModel("tiny-random", [PolicySpec("p", "tiny-random", optim=PolicyConfig().optim)], seed=0)
        g = torch.Generator().manual_seed(0)
        samples = [Sample(f"c{i}", "p", [5, 6, 7, 8], torch.randint(3, 2000, (6,), generator=g).tolist(), [-1.0] * 6,
                          1.0, {"task_id": i // 2, "agent": "a", "turn": 0}, reward=float(i % 3)) for i in range(6)]
        opt = MasterWeightsAdamW(host.policy_parameters("p"), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        algo = AlgorithmConfig(mis=mis, micro_batch_size=8)
        m = training.Learner(host, algo, host.tokenizer.pad_token_id).train("p", samples, opt, 1.0)
        ratios = [torch.exp(torch.tensor(s.old_logprobs) + 1.0) for s in samples]
        return m, torch.cat(ratios)

    m, ratios = run((0.0, 1e30))
    assert m["mis_masked"] == 0.0
    low, high = float(ratios.quantile(0.25)), float(ratios.quantile(0.75))  # a band that holds half of them
    low, high = min(low, 1.0), max(high, 1.0)
    m2, r2 = run((low, high))
    outside = float(((r2 < low) | (r2 > high)).float().mean())
    assert m2["mis_masked"] == pytest.approx(outside) and 0 < outside < 1
    assert m2["loss"] != m["loss"]

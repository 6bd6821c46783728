"""A policy's weights change only from its own agents' calls."""

import asyncio

import pytest

from masrl.config import load_config
from masrl.runtime.loop import Trainer
from tinycfg import prepared_trainer, tiny_config

TWO = {
    "policies": {"A": {"optim": {"lr": 1e-2}}, "B": {"optim": {"lr": 1e-2}}},
    "agents": {"solver": {"policy": "A"}, "verifier": {"policy": "A", "trainable": False},
               "refiner": {"policy": "B"}, "finalizer": {"policy": "B"}},
    "workflow": {"name": "math_team"},
}
LORA = {
    "policies": {n: {"lora": {"r": 4}, "optim": {"lr": 1e-2}} for n in ("A", "B")},
    "agents": TWO["agents"],
    "workflow": {"name": "math_team"},
}


def one_step(data, tmp_path):
    tr, workers, before = prepared_trainer(data, tmp_path)
    rec = asyncio.run(tr.train_step())
    after = {p: workers[p].fingerprint(p) for p in workers}
    return rec, {p: before[p] != after[p] for p in workers}, tr


@pytest.mark.parametrize("base", [TWO, LORA], ids=["full-models", "lora-adapters"])
def test_reward_on_frozen_agent_and_other_policy_moves_only_the_other_policy(base, tmp_path):
    # variance only on the frozen verifier (policy A) and on the refiner (policy B)
    rec, changed, _ = one_step(tiny_config(base, tmp_path, steps=1, hash_agents=["verifier", "refiner"]), tmp_path)
    assert changed == {"A": False, "B": True}
    assert "A" not in rec["policies"] or rec["policies"]["A"]["optimizer_steps"] == 0 or \
        rec["policies"]["A"]["trained_tokens"] == 0


@pytest.mark.parametrize("base", [TWO, LORA], ids=["full-models", "lora-adapters"])
def test_reward_on_solver_moves_only_its_policy(base, tmp_path):
    rec, changed, tr = one_step(tiny_config(base, tmp_path, steps=1, hash_agents=["solver"]), tmp_path)
    assert changed == {"A": True, "B": False}
    # A trained only on solver calls: verifier calls are frozen and never buffered
    n_solver = sum(1 for t in tr._last_traces for c in t.calls if c.agent == "solver")
    assert rec["policies"]["A"]["n_seqs"] == n_solver


def test_lora_base_weights_stay_frozen(tmp_path):
    import torch

    cfg = load_config(data=tiny_config(LORA, tmp_path, steps=1, hash_agents=["solver", "refiner"]))
    tr = Trainer(cfg, run_dir=tmp_path)
    tr.prepare(resume=False)
    (w,) = tr.rt.workers
    base = {n: p.detach().clone() for n, p in w.host.model.named_parameters() if "lora_" not in n}
    asyncio.run(tr.train_step())
    for n, p in w.host.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(base[n], p), n

"""Every advantage estimator and loss option runs a real update on the tiny model."""

import asyncio
import math

import pytest
from tinycfg import prepared_trainer, tiny_config

VARIANTS = {
    "grpo-seq-kl-k3": {"advantage": "grpo", "aggregation": "sequence", "kl_coef": 0.1, "kl_estimator": "k3"},
    "rloo-k1-entropy": {"advantage": "rloo", "kl_coef": 0.05, "kl_estimator": "k1", "entropy_coef": 0.01},
    "reinforce_pp-baseline": {"advantage": "reinforce_pp", "baseline": "group_mean", "ppo_epochs": 2, "mini_batches": 2},
    "gae-ppo-critic": {"advantage": "gae", "gamma": 0.99, "lam": 0.9, "vf_coef": 0.5, "ppo_epochs": 2},
    "grpo-no-std-dapo-clip": {"advantage": "grpo", "std_normalize": False, "clip_eps_high": 0.28,
                              "group_key": ["task_id", "agent"]},
}


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("base", ["math/team_shared", "math/team_lora"])
def test_variant_updates(name, base, tmp_path):
    data = tiny_config(base, tmp_path, steps=1)
    data["algorithm"].update(VARIANTS[name])
    tr, workers, before = prepared_trainer(data, tmp_path)
    rec = asyncio.run(tr.train_step())
    for p, m in rec["policies"].items():
        assert all(math.isfinite(v) for v in m.values()), m
        assert m["optimizer_steps"] >= 1
        assert workers[p].fingerprint(p) != before[p]
        if VARIANTS[name].get("kl_coef"):
            assert m["kl"] >= 0 if VARIANTS[name]["kl_estimator"] == "k3" else True
        if name.startswith("gae"):
            assert "value_loss" in m and m["value_loss"] > 0
    asyncio.run(tr.rt.controller.aclose())

"""A policy's weights change only from its own agents' calls."""

import asyncio

import pytest
from tinycfg import prepared_trainer, tiny_config

from masrl.config import load_config
from masrl.driver.run.loop import Trainer

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
    n_solver = sum(1 for t in tr.last_traces for c in t.calls if c.agent == "solver")
    assert rec["policies"]["A"]["n_seqs"] == n_solver


def test_lora_base_weights_stay_frozen(tmp_path):
    import torch

    cfg = load_config(data=tiny_config(LORA, tmp_path, steps=1, hash_agents=["solver", "refiner"]))
    tr = Trainer(cfg, run_dir=tmp_path)
    tr.prepare(resume=False)
    (w,) = tr.rt.workers
    base = {n: p.detach().clone() for n, p in w.held.model.named_parameters() if "lora_" not in n}
    asyncio.run(tr.train_step())
    for n, p in w.held.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(base[n], p), n


def test_a_frozen_policy_on_a_lora_base_reuses_the_base(tmp_path):
    """A frozen full-model policy on the LoRA base's model is served by that base (adapters off):
    one model in memory, never trained, and its samples are the bare base's."""
    from masrl.config import SamplingParams
    from masrl.engines.hf import HFEngine
    from masrl.errors import ConfigError
    from masrl.messages import GenRequest
    from masrl.models import load_model

    data = {"policies": {"A": {"lora": {"r": 4}, "optim": {"lr": 1e-2}}, "B": {"lora": {"r": 4}},
                         "judge": {"frozen": True}},
            "agents": {"solver": {"policy": "A"}, "verifier": {"policy": "judge"}, "refiner": {"policy": "B"},
                       "finalizer": {"policy": "B"}},
            "workflow": {"name": "math_team"}}
    tr, workers, before = prepared_trainer(tiny_config(data, tmp_path, steps=1, hash_agents=["solver", "verifier"]),
                                           tmp_path)
    assert len(tr.rt.workers) == 1 and set(tr.rt.workers[0].policy_names) == {"A", "B", "judge"}
    assert "judge" not in tr.rt.workers[0].updater.optimizers and not tr.rt.agents["verifier"].trainable
    rec = asyncio.run(tr.train_step())
    assert "judge" not in rec["policies"]
    w = tr.rt.workers[0]
    base, tok = load_model("tiny-random", seed=tr.cfg.seed)
    prompt = w.sampler.render([{"role": "user", "content": "Is 2+2=4? Answer."}])
    req = GenRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=6), adapter=w.held.adapter_for("judge"))
    assert w.held.adapter_for("judge") is None
    assert w.sampler.engine.generate([req])[0].completion_ids == HFEngine(base, tok, [2]).generate([req])[0].completion_ids
    with pytest.raises(ConfigError, match="agents.verifier.trainable is true but its policy 'judge' is frozen"):
        bad = tiny_config(data, tmp_path, steps=1)
        bad["agents"]["verifier"]["trainable"] = True
        load_config(data=bad)

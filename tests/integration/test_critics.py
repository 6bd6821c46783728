"""Separate critics for GAE: a value model of its own (per policy, or shared), whose training never
moves a policy's weights, saved and restored with the checkpoint."""

import asyncio

import pytest
import torch
from tinycfg import prepared_trainer, tiny_config

from masrl.config import load_config
from masrl.driver.checks import check_run
from masrl.errors import ConfigError


def _data(tmp_path, critics, mapping):
    data = tiny_config("math/team_two_policies", tmp_path, steps=1)
    data["algorithm"].update({"advantage": "gae"})
    data["critics"] = critics
    for p, c in mapping.items():
        data["policies"][p]["critic"] = c
    return data


def test_a_shared_critic_trains_on_both_policies_and_not_through_them(tmp_path):
    data = _data(tmp_path, {"team": {"optim": {"lr": 1e-3}}}, {"reasoner": "team", "writer": "team"})
    tr, workers, before = prepared_trainer(data, tmp_path)
    critic = tr.rt.critics["team"]
    assert workers["reasoner"].updater.critics["reasoner"] is critic is workers["writer"].updater.critics["writer"]
    assert not workers["reasoner"].held.value_heads and not workers["writer"].held.value_heads
    head0 = critic.head.weight.detach().clone()
    rec = asyncio.run(tr.train_step())
    for p in ("reasoner", "writer"):
        m = rec["policies"][p]
        assert "critic_value_loss" in m and m["critic_grad_norm"] > 0 and "value_loss" not in m
    assert not torch.equal(critic.head.weight, head0)  # the critic learned (twice: once per policy)
    # the policies' optimizers hold none of the critic's parameters
    cids = {id(p) for p in critic.params}
    for p, w in workers.items():
        assert not cids & {id(x) for x in w.held.policy_parameters(p)}
    path = tr.save_checkpoint()
    assert (path / "critics" / "team.pt").is_file()
    saved = critic.head.weight.detach().clone()
    with torch.no_grad():
        critic.head.weight.zero_()
    tr.load_checkpoint(path)
    assert torch.equal(critic.head.weight, saved)


def test_one_critic_per_policy_and_config_errors(tmp_path):
    data = _data(tmp_path, {"c1": {}, "c2": {}}, {"reasoner": "c1", "writer": "c2"})
    tr, workers, _ = prepared_trainer(data, tmp_path)
    assert workers["reasoner"].updater.critics["reasoner"] is not workers["writer"].updater.critics["writer"]
    rec = asyncio.run(tr.train_step())
    assert all("critic_value_loss" in rec["policies"][p] for p in ("reasoner", "writer"))
    with pytest.raises(ConfigError, match="policies.writer.critic: 'c3' is not defined under `critics`"):
        load_config(data=_data(tmp_path, {"c1": {}}, {"reasoner": "c1", "writer": "c3"}))
    with pytest.raises(ConfigError, match="critics c2: no policy uses it"):
        load_config(data=_data(tmp_path, {"c1": {}, "c2": {}}, {"reasoner": "c1", "writer": "c1"}))
    grpo = _data(tmp_path, {"c1": {}}, {"reasoner": "c1"})
    grpo["algorithm"]["advantage"] = "grpo"
    with pytest.raises(ConfigError, match="a critic serves gae only"):
        check_run(load_config(data=grpo))
    mixed = _data(tmp_path, {"c1": {"model": "tiny-random-qwen2"}}, {"reasoner": "c1"})
    with pytest.raises(ConfigError, match="critics.c1: its model 'tiny-random-qwen2' has another tokenizer"):
        prepared_trainer(mixed, tmp_path / "m")

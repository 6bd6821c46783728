"""Shared experience: a policy also learns from another policy's calls (importance-weighted against
the sampler, capped); off, a policy trains on its own agents' calls only; a tokenizer mismatch is
refused at build."""

import asyncio

import pytest
from tinycfg import prepared_trainer, tiny_config

from masrl.config import load_config
from masrl.errors import ConfigError


def _calls_of(rec, policy, agents):
    return sum(a["calls"] for n, a in rec["rollout"]["agents"].items() if agents[n]["policy"] == policy)


def test_a_policy_learns_from_the_calls_it_shares_in(tmp_path):
    data = tiny_config("math/team_two_policies", tmp_path, steps=1)
    data["policies"]["writer"]["share_from"] = {"reasoner": 1.0}
    data["policies"]["writer"]["share_is_cap"] = 1.5
    tr, workers, before = prepared_trainer(data, tmp_path)
    rec = asyncio.run(tr.train_step())
    own_w, own_r = _calls_of(rec, "writer", data["agents"]), _calls_of(rec, "reasoner", data["agents"])
    w, r = rec["policies"]["writer"], rec["policies"]["reasoner"]
    assert w["shared_calls"] == own_r and w["n_seqs"] == own_w + own_r
    assert r["shared_calls"] == 0 and r["n_seqs"] == own_r  # sharing is one-way, as configured
    assert 0 < w["shared_is_weight"] <= 1.5 and 0 <= w["shared_is_capped"] <= 1  # capped IS weights


def test_half_share_is_seeded_and_partial(tmp_path):
    data = tiny_config("math/team_two_policies", tmp_path, steps=1)
    data["policies"]["writer"]["share_from"] = {"reasoner": 0.5}
    tr, _, _ = prepared_trainer(data, tmp_path)
    rec = asyncio.run(tr.train_step())
    n = rec["policies"]["writer"]["shared_calls"]
    assert 0 < n < _calls_of(rec, "reasoner", data["agents"])


def test_sharing_needs_one_tokenizer_and_a_real_source(tmp_path):
    data = tiny_config("math/team_two_policies", tmp_path, steps=1)
    data["policies"]["writer"]["model"] = "tiny-random-qwen2"
    data["policies"]["writer"]["share_from"] = {"reasoner": 1.0}
    with pytest.raises(ConfigError, match="share_from: 'reasoner' uses another tokenizer"):
        prepared_trainer(data, tmp_path)
    bad = tiny_config("math/team_two_policies", tmp_path, steps=1)
    bad["policies"]["writer"]["share_from"] = {"writer": 1.0}
    with pytest.raises(ConfigError, match="share_from: 'writer' is not another policy"):
        load_config(data=bad)


def test_policy_kl_is_zero_between_equal_policies_and_grows_once_they_differ(tmp_path):
    data = tiny_config("math/team_two_policies", tmp_path, steps=1)
    data["seed"] = 0
    data["train"]["policy_kl"] = 4
    data["policies"]["reasoner"]["optim"] = {"lr": 5e-2}
    data["policies"]["writer"]["optim"] = {"lr": 1e-5}
    tr, workers, _ = prepared_trainer(data, tmp_path)
    workers["writer"].held.core.load_state_dict(workers["reasoner"].held.core.state_dict())
    # identical weights: every KL is 0
    rec1 = asyncio.run(tr.train_step())
    assert rec1["policy_kl"]["reasoner->writer"] == pytest.approx(0.0, abs=1e-5)
    assert rec1["policy_kl"]["writer->reasoner"] == pytest.approx(0.0, abs=1e-5)
    rec2 = asyncio.run(tr.train_step())  # the reasoner moved a lot in step 1, the writer hardly
    assert abs(rec2["policy_kl"]["reasoner->writer"]) > 1e-3

"""One registry, one signature: built-in and plugin estimators of every kind, worked by hand."""

import sys
from pathlib import Path

import pytest
import torch

from masrl.algorithms.estimators import (
    EstimatorBatch,
    check_estimator,
    estimator_options,
    get_estimator,
    needs_critic,
    needs_reference,
)
from masrl.config import AlgorithmConfig
from masrl.errors import ConfigError
from masrl.worker.updater import training
from masrl.worker.updater.batching import Sample

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))


def batch(rewards, groups, lengths, values=None):
    T = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    return EstimatorBatch(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), mask, values)


def test_builtins_are_registered_with_their_traits_and_config_options():
    grpo, gae = get_estimator("grpo"), get_estimator("gae")
    assert not grpo.needs_critic and not grpo.token_level and grpo.config == ("std_normalize", "std_scope")
    assert gae.needs_critic and gae.token_level and gae.config == ("gamma", "lam")
    algo = AlgorithmConfig(advantage="grpo", std_normalize=False)
    assert estimator_options(grpo, algo) == {"std_normalize": False, "std_scope": "group"}
    b = batch([1.0, 0.0, 3.0, 3.0], [0, 0, 1, 1], [2, 2, 2, 2])
    assert grpo.fn(b, **estimator_options(grpo, algo)).tolist() == [0.5, -0.5, 0.0, 0.0]
    assert needs_critic(AlgorithmConfig(advantage="gae")) and not needs_critic(algo)
    assert needs_reference(AlgorithmConfig(kl_coef=0.1)) and not needs_reference(algo)


def test_options_a_plugin_does_not_take_are_refused_by_name():
    algo = AlgorithmConfig(advantage="custom_estimator:tail_weighted", advantage_options={"tial": 4})
    with pytest.raises(ConfigError, match="tial is not an option of estimator 'custom_estimator:tail_weighted' "
                                          r"\(it takes: tail, std_normalize\)"):
        check_estimator(algo)
    with pytest.raises(ConfigError, match="not an option of estimator 'grpo'"):
        check_estimator(AlgorithmConfig(advantage="grpo", advantage_options={"gamma": 0.5}))
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        check_estimator(AlgorithmConfig(advantage="custom_estimator:nope"))


def test_a_group_plugin_by_hand():
    est = get_estimator("custom_estimator:group_rank")
    assert not est.token_level and not est.needs_critic
    out = est.fn(batch([0.2, 0.9, 0.2, 5.0, 1.0], [0, 0, 0, 1, 2], [1] * 5))
    # group 0: ranks 0.5, 2, 0.5 of 0..2 -> 2*r/2 - 1; group 1 and 2 are singletons
    assert out.tolist() == pytest.approx([-0.5, 1.0, -0.5, 0.0, 0.0])


def test_a_token_level_plugin_by_hand():
    est = get_estimator("custom_estimator:tail_weighted")
    assert est.token_level and not est.needs_critic
    out = est.fn(batch([1.0, 0.0], [0, 0], [3, 1]), tail=1, std_normalize=False)
    assert out.tolist() == [[0.5, 0.5, 1.0], [-1.0, 0.0, 0.0]]


def test_a_critic_plugin_by_hand():
    est = get_estimator("custom_estimator:td0")
    assert est.needs_critic and est.token_level
    values = torch.tensor([[0.5, 0.25], [0.4, 9.0]])
    adv, target = est.fn(batch([1.0, 2.0], [0, 0], [2, 1], values), gamma=0.5)
    # row 0: t0: 0 + 0.5*0.25 - 0.5; t1 (last): 1 + 0 - 0.25. row 1: t0 (last): 2 - 0.4
    assert torch.allclose(adv, torch.tensor([[-0.375, 0.75], [1.6, 0.0]]))
    assert torch.allclose(target, torch.tensor([[0.125, 1.0], [2.0, 0.0]]))


def _samples(n=4):
    return [Sample(f"c{i}", "p", [1, 2], [3] * (2 + i), [-1.0] * (2 + i), 1.0, {"task_id": 0, "agent": "a", "turn": 0},
                   reward=float(i)) for i in range(n)]


def test_compute_advantages_fills_what_each_kind_returns():
    seq = _samples()
    training.compute_advantages(seq, AlgorithmConfig(advantage="custom_estimator:group_rank"))
    assert [s.advantage for s in seq] == pytest.approx([-1, -1 / 3, 1 / 3, 1]) and seq[0].token_adv is None
    tok = _samples()
    training.compute_advantages(tok, AlgorithmConfig(advantage="custom_estimator:tail_weighted",
                                                     advantage_options={"tail": 1}))
    assert [len(s.token_adv) for s in tok] == [2, 3, 4, 5] and tok[3].token_adv[-1] == 2 * tok[3].token_adv[0]
    crit = _samples()
    for s in crit:
        s.old_values = [0.5] * len(s.completion_ids)
    training.compute_advantages(crit, AlgorithmConfig(advantage="custom_estimator:td0"))
    assert crit[1].token_adv == pytest.approx([0.0, 0.0, 0.5]) and crit[1].returns == pytest.approx([0.5, 0.5, 1.0])


def test_per_agent_normalisation_by_hand():
    from masrl.algorithms.grpo import grpo_advantages

    rewards = torch.tensor([1.0, 0.0, 0.51, 0.49], dtype=torch.float64)  # two groups of one agent
    gid, agent = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 0, 0])
    by_group = grpo_advantages(rewards, gid)
    assert float(by_group[2]) == pytest.approx(float(by_group[0]), rel=1e-4)  # 0.02 apart blown up to the same +-0.707
    by_agent = grpo_advantages(rewards, gid, scope=agent)
    centred = torch.tensor([0.5, -0.5, 0.01, -0.01], dtype=torch.float64)
    assert torch.allclose(by_agent, centred / (centred.std() + 1e-6))  # one std over the agent's calls
    assert float(by_agent[2] / by_agent[0]) == pytest.approx(0.02)
    est = get_estimator("grpo")
    b = batch([1.0, 0.0, 0.51, 0.49], [0, 0, 1, 1], [1] * 4)
    b.keys = [{"agent": "verifier"}] * 4
    got = est.fn(b, **estimator_options(est, AlgorithmConfig(std_scope="agent")))
    assert torch.allclose(got, by_agent)


def test_rae_measures_each_role_against_its_own_running_baseline_kept_across_updates():
    """SPIRAL's RAE, worked by hand: a role's first update starts its baseline at its mean; the next moves it by
    alpha; roles never mix; a group whose games all ended alike still gets advantages (the group baseline gives
    none); the state is plain JSON, so a checkpoint keeps it."""
    import json

    rae = get_estimator("rae")
    keys = [{"agent": "player_0"}] * 2 + [{"agent": "player_1"}] * 2
    b1 = EstimatorBatch(torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64), torch.tensor([0, 0, 1, 1]),
                        torch.ones(4, 2), keys=keys)
    assert rae.fn(b1, alpha=0.5).tolist() == [0.0, 0.0, 0.0, 0.0]  # each role at its own mean
    state = json.loads(json.dumps(b1.state))
    assert state["baselines"]["player_0"]["mean"] == 1.0 and state["baselines"]["player_1"]["mean"] == -1.0
    b2 = EstimatorBatch(torch.tensor([-1.0, -1.0, 1.0, 1.0], dtype=torch.float64), torch.tensor([0, 0, 1, 1]),
                        torch.ones(4, 2), keys=keys, state=state)
    adv = rae.fn(b2, alpha=0.5).tolist()
    assert adv == [-1.0, -1.0, 1.0, 1.0]  # baselines 0.0 and 0.0 after one move of half the way
    grpo = get_estimator("grpo").fn(b2, std_normalize=True).tolist()
    assert grpo == [0.0, 0.0, 0.0, 0.0]  # equal rewards in each group: no advantage from the group baseline
    assert state["baselines"]["player_0"]["updates"] == 2
    mixed = rae.fn(EstimatorBatch(b2.rewards, b2.group_ids, b2.mask, keys=keys, state=json.loads(json.dumps(b1.state))),
                   alpha=0.5, group=True).tolist()
    assert mixed == [-0.5, -0.5, 0.5, 0.5]  # half the role's advantage, half the group's (0)
    with pytest.raises(ValueError, match="alpha"):
        rae.fn(b2, alpha=1.0)


"""Advantage estimators and losses against values worked out by hand."""

import math

import pytest
import torch

from masrl.algorithms.gae import gae_advantages, place_sequence_rewards
from masrl.algorithms.grouping import group_ids
from masrl.algorithms.grpo import grpo_advantages
from masrl.algorithms.losses import aggregate, kl_penalty, ppo_clip_loss, value_loss
from masrl.algorithms.reinforce_pp import reinforce_pp_advantages
from masrl.algorithms.rloo import rloo_advantages

S = 1 / math.sqrt(2)  # (r - mean) / unbiased std for a pair {0, 1}


def close(a, b, tol=1e-4):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol)


def test_group_ids_in_order_of_first_appearance():
    assert group_ids([("t1", "solver", 0), ("t2", "solver", 0), ("t1", "solver", 0)]).tolist() == [0, 1, 0]


def test_grpo_std_normalised():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 1, 1])
    assert close(grpo_advantages(r, g), [S, -S, -S, S])


def test_grpo_three_in_a_group_and_singleton():
    # group {3, 1, 2}: mean 2, unbiased std 1; singleton gets 0
    r = torch.tensor([3.0, 1.0, 2.0, 5.0])
    g = torch.tensor([0, 0, 0, 1])
    assert close(grpo_advantages(r, g), [1.0, -1.0, 0.0, 0.0])


def test_grpo_without_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert close(grpo_advantages(r, torch.tensor([0, 0, 1, 1]), std_normalize=False), [0.5, -0.5, -0.5, 0.5])


def test_grpo_uniform_group_is_zero():
    assert close(grpo_advantages(torch.tensor([0.7, 0.7, 0.7]), torch.tensor([0, 0, 0])), [0, 0, 0])


def test_rloo_leave_one_out():
    # 3 - (1+2)/2 = 1.5 ; 1 - (3+2)/2 = -1.5 ; 2 - (3+1)/2 = 0
    assert close(rloo_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0, 0, 0])), [1.5, -1.5, 0.0])
    assert close(rloo_advantages(torch.tensor([4.0]), torch.tensor([0])), [0.0])


def test_reinforce_pp_batch_normalised():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0])
    std = math.sqrt(5 / 3)  # unbiased std of 1..4
    expect = [(x - 2.5) / std for x in (1, 2, 3, 4)]
    assert close(reinforce_pp_advantages(r, torch.tensor([0, 0, 1, 1])), expect)


def test_reinforce_pp_group_baseline():
    # minus group mean: [-.5, .5, -.5, .5]; then / unbiased std sqrt(1/3)
    r = torch.tensor([1.0, 2.0, 3.0, 4.0])
    v = 0.5 / math.sqrt(1 / 3)
    assert close(reinforce_pp_advantages(r, torch.tensor([0, 0, 1, 1]), baseline="group_mean"), [-v, v, -v, v])


def test_gae_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.5)
    # t2: 1 - .7 = .3 ; t1: (0 + .7 - .6) + .5*.3 = .25 ; t0: (.6 - .5) + .5*.25 = .225
    assert close(adv, [[0.225, 0.25, 0.3]])
    assert close(ret, [[0.725, 0.85, 1.0]])


def test_gae_skips_padding_and_discounts():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    rewards = place_sequence_rewards(torch.tensor([1.0]), mask)
    assert rewards.tolist() == [[0.0, 1.0, 0.0]]
    adv, _ = gae_advantages(rewards, torch.tensor([[0.5, 0.6, 9.0]]), mask, gamma=0.9, lam=1.0)
    # t1: 1 - .6 = .4 ; t0: (0 + .9*.6 - .5) + .9*.4 = .04 + .36 = .4
    assert close(adv, [[0.4, 0.4, 0.0]])


def test_ppo_clip_four_cases():
    lp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    old = torch.zeros(4)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, clipped, ratio = ppo_clip_loss(lp, old, adv, clip_low=0.2)
    assert close(ratio, [1.5, 1.5, 0.5, 0.5])
    assert close(loss, [-1.2, 1.5, -0.5, 0.8])
    assert clipped.tolist() == [1.0, 0.0, 0.0, 1.0]


def test_ppo_asymmetric_clip():
    lp = torch.log(torch.tensor([1.5]))
    loss, _, _ = ppo_clip_loss(lp, torch.zeros(1), torch.tensor([1.0]), clip_low=0.2, clip_high=0.28)
    assert close(loss, [-1.28])


def test_kl_estimators():
    lp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert close(kl_penalty(lp, ref, "k1"), [1.0])
    assert close(kl_penalty(lp, ref, "k3"), [math.exp(-1) + 1 - 1])
    assert close(kl_penalty(ref, ref, "k3"), [0.0])
    with pytest.raises(ValueError, match="k2"):
        kl_penalty(lp, ref, "k2")


def test_aggregation_token_vs_sequence():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert close(aggregate(x, m, "token"), 2.5)  # (1+2+3+4) / 4
    assert close(aggregate(x, m, "sequence"), 3.0)  # (2 + 4) / 2
    # a micro-batch divided by the whole mini-batch's counts
    assert close(aggregate(x, m, "token", n_tokens=8), 10 / 8)
    assert close(aggregate(x, m, "sequence", n_seqs=4), 6 / 4)


def test_value_loss_clipped():
    # err (1-2)^2 = 1; clipped value .5+.2 = .7 -> (.7-2)^2 = 1.69; half the max
    assert close(value_loss(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([2.0]), clip=0.2), [0.845])
    assert close(value_loss(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([2.0]), clip=None), [0.5])


def test_importance_weights_by_hand():
    from masrl.algorithms.losses import importance_weights

    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    rollout = torch.log(torch.tensor([[0.25, 0.4, 0.3]]))  # ratios 2.0, 0.5, 3.0
    w, kept = importance_weights(old, rollout)
    assert torch.equal(w, torch.ones(1, 3)) and kept.all()
    w, _ = importance_weights(old, rollout, cap=torch.tensor([[2.5]]))  # truncated: min(ratio, 2.5)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 2.5]]))
    w, kept = importance_weights(old, rollout, mis=(0.6, 2.5))  # masked: 0.5 and 3.0 leave [0.6, 2.5]
    assert kept.tolist() == [[True, False, False]] and torch.allclose(w, torch.tensor([[1.0, 0.0, 0.0]]))
    w, _ = importance_weights(old, rollout, cap=torch.tensor([[1.5]]), mis=(0.4, 2.5))  # both
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 0.0]]))

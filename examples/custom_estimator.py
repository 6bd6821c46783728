"""Advantage estimators of your own, one of each kind, used from a config with no library edit:

    algorithm: {advantage: "custom_estimator:group_rank"}                  # a group estimator
    algorithm: {advantage: "custom_estimator:tail_weighted", advantage_options: {tail: 8}}  # token-level
    algorithm: {advantage: "custom_estimator:td0"}  + a critic or a value head  # reads values

(run with PYTHONPATH=examples). Every estimator has the same signature as masrl's own:
``f(batch: EstimatorBatch, **options)``; see ``masrl/algorithms/estimators.py``.
"""

from __future__ import annotations

import torch

from masrl.algorithms.estimators import EstimatorBatch, estimator


def group_rank(batch: EstimatorBatch) -> torch.Tensor:
    """Each call's rank within its group, centred and scaled to [-1, 1]: insensitive to the
    reward's scale and to outliers. A group of one gets 0. (Unmarked: a sequence estimator.)"""
    adv = torch.zeros_like(batch.rewards)
    for g in batch.group_ids.unique():
        idx = (batch.group_ids == g).nonzero().squeeze(-1)
        n = len(idx)
        if n < 2:
            continue
        r = batch.rewards[idx]
        # average rank of ties: (number below) + (ties - 1) / 2
        below = (r[:, None] > r[None, :]).sum(1).to(r.dtype)
        ties = (r[:, None] == r[None, :]).sum(1).to(r.dtype)
        rank = below + (ties - 1) / 2
        adv[idx] = 2 * rank / (n - 1) - 1
    return adv


@estimator(token_level=True)
def tail_weighted(batch: EstimatorBatch, *, tail: int = 8, std_normalize: bool = True) -> torch.Tensor:
    """GRPO's advantage on every token, doubled on each call's last ``tail`` tokens (where an
    answer tag usually sits). Returns ``[N, T]``."""
    from masrl.algorithms.grpo import grpo_advantages

    seq = grpo_advantages(batch.rewards, batch.group_ids, std_normalize=std_normalize)
    lengths = batch.mask.sum(-1, keepdim=True)
    pos = torch.arange(batch.mask.shape[1], dtype=batch.mask.dtype)[None, :]
    weight = torch.where(pos >= lengths - tail, 2.0, 1.0)
    return seq[:, None].to(batch.mask.dtype) * weight * batch.mask


@estimator(needs_critic=True, config=("gamma",))
def td0(batch: EstimatorBatch, *, gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One-step temporal differences against the critic's values: A_t = r_t + gamma V_{t+1} - V_t,
    with the call's reward on its last token; the value target is r_t + gamma V_{t+1}."""
    from masrl.algorithms.gae import place_sequence_rewards

    mask, values = batch.mask, batch.values
    rewards = place_sequence_rewards(batch.rewards.to(values.dtype), mask)
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1) * torch.cat(
        [mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
    targets = (rewards + gamma * next_values) * mask
    return (targets - values) * mask, targets

"""Generalised advantage estimation (Schulman et al., 2016) over completion tokens, for PPO.

Rewards are per token (the sequence reward sits on the last completion token). Padding positions
(mask 0) are skipped: the recursion runs over the valid tokens of each row only.
"""

from __future__ import annotations

import torch

from masrl.algorithms.estimators import EstimatorBatch, estimator


def gae_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(advantages, returns)``, both ``[B, T]`` and zero where ``mask`` is 0."""
    mask = mask.to(values.dtype)
    adv = torch.zeros_like(values)
    last = torch.zeros(values.shape[0], dtype=values.dtype)
    next_value = torch.zeros(values.shape[0], dtype=values.dtype)
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        cur = delta + gamma * lam * last
        adv[:, t] = cur * m
        # carry through padding unchanged
        last = torch.where(m > 0, cur, last)
        next_value = torch.where(m > 0, values[:, t], next_value)
    returns = (adv + values) * mask
    return adv, returns


def place_sequence_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Put each row's scalar reward on its last valid token."""
    out = torch.zeros(mask.shape, dtype=rewards.dtype)
    lengths = mask.long().sum(-1)
    rows = torch.nonzero(lengths > 0).squeeze(-1)
    last = mask.shape[1] - 1 - torch.flip(mask.long(), dims=[1]).argmax(-1)
    out[rows, last[rows]] = rewards[rows]
    return out


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    m = mask.to(x.dtype)
    n = m.sum().clamp(min=1)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * m


@estimator(needs_critic=True, config=("gamma", "lam"))
def gae_estimator(batch: EstimatorBatch, *, gamma: float = 1.0, lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the whole batch, with each call's reward on its last token; the advantages are
    whitened over all the batch's tokens."""
    rewards = batch.rewards.to(batch.values.dtype)
    adv, returns = gae_advantages(place_sequence_rewards(rewards, batch.mask), batch.values, batch.mask,
                                  gamma=gamma, lam=lam)
    return whiten(adv, batch.mask), returns

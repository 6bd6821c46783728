"""REINFORCE++ advantages (Hu, 2025): returns normalised over the whole batch, not per group.

``baseline="group_mean"`` is the paper's "REINFORCE++-baseline": subtract the group mean first.
Departure: rewards here are per sequence (the KL term, if any, goes in the loss rather than into
per-token rewards), so the batch statistics are taken over sequences.
"""

from __future__ import annotations

import torch

from masrl.algorithms.estimators import EstimatorBatch, estimator
from masrl.algorithms.grouping import group_mean_std


def reinforce_pp_advantages(
    rewards: torch.Tensor, gid: torch.Tensor, *, baseline: str = "none", eps: float = 1e-6
) -> torch.Tensor:
    if baseline == "group_mean":
        mean, _, _ = group_mean_std(rewards, gid)
        adv = rewards - mean
    elif baseline == "none":
        adv = rewards.clone()
    else:
        raise ValueError(f"unknown REINFORCE++ baseline {baseline!r}: use 'none' or 'group_mean'")
    if adv.numel() < 2:
        return adv - adv.mean()
    return (adv - adv.mean()) / (adv.std() + eps)


@estimator(config=("baseline",))
def reinforce_pp_estimator(batch: EstimatorBatch, *, baseline: str = "none") -> torch.Tensor:
    return reinforce_pp_advantages(batch.rewards, batch.group_ids, baseline=baseline)

"""GRPO advantages (Shao et al., 2024): reward minus its group's mean, optionally over the group's std.

Departures from the paper: the group is any configured key (default task x agent x turn), not
only the prompt; singleton groups get advantage 0; std is the unbiased sample std, as in TRL.
"""

from __future__ import annotations

import torch

from masrl.algorithms.estimators import EstimatorBatch, estimator
from masrl.algorithms.grouping import group_mean_std


def grpo_advantages(rewards: torch.Tensor, gid: torch.Tensor, *, std_normalize: bool = True, eps: float = 1e-6) -> torch.Tensor:
    mean, std, _ = group_mean_std(rewards, gid)
    adv = rewards - mean
    if std_normalize:
        adv = adv / (std + eps)
    return adv


@estimator(config=("std_normalize",))
def grpo_estimator(batch: EstimatorBatch, *, std_normalize: bool = True) -> torch.Tensor:
    return grpo_advantages(batch.rewards, batch.group_ids, std_normalize=std_normalize)

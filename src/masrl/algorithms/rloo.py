"""RLOO advantages (Ahmadian et al., 2024): reward minus the mean of the *other* samples in its group.

For a group of n: A_i = r_i - (sum_j r_j - r_i) / (n - 1) = n / (n - 1) * (r_i - mean). Singletons get 0.
"""

from __future__ import annotations

import torch

from masrl.algorithms.estimators import EstimatorBatch, estimator
from masrl.algorithms.grouping import group_mean_std


def rloo_advantages(rewards: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    mean, _, n = group_mean_std(rewards, gid)
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    return scale * (rewards - mean)


@estimator()
def rloo_estimator(batch: EstimatorBatch) -> torch.Tensor:
    return rloo_advantages(batch.rewards, batch.group_ids)

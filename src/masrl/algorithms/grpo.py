"""GRPO advantages (Shao et al., 2024): reward minus its group's mean, optionally over the group's std.

Departures from the paper: the group is any configured key (default task x agent x turn), not
only the prompt; singleton groups get advantage 0; std is the unbiased sample std, as in TRL.
"""

from __future__ import annotations

import torch

from masrl.algorithms.estimators import EstimatorBatch, estimator
from masrl.algorithms.grouping import group_mean_std


def grpo_advantages(rewards: torch.Tensor, gid: torch.Tensor, *, std_normalize: bool = True, eps: float = 1e-6,
                    scope: torch.Tensor | None = None) -> torch.Tensor:
    """``scope``: ids of a coarser unit (each call's agent); the centred rewards are then divided by
    the std over the scope's calls instead of each group's own (per-agent normalisation, as in
    Dr. MAS): a group whose rewards barely differ no longer gets advantages blown up to +-1."""
    mean, std, _ = group_mean_std(rewards, gid)
    adv = rewards - mean
    if std_normalize and scope is None:
        adv = adv / (std + eps)
    elif std_normalize:
        _, scope_std, _ = group_mean_std(adv, scope)
        adv = adv / (scope_std + eps)
    return adv


@estimator(config=("std_normalize", "std_scope"))
def grpo_estimator(batch: EstimatorBatch, *, std_normalize: bool = True, std_scope: str = "group") -> torch.Tensor:
    scope = None
    if std_scope == "agent":
        from masrl.algorithms.grouping import group_ids

        scope = group_ids([k.get("agent") for k in batch.keys])
    return grpo_advantages(batch.rewards, batch.group_ids, std_normalize=std_normalize, scope=scope)

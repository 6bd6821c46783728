"""Turn group keys (tuples such as (task_id, agent, turn)) into integer group ids."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def group_ids(keys: Sequence[Hashable]) -> torch.Tensor:
    """Integer id per key, in order of first appearance: ``[a, b, a] -> [0, 1, 0]``."""
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def group_mean_std(values: torch.Tensor, gid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element group mean, unbiased group std (0 for singletons) and group size."""
    n_groups = int(gid.max().item()) + 1 if gid.numel() else 0
    v = values.double()
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, torch.ones_like(v))
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, v)
    mean = total / count
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, (v - mean[gid]) ** 2)
    var = torch.where(count > 1, sq / (count - 1).clamp(min=1), torch.zeros_like(sq))
    return mean[gid].to(values.dtype), var.sqrt()[gid].to(values.dtype), count[gid].to(values.dtype)

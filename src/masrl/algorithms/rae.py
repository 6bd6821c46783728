"""Role-conditioned advantage estimation (RAE; SPIRAL, Liu et al., 2025, arXiv 2506.24119): each call's reward
minus a running baseline of its role, kept across updates.

A role is the value of ``role_key`` in the call's key: by default its ``agent``, which in masrl's games is the seat
(``player_0``, ``player_1``), so that the first seat's edge is not taken for skill and a seat whose games all end
alike is still measured against what that seat usually gets, which a group baseline cannot do once every sample of a
group plays the same game. The baseline moves as an exponential average, ``b <- alpha * b + (1 - alpha) * mean``
of the role's rewards in this update (a role's first update starts it at that mean), and each call's advantage is
``reward - b`` after this update's move. SPIRAL uses alpha 0.95 and no standard-deviation division; ``std_normalize``
divides by the role's running standard deviation (same average) instead. ``group``: subtract the group baseline's
advantage as well, half each (``(r - b) / 2 + (r - group mean) / 2``), the two baselines combined.

Departures from the paper: the update is per batch of the role's calls, not per trajectory; the baselines are saved
with the checkpoint (``EstimatorBatch.state``), so a resumed run goes on from them.
"""

from __future__ import annotations

import torch

from masrl.algorithms.estimators import EstimatorBatch, estimator
from masrl.algorithms.grouping import group_mean_std


@estimator()
def rae_estimator(batch: EstimatorBatch, *, alpha: float = 0.95, role_key: str = "agent",
                  std_normalize: bool = False, group: bool = False, eps: float = 1e-6) -> torch.Tensor:
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"algorithm.advantage_options.alpha: the baseline's decay, from 0 up to (not including) 1, "
                         f"not {alpha!r}")
    roles = [str(k.get(role_key)) for k in batch.keys] if batch.keys else ["all"] * len(batch.rewards)
    baselines = batch.state.setdefault("baselines", {})
    adv = torch.zeros_like(batch.rewards)
    for role in sorted(set(roles)):
        idx = torch.tensor([i for i, r in enumerate(roles) if r == role])
        rs = batch.rewards[idx]
        mean, sq = float(rs.mean()), float((rs * rs).mean())
        b = baselines.get(role)
        if b is None:
            b = {"mean": mean, "sq": sq, "updates": 0}
        else:
            b = {"mean": alpha * b["mean"] + (1 - alpha) * mean, "sq": alpha * b["sq"] + (1 - alpha) * sq,
                 "updates": b["updates"]}
        b["updates"] += 1
        baselines[role] = b
        a = rs - b["mean"]
        if std_normalize:
            a = a / (max(b["sq"] - b["mean"] ** 2, 0.0) ** 0.5 + eps)
        adv[idx] = a
    if group:
        g_mean, _, _ = group_mean_std(batch.rewards, batch.group_ids)
        adv = 0.5 * adv + 0.5 * (batch.rewards - g_mean)
    return adv

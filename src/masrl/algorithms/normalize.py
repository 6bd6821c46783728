"""Reward normalisation and advantage whitening, per policy (options beside per-group baselines).

``reward_norm``:
  none      rewards as allocated
  batch     (r - mean) / std over this policy's rewarded calls of the step
  running   (r - mean) / std with a running mean and variance over every step so far (this
            step's rewards are folded in first), kept per policy and saved with the checkpoint
``whiten_advantages``: after the estimator, advantages minus their mean over the policy's
calls of the step, over their std.

Standard deviations are population ones (divide by n); ``eps`` keeps a constant batch finite.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass
class RunningMoments:
    """Count, mean and sum of squared deviations (Chan et al.'s parallel update)."""

    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, xs: torch.Tensor) -> None:
        n = float(xs.numel())
        if n == 0:
            return
        b_mean = float(xs.double().mean())
        b_m2 = float(((xs.double() - b_mean) ** 2).sum())
        total = self.count + n
        delta = b_mean - self.mean
        self.mean += delta * n / total
        self.m2 += b_m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return (self.m2 / self.count) ** 0.5 if self.count else 1.0

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> "RunningMoments":
        return cls(**state)


def normalize_rewards(rewards: torch.Tensor, mode: str, stats: RunningMoments | None = None,
                      eps: float = 1e-6) -> torch.Tensor:
    if mode == "none":
        return rewards
    if mode == "batch":
        return (rewards - rewards.mean()) / (rewards.std(unbiased=False) + eps)
    if mode == "running":
        if stats is None:
            raise ValueError("reward_norm 'running' needs the policy's RunningMoments")
        stats.update(rewards)
        return (rewards - stats.mean) / (stats.std + eps)
    raise ValueError(f"unknown reward_norm {mode!r}: use none, batch or running")


def whiten(adv: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return (adv - adv.mean()) / (adv.std(unbiased=False) + eps)

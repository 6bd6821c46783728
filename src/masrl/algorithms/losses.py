"""Policy and value losses as pure functions over per-token tensors ``[B, T]`` with a 0/1 mask."""

from __future__ import annotations

import torch


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate ``-min(r A, clip(r, 1-lo, 1+hi) A)``, the clipped indicator, and r."""
    hi = clip_low if clip_high is None else clip_high
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + hi) * advantages
    loss = -torch.minimum(unclipped, clipped)
    clipped_mask = (clipped < unclipped).to(logprobs.dtype)
    return loss, clipped_mask, ratio


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens (Schulman's k1 / k3)."""
    log_ratio = ref_logprobs - logprobs
    if kind == "k1":
        return -log_ratio
    if kind == "k3":
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}: use 'k1' or 'k3'")


def importance_weights(old: torch.Tensor, rollout: torch.Tensor, cap: torch.Tensor | None = None,
                       mis: tuple[float, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weights for an update whose samples the trainer's weights did not draw:
    ``ratio = exp(old - rollout)`` (the trainer's own logprob before the update over the sampler's).
    Truncated IS (``cap``): ``min(ratio, cap)``. Masked IS (``mis = (low, high)``): a token whose
    ratio leaves ``[low, high]`` is dropped (weight 0); with both, the kept tokens are truncated.
    Returns ``(weights, kept)``; without either, weights are 1."""
    ratio = torch.exp(old - rollout)
    weights = torch.ones_like(ratio) if cap is None else torch.minimum(ratio, cap)
    kept = torch.ones_like(ratio, dtype=torch.bool)
    if mis is not None:
        kept = (ratio >= mis[0]) & (ratio <= mis[1])
        weights = weights * kept
    return weights, kept


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *,
               clip: float | None = 0.2) -> torch.Tensor:
    """Per-token PPO value loss, ``0.5 * max((v - R)^2, (v_clipped - R)^2)``."""
    err = (values - returns) ** 2
    if clip is None:
        return 0.5 * err
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * torch.maximum(err, (v_clipped - returns) ** 2)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token",
    *,
    n_tokens: float | None = None,
    n_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    ``token``: sum over all valid tokens / number of valid tokens (long answers weigh more).
    ``sequence``: mean over sequences of each sequence's token mean (every sequence weighs the same).
    ``n_tokens`` / ``n_seqs`` let micro-batches divide by the whole mini-batch's count, so that
    accumulated gradients equal the gradient of the mini-batch loss.
    """
    m = mask.to(per_token.dtype)
    if mode == "token":
        denom = m.sum() if n_tokens is None else torch.as_tensor(n_tokens, dtype=per_token.dtype)
        return (per_token * m).sum() / denom.clamp(min=1)
    if mode == "sequence":
        per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1)
        denom = m.shape[0] if n_seqs is None else n_seqs
        return per_seq.sum() / max(denom, 1)
    raise ValueError(f"unknown aggregation {mode!r}: use 'token' or 'sequence'")

"""Token sampling as pure functions: per-row temperature and top-p, and the sampling logprob.

The logprob returned is that of the sampled token under ``softmax(logits / T)`` (T = 1 for
greedy rows), *before* top-p truncation. That is the distribution the trainer recomputes, so the
PPO ratio starts at 1 on the first update; top-p below 1 makes rollouts slightly off-policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from masrl.seeding import counter_uniforms, stable_seed  # noqa: F401 - re-exported for the engines


def effective_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """Greedy rows (T == 0) score their tokens at T = 1."""
    return torch.where(temperature > 0, temperature, torch.ones_like(temperature))


def top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's nucleus; rows with top_p >= 1 are unchanged."""
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    cum = probs.cumsum(-1)
    # drop a token when the mass before it already reaches top_p (the top token always stays)
    drop_sorted = (cum - probs) >= top_p.unsqueeze(-1)
    drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


@dataclass(frozen=True)
class BatchFlags:
    """What a batch needs, known on the host from its requests, so sampling never has to ask the
    device (a GPU round trip per token)."""

    all_greedy: bool
    any_greedy: bool
    any_top_p: bool

    @classmethod
    def of(cls, temperatures: list[float], top_ps: list[float]) -> "BatchFlags":
        return cls(all(t <= 0 for t in temperatures), any(t <= 0 for t in temperatures), any(p < 1 for p in top_ps))


def sample_tokens(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, generator: torch.Generator | None = None,
    flags: BatchFlags | None = None, uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row. Returns ``(tokens [B], logprobs [B])``. ``uniforms [B]``: each
    row's random number for this token (``counter_uniforms``); without, drawn from ``generator``."""
    logits = logits.float()
    greedy = temperature <= 0
    if flags is None:
        flags = BatchFlags(bool(greedy.all()), bool(greedy.any()), bool((top_p < 1).any()))
    scaled = logits if flags.all_greedy else logits / effective_temperature(temperature).unsqueeze(-1)
    logp = torch.log_softmax(scaled, dim=-1)
    if flags.all_greedy:
        tokens = torch.argmax(logits, dim=-1)
    else:
        if flags.any_top_p:
            probs = torch.softmax(top_p_filter(scaled, top_p), dim=-1)
        else:
            probs = logp.exp()
        tokens = inverse_cdf_sample(probs, generator, uniforms)
        if flags.any_greedy:
            tokens = torch.where(greedy, torch.argmax(logits, dim=-1), tokens)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None = None,
                       uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row from ``probs [B, V]`` with one uniform number per row.

    ``torch.multinomial`` draws an exponential variate per vocabulary entry, which costs tens of
    milliseconds per step for a 49k vocabulary on a CPU; a cumulative sum and a binary search do not.
    """
    cdf = probs.cumsum(-1)
    if uniforms is None:
        u = torch.rand(probs.shape[0], 1, generator=generator, dtype=cdf.dtype, device=cdf.device)
    else:
        u = uniforms.to(cdf.dtype).reshape(-1, 1)
    u = u * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)


def stop_string_at(tok, ids: list[int], new: list[int], stop: tuple[str, ...]) -> int | None:
    """How many of ``new`` (tokens just sampled after ``ids``) to keep if a stop string completes
    inside them; None: none does. One decode of the window decides whether any stop string appears;
    only then is the exact token found (over the last 16 tokens, the eager engine's rule)."""
    if not new:
        return None
    text = tok.decode(ids[-16:] + new, skip_special_tokens=True)
    if not any(s in text for s in stop):
        return None
    for j in range(1, len(new) + 1):
        tail = tok.decode((ids + new[:j])[-16:], skip_special_tokens=True)
        if any(s in tail for s in stop):
            return j
    return None

"""What one policy update reports: the sums its micro-batches fold in (``UpdateStats``) and the metrics
made of them (``update_metrics``: per-token means of the loss terms, optimizer steps taken and skipped,
the engine/trainer logprob gap, importance weights)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from masrl.algorithms.estimators import needs_critic
from masrl.worker.updater.batching import Sample


@dataclass
class UpdateStats:
    """What one policy update accumulates for its metrics."""

    sums: dict[str, float] = field(default_factory=dict)  # per-token sums from the micro-batches
    mismatch_max: float = 0.0
    grad_norms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    skipped: int = 0  # sequences with zero advantage whose forward and backward were skipped
    nonfinite: int = 0  # optimizer steps skipped for a NaN/inf loss or gradient

    def add(self, stats: dict[str, float], first: bool) -> float:
        """Fold one micro-batch's sums in; returns its loss. ``first``: the first mini-batch of the
        first epoch, on the weights that sampled (the logprob gap there is numerics)."""
        loss = stats.pop("loss")
        mx = stats.pop("mismatch_max")
        for name, v in stats.items():
            self.sums[name] = self.sums.get(name, 0.0) + v
        if first:
            self.sums["mismatch_tokens"] = self.sums.get("mismatch_tokens", 0.0) + stats["tokens"]
            self.sums["mismatch_first"] = self.sums.get("mismatch_first", 0.0) + stats["mismatch_sum"]
            self.mismatch_max = max(self.mismatch_max, mx)
        return loss



def update_metrics(samples: list[Sample], st: UpdateStats, algo, critic) -> dict[str, float]:
    """An update's metrics from its micro-batches' sums: the loss terms per token, the optimizer steps,
    the logprob gaps, importance weights, and the separate critic's fit where there is one."""
    sums = st.sums
    ntok = max(1.0, sums.get("tokens", 0.0))
    rewards = [float(s.reward) for s in samples]
    out = {
        "loss": sum(st.losses) / max(1, len(st.losses)),
        "pg_loss": sums.get("pg_sum", 0.0) / ntok,
        "kl": sums.get("kl_sum", 0.0) / ntok,
        "clip_frac": sums.get("clip_sum", 0.0) / ntok,
        "ratio": sums.get("ratio_sum", 0.0) / ntok if sums.get("tokens") else 1.0,
        "grad_norm": (sum(st.grad_norms) / len(st.grad_norms)) if st.grad_norms else 0.0,
        "optimizer_steps": float(len(st.grad_norms)),
        "nonfinite_skipped": float(st.nonfinite),
        "n_seqs": float(len(samples)),
        "n_tokens": float(sum(len(s.completion_ids) for s in samples)),
        "trained_tokens": sums.get("tokens", 0.0),
        "skipped_zero_adv": float(st.skipped),
        # sequences the rewards teach nothing (advantage exactly 0), whether or not their forward was skipped
        "zero_adv_seqs": float(sum(1 for s in samples if not any(s.token_adv or [s.advantage]))),
        "reward_mean": sum(rewards) / max(1, len(rewards)),  # a data-parallel rank may hold none
        "adv_abs_mean": sum((sum(map(abs, s.token_adv)) / max(1, len(s.token_adv))) if s.token_adv else abs(s.advantage)
                            for s in samples) / max(1, len(samples)),  # per token for token-level estimators
        "lp_mismatch": sums.get("mismatch_first", 0.0) / max(1.0, sums.get("mismatch_tokens", 0.0)),
        "lp_mismatch_max": st.mismatch_max,
    }
    if sums.get("ent_tokens"):  # an update that trained no token measured no entropy (not an entropy of 0)
        out["entropy"] = sums["ent_sum"] / sums["ent_tokens"]
    if algo.tis_cap is not None or algo.mis is not None:  # the trainer's own old logprobs against the rollout's
        gaps = [abs(a - b) for s in samples for a, b in zip(s.old_logprobs, s.logprobs)]
        out["lp_mismatch"] = sum(gaps) / max(1, len(gaps))
        out["lp_mismatch_max"] = max(gaps, default=0.0)
        out["tis_weight"] = sums.get("tis_sum", 0.0) / ntok
    if algo.mis is not None:
        out["mis_masked"] = sums.get("mis_masked_sum", 0.0) / ntok
    shared = [x for x in samples if x.is_cap is not None]
    if shared:  # importance weights of calls shared from other policies: this policy's before-update logprobs
        ratios = [(math.exp(a - b), x.is_cap) for x in shared for a, b in zip(x.old_logprobs, x.logprobs)]
        out["shared_is_weight"] = sum(min(r, c) for r, c in ratios) / max(1, len(ratios))
        out["shared_is_capped"] = sum(r >= c for r, c in ratios) / max(1, len(ratios))
    if critic is not None:  # the separate critic learns from this policy's calls and their returns
        out.update(critic.fit(samples, algo.micro_batch_size, algo.value_clip))
    elif needs_critic(algo):
        out["value_loss"] = sums.get("vl_sum", 0.0) / ntok
    return out

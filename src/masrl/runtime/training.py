"""One policy update: advantages, then PPO-clip over micro-batches with accumulation.

The worker calls ``train_policy`` with the samples (its own buffered calls) of one policy, so a
policy only ever sees gradients from calls that it served to its own agents.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from masrl.algorithms import SEQUENCE_ESTIMATORS
from masrl.algorithms.gae import gae_advantages, place_sequence_rewards, whiten
from masrl.algorithms.grouping import group_ids
from masrl.algorithms.losses import aggregate, kl_penalty, ppo_clip_loss, value_loss
from masrl.engines.llama_forward import causal_mask
from masrl.engines.prefix import common_prefix_len, group_by_prefix
from masrl.runtime.hosting import ModelHost


@dataclass
class Sample:
    """A served call as its worker keeps it: the exact tokens sampled and their logprobs."""

    call_id: str
    policy: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    temperature: float
    key: dict  # task_id, agent, turn, sample_idx, trace_id
    reward: float | None = None
    advantage: float = 0.0
    token_adv: list[float] | None = None  # GAE
    returns: list[float] | None = None
    old_values: list[float] | None = None
    ref_logprobs: list[float] | None = None


@dataclass
class Batch:
    """A micro-batch laid out as [shared prefix, run once] + [rest of prompt + completion, per row]."""

    prefix: torch.Tensor  # [1, P] tokens shared by every row (P may be 0)
    ids: torch.Tensor  # [B, S] rest of prompt + completion, right-padded
    valid: torch.Tensor  # [B, S] bool
    gather_idx: torch.Tensor  # [B, T] suffix positions whose hidden state predicts each completion token
    tokens: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float
    temps: torch.Tensor  # [B]


def make_batch(samples: list[Sample], pad_id: int, *, share_prefix: bool = True, min_prefix: int = 16) -> Batch:
    P = 0
    if share_prefix and len(samples) > 1:
        P = min(len(s.prompt_ids) for s in samples) - 1
        first = samples[0].prompt_ids
        for s in samples[1:]:
            P = min(P, common_prefix_len(first, s.prompt_ids))
        if P < min_prefix:
            P = 0
    B = len(samples)
    S = max(len(s.prompt_ids) - P + len(s.completion_ids) for s in samples)
    T = max(len(s.completion_ids) for s in samples)
    ids = torch.full((B, S), pad_id, dtype=torch.long)
    valid = torch.zeros((B, S), dtype=torch.bool)
    gather_idx = torch.zeros((B, T), dtype=torch.long)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    for i, s in enumerate(samples):
        rest, c = s.prompt_ids[P:], len(s.completion_ids)
        ids[i, : len(rest) + c] = torch.tensor(rest + s.completion_ids)
        valid[i, : len(rest) + c] = True
        gather_idx[i, :c] = torch.arange(len(rest) - 1, len(rest) + c - 1)
        tokens[i, :c] = torch.tensor(s.completion_ids)
        mask[i, :c] = 1.0
    temps = torch.tensor([s.temperature if s.temperature > 0 else 1.0 for s in samples], dtype=torch.float32)
    prefix = torch.tensor([samples[0].prompt_ids[:P]], dtype=torch.long)
    return Batch(prefix, ids, valid, gather_idx, tokens, mask, temps)


def pad_rows(rows: list[list[float]], T: int) -> torch.Tensor:
    out = torch.zeros((len(rows), T), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


def suffix_hidden(host: ModelHost, module, batch: Batch) -> torch.Tensor:
    """Hidden states ``[B, S, H]`` of the per-row part, with the shared prefix run once."""
    fast = host.fast_forward(module)
    B, S = batch.ids.shape
    P = batch.prefix.shape[1]
    if fast is None:  # any architecture: the model's own forward over prefix + suffix
        ids = torch.cat([batch.prefix.expand(B, -1), batch.ids], dim=1)
        attn = torch.cat([torch.ones((B, P), dtype=torch.long), batch.valid.long()], dim=1)
        return host.hidden_states(module, ids, attn)[:, P:]
    past = None
    if P > 0:
        _, kv = fast.hidden(batch.prefix, torch.arange(P).unsqueeze(0),
                            causal_mask(torch.ones((1, P), dtype=torch.bool), 0, P), return_kv=True, last_only=True)
        past = [(k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1)) for k, v in kv]
    key_valid = torch.cat([torch.ones((B, P), dtype=torch.bool), batch.valid], dim=1)
    positions = (P + torch.arange(S)).unsqueeze(0).expand(B, -1)
    return fast.hidden(batch.ids, positions, causal_mask(key_valid, P, S), past=past)


def completion_forward(host: ModelHost, module, batch: Batch, value_head=None, want_entropy: bool = False):
    """Logprobs ``[B, T]`` of the sampled tokens (at each row's temperature), entropy, values.

    The output head runs only on completion positions: the prompt's logits are never needed.
    """
    hidden = suffix_hidden(host, module, batch)
    H = hidden.shape[-1]
    h = hidden.gather(1, batch.gather_idx.unsqueeze(-1).expand(-1, -1, H))
    logits = module.lm_head(h).float() / batch.temps.view(-1, 1, 1)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch.tokens.unsqueeze(-1)).squeeze(-1)
    if want_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    else:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    values = value_head(h).squeeze(-1).float() if value_head is not None else None
    return logp, entropy, values


def compute_advantages(samples: list[Sample], algo) -> None:
    """Set ``advantage`` on each sample (sequence estimators); GAE is done in ``train_policy``."""
    if algo.advantage == "gae":
        return
    keys = [tuple(s.key.get(k) if k != "policy" else s.policy for k in algo.group_key) for s in samples]
    rewards = torch.tensor([float(s.reward) for s in samples], dtype=torch.float64)
    adv = SEQUENCE_ESTIMATORS[algo.advantage](rewards, group_ids(keys), algo)
    for s, a in zip(samples, adv.tolist()):
        s.advantage = a


def micro_batches(samples: list[Sample], size: int) -> list[list[Sample]]:
    """Chunks of at most ``size`` that share a prompt prefix where possible (the few-shot part
    of one agent's prompt), so each chunk runs that prefix once; leftovers are length-sorted."""
    groups = group_by_prefix([s.prompt_ids for s in samples], min_prefix=16, max_group=size)
    out, singles = [], []
    for rows, plen in groups:
        if plen > 0:
            out.append([samples[i] for i in rows])
        else:
            singles.extend(samples[i] for i in rows)
    singles.sort(key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
    out += [singles[i : i + size] for i in range(0, len(singles), size)]
    return out


@torch.no_grad()
def _prepare_critic_and_reference(host: ModelHost, policy: str, samples: list[Sample], algo, pad_id: int) -> None:
    need_ref = algo.kl_coef > 0
    need_values = algo.advantage == "gae"
    if not (need_ref or need_values):
        return
    for mb in micro_batches(samples, algo.micro_batch_size):
        batch = make_batch(mb, pad_id)
        if need_ref:
            with host.reference_mode() as ref:
                ref_lp, _, _ = completion_forward(host, ref, batch)
            for i, s in enumerate(mb):
                s.ref_logprobs = ref_lp[i, : len(s.completion_ids)].tolist()
        if need_values:
            with host.active(policy):
                _, _, values = completion_forward(host, host.core, batch, host.value_heads[policy])
            for i, s in enumerate(mb):
                s.old_values = values[i, : len(s.completion_ids)].tolist()
    if need_values:
        for mb in micro_batches(samples, len(samples)):
            T = max(len(s.completion_ids) for s in mb)
            mask = pad_rows([[1.0] * len(s.completion_ids) for s in mb], T)
            values = pad_rows([s.old_values for s in mb], T)
            rewards = place_sequence_rewards(torch.tensor([float(s.reward) for s in mb]), mask)
            adv, ret = gae_advantages(rewards, values, mask, gamma=algo.gamma, lam=algo.lam)
            adv = whiten(adv, mask)
            for i, s in enumerate(mb):
                n = len(s.completion_ids)
                s.token_adv, s.returns = adv[i, :n].tolist(), ret[i, :n].tolist()


def train_policy(host: ModelHost, policy: str, samples: list[Sample], optimizer, algo, grad_clip: float,
                 pad_id: int, seed: int = 0) -> dict[str, float]:
    """Update ``policy`` on its ``samples``; return metrics."""
    critic = algo.advantage == "gae"
    compute_advantages(samples, algo)
    _prepare_critic_and_reference(host, policy, samples, algo, pad_id)
    zero_grad_possible = algo.skip_zero_advantage and algo.kl_coef == 0 and algo.entropy_coef == 0 and not critic
    value_head = host.value_heads.get(policy)
    params = host.policy_parameters(policy)
    rng = random.Random(seed)
    sums: dict[str, float] = {}
    grad_norms: list[float] = []
    losses: list[float] = []
    skipped = 0
    host.train_mode(True)
    try:
        with host.active(policy):
            for epoch in range(algo.ppo_epochs):
                order = samples[:]
                rng.shuffle(order)
                n_mb = min(algo.mini_batches, len(order))
                for k in range(n_mb):
                    mini = order[k::n_mb]
                    n_tokens = float(sum(len(s.completion_ids) for s in mini))
                    todo = mini
                    if zero_grad_possible:
                        todo = [s for s in mini if s.advantage != 0.0]
                        skipped += len(mini) - len(todo)
                    optimizer.zero_grad(set_to_none=True)
                    loss = 0.0
                    for mb in micro_batches(todo, algo.micro_batch_size):
                        stats = _micro_step(host, mb, algo, value_head, pad_id, n_tokens, float(len(mini)))
                        loss += stats.pop("loss")
                        for name, v in stats.items():
                            sums[name] = sums.get(name, 0.0) + v
                        if epoch == 0 and k == 0:
                            sums["mismatch_tokens"] = sums.get("mismatch_tokens", 0.0) + stats["tokens"]
                            sums["mismatch_first"] = sums.get("mismatch_first", 0.0) + stats["mismatch_sum"]
                    losses.append(loss)
                    if todo:
                        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
                        grad_norms.append(float(norm))
                        if math.isfinite(float(norm)):
                            optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
    finally:
        host.train_mode(False)
    ntok = max(1.0, sums.get("tokens", 0.0))
    rewards = [float(s.reward) for s in samples]
    out = {
        "loss": sum(losses) / max(1, len(losses)),
        "pg_loss": sums.get("pg_sum", 0.0) / ntok,
        "kl": sums.get("kl_sum", 0.0) / ntok,
        "entropy": sums.get("ent_sum", 0.0) / ntok,
        "clip_frac": sums.get("clip_sum", 0.0) / ntok,
        "ratio": sums.get("ratio_sum", 0.0) / ntok if sums.get("tokens") else 1.0,
        "grad_norm": (sum(grad_norms) / len(grad_norms)) if grad_norms else 0.0,
        "optimizer_steps": float(len(grad_norms)),
        "n_seqs": float(len(samples)),
        "n_tokens": float(sum(len(s.completion_ids) for s in samples)),
        "trained_tokens": sums.get("tokens", 0.0),
        "skipped_zero_adv": float(skipped),
        "reward_mean": sum(rewards) / len(rewards),
        "adv_abs_mean": sum(abs(s.advantage) for s in samples) / len(samples),
        "lp_mismatch": sums.get("mismatch_first", 0.0) / max(1.0, sums.get("mismatch_tokens", 0.0)),
    }
    if critic:
        out["value_loss"] = sums.get("vl_sum", 0.0) / ntok
    return out


def _micro_step(host, mb, algo, value_head, pad_id, n_tokens, n_seqs) -> dict[str, float]:
    """Forward and backward one micro-batch; return the loss and per-token sums for metrics."""
    batch = make_batch(mb, pad_id)
    T = batch.tokens.shape[1]
    logp, entropy, values = completion_forward(host, host.core, batch, value_head, want_entropy=algo.entropy_coef > 0)
    old = pad_rows([s.logprobs for s in mb], T)
    if algo.advantage == "gae":
        adv = pad_rows([s.token_adv for s in mb], T)
    else:
        adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32).unsqueeze(-1).expand(-1, T)
    pg, clipped, ratio = ppo_clip_loss(logp, old, adv, clip_low=algo.clip_eps, clip_high=algo.clip_eps_high)
    per_token = pg
    kl = torch.zeros_like(pg)
    if algo.kl_coef > 0:
        kl = kl_penalty(logp, pad_rows([s.ref_logprobs for s in mb], T), algo.kl_estimator)
        per_token = per_token + algo.kl_coef * kl
    if algo.entropy_coef > 0:
        per_token = per_token - algo.entropy_coef * entropy
    agg = dict(mode=algo.aggregation, n_tokens=n_tokens, n_seqs=n_seqs)
    loss = aggregate(per_token, batch.mask, **agg)
    vl = None
    if values is not None:
        vl = value_loss(values, pad_rows([s.old_values for s in mb], T), pad_rows([s.returns for s in mb], T),
                        clip=algo.value_clip)
        loss = loss + algo.vf_coef * aggregate(vl, batch.mask, **agg)
    loss.backward()
    m = batch.mask
    with torch.no_grad():
        def msum(x):
            return float((x.detach() * m).sum())

        stats = {
            "loss": float(loss),
            "tokens": float(m.sum()),
            "pg_sum": msum(pg),
            "kl_sum": msum(kl),
            "ent_sum": msum(entropy),
            "clip_sum": msum(clipped),
            "ratio_sum": msum(ratio),
            # rollout vs trainer logprobs of the same tokens; ~0 on the first pass (same weights)
            "mismatch_sum": msum((logp - old).abs()),
        }
        if vl is not None:
            stats["vl_sum"] = msum(vl)
    return stats

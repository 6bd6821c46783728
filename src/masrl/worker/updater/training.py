"""One policy update: advantages, then PPO-clip over micro-batches with gradient accumulation.

The updater calls ``Learner.train`` with the samples (its own buffered calls) of one policy, so a
policy only ever sees gradients from calls that it served to its own agents.

Per micro-batch: the lean forward (``modeling.lean``) over the layout ``batching`` chose, the
output head only at completion positions, the PPO loss, backward. ``algorithm.micro_batch_tokens``
bounds the memory of a micro-batch (with a 150k vocabulary the fp32 log-probabilities of 16k tokens
take 10 GB). The advantages come from ``updater.advantages``, the metrics from ``updater.update_metrics``.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys

import torch
import torch.nn.functional as F

from masrl.algorithms.estimators import get_estimator, needs_critic, needs_reference
from masrl.algorithms.losses import aggregate, importance_weights, kl_penalty, ppo_clip_loss, value_loss
from masrl.modeling import fused
from masrl.worker.model.held import HeldModel
from masrl.worker.updater.advantages import advantages_of_everyone, compute_advantages
from masrl.worker.updater.batching import Batch, Sample, make_batch, micro_batches, pad_rows, prefix_cost
from masrl.worker.updater.update_metrics import UpdateStats, update_metrics

__all__ = ["Sample", "Learner", "prefix_pays"]



# the measured point (benchmarks/bench_shared_prompt.py, one H200, SmolLM2-135M shape): 8 samples of
# 2,900-token prompts and ~22-token completions, the prefix layout runs 0.13 of the packed tokens and
# updates 1.9x faster; below this ratio the default on CUDA turns to the prefix layout
PREFIX_PAYS = 0.25


def prefix_pays(samples: list[Sample], algo) -> bool:
    """Whether the ``prefix`` layout's micro-batches of ``samples`` (the prefix once, rows padded to
    their longest rest) run at most ``PREFIX_PAYS`` of the tokens that packing them runs."""
    chunks = micro_batches(samples, algo.micro_batch_size, layout="prefix", token_budget=algo.micro_batch_tokens)
    return sum(prefix_cost(c) for c in chunks) <= PREFIX_PAYS * sum(s.length for s in samples)


def _head_logprobs(h, weight, bias, tokens, inv_temps, entropy_rows: torch.Tensor | None):
    """Logprobs of ``tokens`` under softmax(logits / T), and the entropy of the rows ``entropy_rows``
    (None: all rows). The temperature scales ``h`` before the matmul (``[N, H]``, not ``[N, V]``), and
    the log-softmax reads the bf16 logits and writes fp32 in one pass."""
    logits = F.linear(h * inv_temps[:, None].to(h.dtype), weight)
    if bias is not None:
        logits = logits + bias[None, :] * inv_temps[:, None].to(bias.dtype)  # (h W + b) / T
    if entropy_rows is not None and fused.uses("token_logprobs", logits):
        # fused: the [N, V] fp32 log-softmax is never written; entropy from a sample of rows
        logp = fused.token_logprobs(logits, tokens)
        with torch.no_grad():
            la = torch.log_softmax(logits.detach().index_select(0, entropy_rows), dim=-1, dtype=torch.float32)
            return logp, -(la.exp() * la).sum(-1)
    logp_all = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    logp = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
    if entropy_rows is None:  # the loss needs every token's entropy
        return logp, -(logp_all.exp() * logp_all).sum(-1)
    with torch.no_grad():
        la = logp_all.detach().index_select(0, entropy_rows) if len(entropy_rows) < len(tokens) else logp_all.detach()
        return logp, -(la.exp() * la).sum(-1)


class Learner:
    """How policies on one held model (``HeldModel``) learn: the batch layout, the completion forward, and
    one policy's update (``train``); ``algo``: the run's ``AlgorithmConfig``; ``pad_id``: the tokenizer's;
    ``head_chunk``: completion tokens per output-head chunk in passes without gradients; ``entropy_rows``: the
    tokens whose entropy is measured (a metric) when the loss does not need it."""

    def __init__(self, held: HeldModel, algo=None, pad_id: int = 0, *, head_chunk: int = 16384,
                 entropy_rows: int = 1024):
        self.held, self.algo, self.pad_id = held, algo, pad_id
        self.head_chunk, self.entropy_rows = head_chunk, entropy_rows

    def packing_available(self) -> bool:
        held = self.held
        dtype = held.sharded.compute_dtype if held.sharded is not None else held.dtype  # sharded: fp32 masters
        return (held.device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
                and hasattr(torch.ops.aten, "_flash_attention_forward") and held.fast_forward(held.core) is not None)

    def layout(self, samples: list[Sample] | None = None) -> str:
        """``packed`` | ``padded`` | ``prefix``: see ``batching``. Defaults: the shared-prefix layout on a
        CPU; on CUDA (bf16) packed, unless ``samples`` share long prompts (``prefix_pays``: GRPO samples of
        a long prompt with short answers). ``pack`` / ``share_prefix`` set to true or false decide it."""
        cuda = self.held.device.type == "cuda"
        share = self.algo.share_prefix
        if share is None and self.algo.pack is None and cuda and samples and self.held.sharded is None:
            share = prefix_pays(samples, self.algo)
        pack = self.algo.pack if self.algo.pack is not None else cuda and not share  # asked-for sharing beats the default
        if pack and self.packing_available():
            return "packed"
        share = share if share is not None else not cuda
        # sharded: one call of each layer per forward (the shared prefix would run each layer twice)
        return "prefix" if share and self.held.sharded is None else "padded"

    def _suffix_hidden(self, module, batch: Batch, checkpoint: bool = False) -> torch.Tensor:
        """Hidden states ``[rows, S, H]`` of the per-row part, with the shared prefix run once."""
        fast = self.held.fast_forward(module)
        B, S = batch.ids.shape
        P = batch.prefix.shape[1]
        dev = batch.ids.device
        if fast is None:  # any architecture: the model's own forward over prefix + right-padded rows
            ids = torch.cat([batch.prefix.expand(B, -1), batch.ids], dim=1)
            attn = torch.ones_like(ids)
            if batch.mask is not None:
                attn[:, P:] = batch.mask[:, 0, -1, P:].long()
            return self.held.hidden_states(module, ids, attn)[:, P:]
        if batch.packed is not None:
            return fast.hidden(batch.ids, batch.positions, None, packed=batch.packed, checkpoint=checkpoint)
        past = None
        if P > 0:
            # one row, no padding: plain causal attention (no mask, so flash kernels on CUDA; a long shared
            # prompt with an explicit mask would fall to a kernel that keeps its P x P scores)
            _, kv = fast.hidden(batch.prefix, torch.arange(P, device=dev).unsqueeze(0), None,
                                return_kv=True, last_only=True)
            past = [(k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1)) for k, v in kv]
        return fast.hidden(batch.ids, batch.positions, batch.mask, past=past, checkpoint=checkpoint)

    def completion_forward(self, module, batch: Batch, value_head=None, want_entropy: bool = False,
                           checkpoint: bool = False):
        """See ``_completion_forward``; a sharded policy's pass runs inside its FSDP root (``worker.sharding``)."""
        sharded = self.held.sharded_for(module)
        if sharded is not None:
            return sharded.run(self._completion_forward, module, batch, value_head, want_entropy, checkpoint)
        return self._completion_forward(module, batch, value_head, want_entropy, checkpoint)

    def _completion_forward(self, module, batch: Batch, value_head=None, want_entropy: bool = False,
                            checkpoint: bool = False):
        """Logprobs ``[B, T]`` of the sampled tokens (at each row's temperature), entropy, values.

        The output head runs only on completion positions. With gradients it runs over the whole
        micro-batch at once (``micro_batch_tokens`` bounds its memory); without, in chunks. Unless the
        loss needs it (``want_entropy``), entropy is measured on an even sample of ``entropy_rows``
        tokens: ``entropy`` is then NaN on the others (``torch.isnan`` tells which were measured).
        """
        hidden = self._suffix_hidden(module, batch, checkpoint)
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.select)  # [N, H]
        head = module.lm_head
        N = h.shape[0]
        dev = h.device
        chunk = N if torch.is_grad_enabled() else self.head_chunk
        inv_t = 1.0 / batch.token_temps
        logps, ents, ent_idx = [], [], []
        for i in range(0, N, chunk):
            n = min(chunk, N - i)
            rows = None
            if not want_entropy:
                rows = torch.linspace(0, n - 1, min(n, self.entropy_rows), device=dev).long()
            lp, ent = _head_logprobs(h[i : i + n], head.weight, head.bias, batch.tokens[i : i + n], inv_t[i : i + n], rows)
            logps.append(lp)
            ents.append(ent if want_entropy else ent.detach())
            ent_idx.append((torch.arange(n, device=dev) if rows is None else rows) + i)
        logp_sel, ent_sel, ent_at = torch.cat(logps), torch.cat(ents), torch.cat(ent_idx)
        B, T = batch.n_rows, batch.width
        logp = torch.zeros(B * T, dtype=torch.float32, device=dev).index_put((batch.dest,), logp_sel).view(B, T)
        entropy = torch.full((B * T,), float("nan"), dtype=torch.float32, device=dev)
        entropy = entropy.index_put((batch.dest.index_select(0, ent_at),), ent_sel).view(B, T)
        values = None
        if value_head is not None:
            v_sel = value_head(h.float()).squeeze(-1)
            values = torch.zeros(B * T, dtype=torch.float32, device=dev).index_put((batch.dest,), v_sel).view(B, T)
        return logp, entropy, values

    def _in_step(self, mbs: list, dp) -> list:
        """A sharded policy's ranks gather each layer together, so each runs as many forwards as the
        rank with the most micro-batches: the others' list is padded with ``None`` (a pass of weight zero)."""
        if self.held.sharded is None or dp is None:
            return mbs
        return mbs + [None] * (int(dp.max(len(mbs))) - len(mbs))

    @torch.no_grad()
    def _prepare(self, policy: str, samples: list[Sample], layout: str, critic=None, dp=None, filler=None) -> None:
        """No-grad passes before the update: reference logprobs (KL), values (GAE), and the trainer's
        own logprobs (truncated importance sampling)."""
        need_ref, need_values = needs_reference(self.algo), needs_critic(self.algo)
        need_old = self.algo.tis_cap is not None or self.algo.mis is not None or any(s.is_cap is not None for s in samples)
        if critic is not None and need_values:  # a separate value model scores the calls
            for s, v in zip(samples, critic.values(samples, self.algo.micro_batch_size)):
                s.old_values = v
        if not (need_ref or need_values or need_old):
            return
        with self.held.reference_resident() if need_ref else contextlib.nullcontext():
            self._prepare_passes(policy, samples, layout, critic, need_ref, need_values, need_old, dp, filler)
        if need_values:  # an estimator that reads values runs once they are known
            compute_advantages(samples, self.algo)

    def _prepare_passes(self, policy, samples, layout, critic, need_ref, need_values, need_old, dp=None,
                        filler=None) -> None:
        mbs = list(micro_batches(samples, self.algo.micro_batch_size, layout=layout, token_budget=self.algo.micro_batch_tokens))
        own_values = need_values and critic is None
        for mb in self._in_step(mbs, dp):
            # None: a sharded rank with fewer micro-batches runs the same passes on a stand-in, unread
            batch = make_batch(mb or filler, self.pad_id, layout=layout, device=self.held.device)
            mb = mb or []
            if need_ref:
                with self.held.reference_mode() as ref:
                    ref_lp, _, _ = self.completion_forward(ref, batch)
                for i, s in enumerate(mb):
                    s.ref_logprobs = ref_lp[i, : len(s.completion_ids)].tolist()
            if own_values or need_old:
                with self.held.active(policy):
                    lp, _, values = self.completion_forward(self.held.core, batch,
                                                         self.held.value_heads.get(policy) if own_values else None)
                for i, s in enumerate(mb):
                    n = len(s.completion_ids)
                    if own_values:
                        s.old_values = values[i, :n].tolist()
                    if need_old:
                        s.old_logprobs = lp[i, :n].tolist()

    def train(self, policy: str, samples: list[Sample], optimizer, grad_clip: float, *, seed: int = 0,
                  reward_stats=None, critic=None, dp=None, estimator_state: dict | None = None) -> dict[str, float]:
        """Update ``policy`` on its ``samples``; return metrics. ``reward_stats``: the policy's running
        reward moments (``algorithm.reward_norm: running``); ``critic``: its separate value model;
        ``dp``: this process is one rank of a data-parallel policy; ``estimator_state``: the estimator's own
        (``EstimatorBatch.state``)."""
        everyone = advantages_of_everyone(samples, self.algo, reward_stats, dp, estimator_state)
        layout = self.layout(everyone)  # every rank's calls: the ranks agree on it
        self._prepare(policy, samples, layout, critic, dp, everyone[:1])
        own = {s.call_id: s for s in samples}
        step = _MiniBatchStep(self, policy, optimizer, grad_clip, layout, dp, own)
        rng = random.Random(seed)
        self.held.train_mode(True)
        try:
            with self.held.active(policy):
                for epoch in range(self.algo.ppo_epochs):
                    order = everyone[:]
                    rng.shuffle(order)
                    n_mb = min(self.algo.mini_batches, len(order))
                    for k in range(n_mb):
                        step.run(order[k::n_mb], first=epoch == 0 and k == 0)
        finally:
            self.held.train_mode(False)
        return update_metrics(samples, step.stats, self.algo, critic)

    def _micro_step(self, mb, value_head, n_tokens, n_seqs, layout, scale: float = 1.0) -> dict[str, float]:
        """Forward and backward one micro-batch (its loss times ``scale``); return the loss and per-token
        sums for metrics."""
        dev = self.held.device
        batch = make_batch(mb, self.pad_id, layout=layout, device=dev)
        T = batch.width
        algo = self.algo
        logp, entropy, values = self.completion_forward(self.held.core, batch, value_head, want_entropy=algo.entropy_coef > 0,
                                                        checkpoint=algo.activation_checkpointing)
        rollout = pad_rows([s.logprobs for s in mb], T, dev)
        # importance weights: truncated IS for every row (tis_cap), and for calls shared from another
        # policy (is_cap): the trainer's own logprobs before the update over the sampling policy's
        caps = [s.is_cap if s.is_cap is not None else self.algo.tis_cap for s in mb]
        tis = any(c is not None for c in caps) or self.algo.mis is not None
        old = pad_rows([s.old_logprobs if (c is not None or self.algo.mis is not None) else s.logprobs
                        for s, c in zip(mb, caps)], T, dev) if tis else rollout
        if get_estimator(self.algo.advantage).token_level:
            adv = pad_rows([s.token_adv for s in mb], T, dev)
        else:
            adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32, device=dev).unsqueeze(-1).expand(-1, T)
        pg, clipped, ratio = ppo_clip_loss(logp, old, adv, clip_low=self.algo.clip_eps, clip_high=self.algo.clip_eps_high)
        weight = torch.ones_like(pg)
        kept = torch.ones_like(pg, dtype=torch.bool)
        if tis:  # importance sampling: the sampling distribution differs from the trainer's (truncated, masked)
            cap = None
            if any(c is not None for c in caps):
                cap = torch.tensor([c if c is not None else float("inf") for c in caps], dtype=torch.float32,
                                   device=dev).unsqueeze(-1)
            weight, kept = importance_weights(old, rollout, cap, self.algo.mis)
            pg = pg * weight
        per_token = pg
        kl = torch.zeros_like(pg)
        if self.algo.kl_coef > 0:
            kl = kl_penalty(logp, pad_rows([s.ref_logprobs for s in mb], T, dev), self.algo.kl_estimator)
            per_token = per_token + self.algo.kl_coef * kl
        measured = ~torch.isnan(entropy)
        if self.algo.entropy_coef > 0:
            per_token = per_token - self.algo.entropy_coef * torch.nan_to_num(entropy, nan=0.0)
        agg = dict(mode=self.algo.aggregation, n_tokens=n_tokens, n_seqs=n_seqs)
        m = batch.token_mask
        loss = aggregate(per_token, m, **agg)
        vl = None
        if values is not None:
            vl = value_loss(values, pad_rows([s.old_values for s in mb], T, dev), pad_rows([s.returns for s in mb], T, dev),
                            clip=self.algo.value_clip)
            loss = loss + self.algo.vf_coef * aggregate(vl, m, **agg)
        (loss * scale if scale != 1.0 else loss).backward()
        with torch.no_grad():
            gap = (logp - rollout).abs() * m
            em = measured & (m > 0)
            sums = torch.stack([loss.detach().float(), m.sum(), (pg * m).sum(), (kl * m).sum(),
                                torch.where(em, entropy, 0.0).sum(), em.sum().float(),
                                (clipped * m).sum(), (ratio * m).sum(), gap.sum(), gap.max(), (weight * m).sum(),
                                (vl * m).sum() if vl is not None else torch.zeros((), device=dev),
                                ((~kept) * m).sum()]).tolist()
        names = ["loss", "tokens", "pg_sum", "kl_sum", "ent_sum", "ent_tokens", "clip_sum", "ratio_sum", "mismatch_sum",
                 "mismatch_max", "tis_sum", "vl_sum", "mis_masked_sum"]
        return dict(zip(names, sums))


class _MiniBatchStep:
    """One optimizer step over a mini-batch: forward and backward per micro-batch (this rank's
    calls only), the gradient summed over ranks, clipped, and stepped unless it is not finite."""

    def __init__(self, learner: Learner, policy, optimizer, grad_clip, layout, dp, own):
        algo = learner.algo
        self.learner, self.host, self.policy, self.optimizer, self.algo = learner, learner.held, policy, optimizer, algo
        self.grad_clip, self.layout, self.dp, self.own = grad_clip, layout, dp, own
        self.value_head = self.host.value_heads.get(policy)
        # sequences whose advantage is exactly 0 add no gradient unless a KL, entropy or value term does
        self.skip_zero = (algo.skip_zero_advantage and algo.kl_coef == 0 and algo.entropy_coef == 0
                          and not get_estimator(algo.advantage).token_level)
        self.stats = UpdateStats()

    def run(self, mini: list[Sample], first: bool) -> None:
        algo, opt = self.algo, self.optimizer
        n_tokens = float(sum(len(s.completion_ids) for s in mini))
        todo = [s for s in mini if s.advantage != 0.0] if self.skip_zero else mini
        self.stats.skipped += len(mini) - len(todo)
        mine = [self.own[s.call_id] for s in todo if s.call_id in self.own] if self.dp is not None else todo
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        mbs = list(micro_batches(mine, algo.micro_batch_size, layout=self.layout, token_budget=algo.micro_batch_tokens))
        for mb in self.learner._in_step(mbs, self.dp) if todo else mbs:
            if mb is None:  # sharded: this rank's share ran out; a pass of weight zero keeps it in step
                self.learner._micro_step([_filler(todo[0])], self.value_head, n_tokens, float(len(mini)), self.layout,
                                         scale=0.0)
                continue
            stats = self.learner._micro_step(mb, self.value_head, n_tokens, float(len(mini)), self.layout)
            loss += self.stats.add(stats, first)
        if self.dp is not None and todo:  # the whole mini-batch's gradient, on every rank
            if self.host.sharded is None:  # (sharded: FSDP summed it in its reduce-scatter)
                self.dp.sum_grads(opt.grads())
            loss = self.dp.sum(loss)
        self.stats.losses.append(loss)
        if todo:
            self._step(loss)
        opt.zero_grad(set_to_none=True)

    def _step(self, loss: float) -> None:
        norm = torch.nn.utils.clip_grad_norm_(self.optimizer.grads(), self.grad_clip)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # sharded: a DTensor
        if math.isfinite(norm) and math.isfinite(loss):
            self.stats.grad_norms.append(norm)
            self.optimizer.step()
            return
        self.stats.nonfinite += 1  # a NaN/inf loss or gradient: skip this update, count it, say so
        print(f"[masrl] warning: policy '{self.policy}': non-finite loss ({loss}) or gradient norm ({norm}); this "
              f"optimizer step was skipped", file=sys.stderr)


def _filler(s: Sample) -> Sample:
    """Another rank's call as a zero-weight pass's input: its per-token fields that only its own rank
    computed (reference and old logprobs) stood in for by the rollout's (the pass's loss is scaled by 0)."""
    import dataclasses

    return dataclasses.replace(s, ref_logprobs=s.ref_logprobs or list(s.logprobs),
                               old_logprobs=s.old_logprobs or list(s.logprobs))

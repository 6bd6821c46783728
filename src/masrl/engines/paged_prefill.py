"""Prefill over the paged engine's KV pool: the lean forward over each call's uncached tokens, with the
keys and values of its cached blocks as the past, writing the new keys and values into its blocks.

Rows share a forward pass while ``_fits`` holds; a call with more new tokens than the budget is
computed alone in chunks over its own blocks (chunked prefill); a GRPO group's other samples (forks)
take their leader's last-position logits and a copy of its partial last block. The engine
(engines/paged.py) owns the pool and calls ``PoolPrefill.run`` for each prefill step.
"""

from __future__ import annotations

import torch

from masrl.engines.scheduler import Sequence
from masrl.modeling.lean import LlamaForward, causal_mask

KV = list[tuple[torch.Tensor, torch.Tensor]]


def _fits(rows: list[Sequence], budget: int) -> bool:
    """Whether ``rows`` prefill in one forward: padded new tokens (rows x most new) within ``budget``, keys
    attended (rows x longest) within 4 x ``budget`` (a next turn's few new tokens over a long past batch
    widely), and attention scores (rows x most new x longest) within ``budget``**2, one long prompt's."""
    new = max(s.length - s.cached for s in rows)
    width = max(s.length for s in rows)
    n = len(rows)
    return n * new <= budget and n * width <= 4 * budget and n * new * width <= budget * budget


class _PastGather:
    """A prefill's keys and values before its new tokens, layer by layer: the lean forward reads
    ``past[layer]`` as it reaches the layer, so only one layer's copy out of the pool is alive at a time."""

    def __init__(self, kv: KV, idx: torch.Tensor):
        self.kv, self.idx = kv, idx

    def __getitem__(self, li: int) -> tuple[torch.Tensor, torch.Tensor]:
        kf, vf = self.kv[li]
        return kf[self.idx].permute(0, 2, 1, 3), vf[self.idx].permute(0, 2, 1, 3)


class PoolPrefill:
    def __init__(self, fwd: LlamaForward, *, block_size: int, budget: int, pad_id: int, dtype: torch.dtype,
                 dev: torch.device, is_peft: bool):
        self.fwd, self.block_size, self.budget, self.pad_id = fwd, block_size, budget, pad_id
        self.dtype, self.dev, self.is_peft = dtype, dev, is_peft

    def run(self, seqs: list[Sequence], kv: KV) -> torch.Tensor:
        """Logits after each sequence's last token. Rows are batched while ``_fits`` (new tokens, keys
        attended and attention scores, each bounded by ``budget``); a sequence with more new
        tokens than that runs alone, ``budget`` at a time over its blocks so far (chunked
        prefill: memory stays flat however long the prompt)."""
        V = self.fwd.core.lm_head.weight.shape[0]
        logits = torch.empty((len(seqs), V), dtype=self.dtype, device=self.dev)
        budget = self.budget
        order = sorted((i for i, s in enumerate(seqs) if s.fork_of is None), key=lambda i: seqs[i].length - seqs[i].cached)
        chunk: list[int] = []
        for i in order + [None]:
            if i is not None:
                s = seqs[i]
                if s.length - s.cached > budget:
                    for start in range(s.cached, s.length, budget):
                        end = min(s.length, start + budget)
                        self.rows([(s, start, end)], logits, [i] if end == s.length else None, kv)
                    continue
                if not chunk or _fits([seqs[j] for j in chunk] + [s], budget):
                    chunk.append(i)
                    continue
            if chunk:
                self.rows([(seqs[j], seqs[j].cached, seqs[j].length) for j in chunk], logits, chunk, kv)
            chunk = [] if i is None else [i]
        self._copy_forks(seqs, logits, kv)
        return logits

    def _copy_forks(self, seqs: list[Sequence], logits: torch.Tensor, kv: KV) -> None:
        """Each fork takes its leader's last-position logits and a copy of the slots of its leader's
        partial last block (the full blocks it already shares)."""
        forks = [(i, s) for i, s in enumerate(seqs) if s.fork_of is not None]
        if not forks:
            return
        row = {id(s): i for i, s in enumerate(seqs)}
        bs = self.block_size
        dst = torch.tensor([i for i, _ in forks], device=self.dev)
        logits[dst] = logits[torch.tensor([row[id(s.fork_of)] for _, s in forks], device=self.dev)]
        src_slots, dst_slots = [], []
        for _, s in forks:
            full, part = divmod(s.length, bs)
            if part:
                a, b = s.fork_of.table[full] * bs, s.table[full] * bs
                src_slots += range(a, a + part)
                dst_slots += range(b, b + part)
            s.fork_of = None
        if src_slots:
            src = torch.tensor(src_slots, dtype=torch.long, device=self.dev)
            to = torch.tensor(dst_slots, dtype=torch.long, device=self.dev)
            for kf, vf in kv:
                kf.index_copy_(0, to, kf.index_select(0, src))
                vf.index_copy_(0, to, vf.index_select(0, src))

    def rows(self, spans: list[tuple[Sequence, int, int]], logits: torch.Tensor, where: list[int] | None,
             kv: KV) -> None:
        """Compute tokens ``[start, end)`` of each sequence over its keys and values before ``start``
        (in its blocks), write theirs into its blocks, and (``where``) put the last position's logits
        in those rows of ``logits``."""
        dev, bs = self.dev, self.block_size
        B = len(spans)
        C = max(a for _, a, _ in spans)
        N = max(e - a for _, a, e in spans)
        ids = torch.full((B, N), self.pad_id, dtype=torch.long)
        pos = torch.zeros((B, N), dtype=torch.long)
        valid = torch.zeros((B, C + N), dtype=torch.bool)
        past_idx = torch.zeros((B, C), dtype=torch.long)
        new_slots, new_rows, new_cols = [], [], []
        for b, (s, c, end) in enumerate(spans):
            toks = s.tokens
            n = end - c
            ids[b, :n] = torch.tensor(toks[c:end], dtype=torch.long)
            pos[b, :n] = torch.arange(c, end)
            valid[b, :c] = True
            valid[b, C : C + n] = True
            t = torch.arange(end)
            table = torch.tensor(s.table, dtype=torch.long)
            slot = table[t // bs] * bs + t % bs
            past_idx[b, :c] = slot[:c]
            new_slots.append(slot[c:])
            new_rows += [b] * n
            new_cols += range(n)
            s.kv_len = end
        ids, pos, valid = ids.to(dev), pos.to(dev), valid.to(dev)
        past_idx = past_idx.to(dev)
        past = _PastGather(kv, past_idx) if C > 0 else None
        adapters = [s.key or "__base__" for s, _, _ in spans] if self.is_peft else None
        mask = causal_mask(valid, C, N)
        h, new_kv = self.fwd.hidden(ids, pos, mask, past=past, adapters=adapters, return_kv=True)
        slots = torch.cat(new_slots).to(dev)
        rows = torch.tensor(new_rows, dtype=torch.long, device=dev)
        cols = torch.tensor(new_cols, dtype=torch.long, device=dev)
        for (kf, vf), (k, v) in zip(kv, new_kv):  # k, v [B, Hkv, N, D]
            kf.index_copy_(0, slots, k[rows, :, cols].to(kf.dtype))
            vf.index_copy_(0, slots, v[rows, :, cols].to(vf.dtype))
        if where is not None:
            last = torch.tensor([e - a - 1 for _, a, e in spans], dtype=torch.long, device=dev)
            hl = h[torch.arange(B, device=dev), last]
            logits[torch.tensor(where, device=dev)] = self.fwd.head_last(hl).to(self.dtype)

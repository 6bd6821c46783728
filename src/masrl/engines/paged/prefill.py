"""Prefill over the paged engine's KV pool: the lean forward over each call's uncached tokens, with the
keys and values of its cached blocks as the past, writing the new keys and values into its blocks.

Rows share a forward pass while ``_fits`` holds; a call with more new tokens than the budget is
computed alone in chunks over its own blocks (chunked prefill); a GRPO group's other samples (forks)
take their leader's last-position logits and a copy of its partial last block. The model runner
(runner.py) owns the pool and calls ``PoolPrefill.run`` for each forward prefill step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from masrl.engines.paged.calls import Sequence
from masrl.modeling.lean import LlamaForward, causal_mask

KV = list[tuple[torch.Tensor, torch.Tensor]]


HALF = (torch.bfloat16, torch.float16)

KEYS_PER_TOKEN = 4  # keys a forward may attend per token of the prefill budget


def _fits(n: int, new: int, width: int, budget: int) -> bool:
    """Whether ``n`` rows of at most ``new`` new tokens and ``width`` tokens in all prefill in one forward:
    padded new tokens (rows x most new) within ``budget``, keys attended (rows x longest) within
    ``KEYS_PER_TOKEN`` x ``budget`` (a next turn's few new tokens over a long past batch widely), and attention scores
    (rows x most new x longest) within ``budget``**2, one long prompt's."""
    return n * new <= budget and n * width <= KEYS_PER_TOKEN * budget and n * new * width <= budget * budget


@dataclass
class Layout:
    """A prefill's index arrays (numpy, built on the host in a few vectorised operations whatever the rows):
    ``ids``/``pos`` ``[B, N]`` (new tokens, pad after each row's own), ``valid`` ``[B, C + N]`` (the past's
    slots then the new ones), ``past_idx`` ``[B, C]`` (each past token's slot in the pool, 0 past a row's
    own) and ``slots`` ``[B * N]``: where each position's keys and values go in the pool, row by row, a
    pad's to slot 0 (the scratch block's), so one copy a layer writes them all."""

    ids: np.ndarray
    pos: np.ndarray
    valid: np.ndarray
    past_idx: np.ndarray
    slots: np.ndarray
    n: np.ndarray  # [B] new tokens of each row


def layout(spans: list[tuple[Sequence, int, int]], block_size: int, pad_id: int) -> Layout:
    """``Layout`` for computing tokens ``[start, end)`` of each span's sequence over its blocks."""
    B = len(spans)
    c = np.fromiter((a for _, a, _ in spans), dtype=np.int64, count=B)
    e = np.fromiter((b for _, _, b in spans), dtype=np.int64, count=B)
    n = e - c
    C, N = int(c.max()), int(n.max())
    width = max(len(s.table) for s, _, _ in spans)
    table = np.zeros((B, width), dtype=np.int64)
    for b, (s, _, _) in enumerate(spans):
        table[b, : len(s.table)] = s.table

    def slot(t: np.ndarray, keep: np.ndarray) -> np.ndarray:  # token positions [B, K] -> pool slots (0 where not kept)
        return np.where(keep, np.take_along_axis(table, t // block_size, axis=1) * block_size + t % block_size, 0)

    new = np.arange(N)[None, :] < n[:, None]  # [B, N]
    ids = np.full((B, N), pad_id, dtype=np.int64)
    ids[new] = np.fromiter((t for s, a, b in spans for t in s.tokens[a:b]), dtype=np.int64, count=int(n.sum()))
    pos = np.where(new, c[:, None] + np.arange(N)[None, :], 0)
    t_past = np.broadcast_to(np.arange(C), (B, C))
    past = t_past < c[:, None]
    return Layout(ids, pos, np.concatenate([past, new], axis=1), slot(t_past, past), slot(pos, new).reshape(-1), n)


def token_rows(n: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A prefill as token rows (the paged engine's ``_prefill_rows``): calls with ``n[i]`` new tokens after
    ``c[i]`` cached ones, laid end to end. Returns each row's call, each row's position in its call, and
    each call's last row (where its logits come from)."""
    row_of = np.repeat(np.arange(len(n)), n)
    first = np.cumsum(n) - n
    return row_of, c[row_of] + np.arange(len(row_of)) - first[row_of], first + n - 1


def block_tables(seqs: list[Sequence]) -> np.ndarray:
    """``[rows, longest table]`` int32: each sequence's block table, zeros after it (the scratch block)."""
    tables = np.zeros((len(seqs), max(len(s.table) for s in seqs)), dtype=np.int32)
    for b, s in enumerate(seqs):
        tables[b, : len(s.table)] = s.table
    return tables


def rows_bucket(n: int) -> int:
    """The rows of a prefill replay's graph: a power of two from 16 (few graphs; pads are cheap there)."""
    return max(16, 1 << (n - 1).bit_length())


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
                 dev: torch.device, is_peft: bool, flash_one_row: bool = True):
        """``flash_one_row``: a one-row prefill (a long prompt's chunks) on a GPU in half precision runs flash
        attention without a mask (causal after the row's past) instead of the masked kernel."""
        self.fwd, self.block_size, self.budget, self.pad_id = fwd, block_size, budget, pad_id
        self.dtype, self.dev, self.is_peft, self.flash_one_row = dtype, dev, is_peft, flash_one_row

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
        new = width = 0  # the chunk's most new tokens and longest row
        for i in order + [None]:
            if i is not None:
                s = seqs[i]
                if s.length - s.cached > budget:
                    for start in range(s.cached, s.length, budget):
                        end = min(s.length, start + budget)
                        self.rows([(s, start, end)], logits, [i] if end == s.length else None, kv)
                    continue
                more = max(new, s.length - s.cached), max(width, s.length)
                if not chunk or _fits(len(chunk) + 1, *more, budget):
                    chunk.append(i)
                    new, width = more
                    continue
            if chunk:
                self.rows([(seqs[j], seqs[j].cached, seqs[j].length) for j in chunk], logits, chunk, kv)
            chunk = [] if i is None else [i]
            new, width = (0, 0) if i is None else (seqs[i].length - seqs[i].cached, seqs[i].length)
        self.copy_forks(seqs, logits, kv)
        return logits

    def copy_forks(self, seqs: list[Sequence], logits: torch.Tensor, kv: KV) -> None:
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
        dev = self.dev
        lay = layout(spans, self.block_size, self.pad_id)
        B, C, N = len(spans), lay.past_idx.shape[1], lay.ids.shape[1]
        for s, _, end in spans:
            s.kv_len = end
        ids, pos, valid, past_idx = (torch.from_numpy(a).to(dev) for a in (lay.ids, lay.pos, lay.valid, lay.past_idx))
        past = _PastGather(kv, past_idx) if C > 0 else None
        adapters = [s.key or "__base__" for s, _, _ in spans] if self.is_peft else None
        # one row on a GPU in half precision: no mask (flash attention, causal after the row's past); else a mask
        # of each row's own past and new tokens
        mask = None if B == 1 and self.flash_one_row and self.dev.type == "cuda" and self.dtype in HALF else causal_mask(
            valid, C, N)
        h, new_kv = self.fwd.hidden(ids, pos, mask, past=past, adapters=adapters, return_kv=True)
        slots = torch.from_numpy(lay.slots).to(dev)
        for (kf, vf), (k, v) in zip(kv, new_kv):  # k, v [B, Hkv, N, D]: a view of [B, N, Hkv, D]
            kf.index_copy_(0, slots, k.transpose(1, 2).reshape(B * N, *kf.shape[1:]).to(kf.dtype))
            vf.index_copy_(0, slots, v.transpose(1, 2).reshape(B * N, *vf.shape[1:]).to(vf.dtype))
        if where is not None:
            last = torch.from_numpy(lay.n - 1).to(dev)
            hl = h[torch.arange(B, device=dev), last]
            logits[torch.tensor(where, device=dev)] = self.fwd.head_last(hl).to(self.dtype)

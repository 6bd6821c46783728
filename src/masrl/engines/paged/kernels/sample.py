"""One fused sampler for the decode step: a token and its logprob per row, two passes over the logits.

``sampling.sample_tokens`` in torch writes the ``[rows, vocab]`` logits out again several times
(a float copy, the temperature, log-softmax, exp, the cumulative sum, the search): on an H200 at
256 rows of Qwen2.5's 152k vocabulary that is about as long as the model's whole decode step. Here
the bf16 logits are read twice and nothing of their size is written:

1. ``_partials``, a program per (row, split of the vocabulary): the split's max of ``x / T``, its
   sum of ``exp(x / T - max)``, and its first argmax of ``x``.
2. ``_pick``, a program per (row, split): the row's max and sum from the partials, the row's
   target ``u * total``; the one split whose range of the cumulative sum holds the target walks its
   logits again (a cumulative sum a block at a time) to the first token whose cumulative sum passes
   it. Greedy rows (``T <= 0``) take the first argmax of the row. The split with the token writes it
   and its logprob under ``softmax(x / T)`` (T = 1 for greedy rows), as ``sample_tokens`` defines it.

The splits' ranges come from one cumulative sum over the partials that every program of a row
computes alike, so they tile the total with no gap or overlap. Rows with ``top_p < 1`` need a sort
and stay on ``sample_tokens`` (the engines decide per batch). The draw is the same inverse-CDF draw
with the same per-token random number; the sums run in another order, so a token whose cumulative
sum lies within rounding of the target can come out one apart (``check`` allows exactly that).
"""

from __future__ import annotations

import torch

from masrl.engines.paged.kernels.common import _INTERPRET, available, triton, verdicts
from masrl.modeling.fused import on_device

BLOCK = 1024
MAX_SPLITS = 256  # the partials a row's programs read back (one block of a vector)
_PROGRAMS = 264  # about two programs per multiprocessor of an H100/H200 (132)

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _partials(x_ptr, stride, t_ptr, m_ptr, l_ptr, bx_ptr, bi_ptr, V, NSP, CHUNK, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        split = tl.program_id(1)
        t = tl.load(t_ptr + row)
        teff = tl.where(t > 0, t, 1.0)
        lo = split * CHUNK
        m = -float("inf")
        ssum = 0.0
        best = -float("inf")
        best_i = 0
        for j in range(0, CHUNK, BLOCK):
            offs = lo + j + tl.arange(0, BLOCK)
            ok = offs < V
            x = tl.load(x_ptr + row * stride + offs, mask=ok, other=-float("inf")).to(tl.float32)
            s = x / teff
            new_m = tl.maximum(m, tl.max(s, 0))
            safe = tl.where(new_m == -float("inf"), 0.0, new_m)  # a block past the vocabulary's end
            ssum = ssum * tl.exp(m - safe) + tl.sum(tl.where(ok, tl.exp(s - safe), 0.0), 0)
            m = new_m
            bx = tl.max(x, 0)
            take = bx > best
            best_i = tl.where(take, lo + j + tl.argmax(x, 0), best_i)
            best = tl.where(take, bx, best)
        k = row * NSP + split
        tl.store(m_ptr + k, m)
        tl.store(l_ptr + k, ssum)
        tl.store(bx_ptr + k, best)
        tl.store(bi_ptr + k, best_i)

    @triton.jit
    def _pick(x_ptr, stride, t_ptr, u_ptr, m_ptr, l_ptr, bx_ptr, bi_ptr, tok_ptr, lp_ptr, V, NSP, CHUNK,
              NSP2: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        split = tl.program_id(1)
        t = tl.load(t_ptr + row)
        teff = tl.where(t > 0, t, 1.0)
        i = tl.arange(0, NSP2)
        have = i < NSP
        ms = tl.load(m_ptr + row * NSP + i, mask=have, other=-float("inf"))
        ls = tl.load(l_ptr + row * NSP + i, mask=have, other=0.0)
        M = tl.max(ms, 0)
        w = tl.where(have, ls * tl.exp(ms - M), 0.0)
        total = tl.sum(w, 0)
        lse = M + tl.log(total)
        if t <= 0:  # greedy: the first split holding the row's max, its first argmax
            bxs = tl.load(bx_ptr + row * NSP + i, mask=have, other=-float("inf"))
            top = tl.max(bxs, 0)
            first = tl.min(tl.where(have & (bxs == top), i, NSP2), 0)  # NSP2 > any split index
            if split == first:
                tok = tl.load(bi_ptr + row * NSP + split)
                x = tl.load(x_ptr + row * stride + tok).to(tl.float32)
                tl.store(tok_ptr + row, tok.to(tl.int64))
                tl.store(lp_ptr + row, x - lse)
        else:
            cum = tl.cumsum(w, 0)
            target = tl.load(u_ptr + row) * tl.sum(tl.where(i == NSP - 1, cum, 0.0), 0)
            hi = tl.sum(tl.where(i == split, cum, 0.0), 0)
            start = tl.sum(tl.where(i == split - 1, cum, 0.0), 0)  # 0 for the first split
            owner = (start <= target) & ((target < hi) | (split == NSP - 1))
            if owner:
                lo = split * CHUNK
                run = start
                tok = lo
                found = 0
                for j in range(0, CHUNK, BLOCK):
                    offs = lo + j + tl.arange(0, BLOCK)
                    ok = offs < V
                    x = tl.load(x_ptr + row * stride + offs, mask=ok, other=-float("inf")).to(tl.float32)
                    p = tl.where(ok, tl.exp(x / teff - M), 0.0)
                    c = run + tl.cumsum(p, 0)
                    below = tl.sum(tl.where(ok & (c <= target), 1, 0), 0)
                    last = tl.max(tl.where(p > 0, offs, -1), 0)  # rounding left the target past the sum
                    hit = (found == 0) & (tl.max(tl.where(ok, c, run), 0) > target)
                    tok = tl.where(hit, lo + j + below, tl.where((found == 0) & (last >= 0), last, tok))
                    found = tl.where(hit, 1, found)
                    run = tl.max(tl.where(ok, c, run), 0)
                x = tl.load(x_ptr + row * stride + tok).to(tl.float32)
                tl.store(tok_ptr + row, tok.to(tl.int64))
                tl.store(lp_ptr + row, x / teff - lse)


def layout(rows: int, vocab: int) -> tuple[int, int]:
    """``(splits, chunk)``: enough programs to fill the GPU at any batch, each split a whole number of
    blocks, at most ``MAX_SPLITS`` (split count and chunk are run-time arguments: one compiled kernel)."""
    want = min(MAX_SPLITS, max(1, -(-_PROGRAMS // rows)))
    blocks = -(-vocab // BLOCK)
    chunk = -(-blocks // min(want, blocks)) * BLOCK
    return -(-vocab // chunk), chunk


def sample(logits: torch.Tensor, temperature: torch.Tensor, uniforms: torch.Tensor, *,
           splits: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [B] int64, logprobs [B] fp32)`` for ``logits [B, V]`` (any float dtype, rows contiguous),
    ``temperature [B]`` (<= 0: greedy) and one uniform number per row ``[B]``; no top-p."""
    B, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    nsp, chunk = splits or layout(B, V)
    dev = logits.device
    temps = temperature.to(device=dev, dtype=torch.float32).contiguous()
    u = uniforms.to(device=dev, dtype=torch.float32).reshape(B).contiguous()
    part = torch.empty((3, B, nsp), dtype=torch.float32, device=dev)
    arg = torch.empty((B, nsp), dtype=torch.int32, device=dev)
    tokens = torch.empty(B, dtype=torch.int64, device=dev)
    lps = torch.empty(B, dtype=torch.float32, device=dev)
    if _INTERPRET:  # Triton's CPU interpreter cannot loop to a run-time bound: the chunk is a constant there
        nsp, chunk = tl.constexpr(nsp), tl.constexpr(chunk)
    with on_device(logits):
        _partials[(B, nsp)](logits, logits.stride(0), temps, part[0], part[1], part[2], arg, V, nsp, chunk,
                            BLOCK=BLOCK)
        _pick[(B, nsp)](logits, logits.stride(0), temps, u, part[0], part[1], part[2], arg, tokens, lps, V, nsp, chunk,
                        NSP2=MAX_SPLITS, BLOCK=BLOCK)
    return tokens, lps


def agrees(logits: torch.Tensor, temperature: torch.Tensor, uniforms: torch.Tensor, tokens: torch.Tensor,
           lps: torch.Tensor, tol: float = 1e-4) -> bool:
    """Whether ``tokens, lps`` is the inverse-CDF draw of ``sample_tokens`` (no top-p) to rounding, checked
    in float64: a greedy row's token is the first argmax; a sampled row's cumulative probability just
    before its token is at most ``u`` and at its token at least ``u`` (each within ``tol``); every logprob
    is that token's under ``softmax(x / T)`` (T = 1 for greedy rows)."""
    x = logits.double()
    t = temperature.double()
    teff = torch.where(t > 0, t, torch.ones_like(t))[:, None]
    logp = torch.log_softmax(x / teff, dim=-1)
    cdf = logp.exp().cumsum(-1)
    rows = torch.arange(x.shape[0], device=x.device)
    tok = tokens.long()
    before = torch.where(tok > 0, cdf[rows, (tok - 1).clamp(min=0)], torch.zeros_like(cdf[:, 0]))
    u = uniforms.double().reshape(-1)
    sampled_ok = (before <= u + tol) & (cdf[rows, tok] >= u - tol)
    greedy = t <= 0
    token_ok = torch.where(greedy, tok == x.argmax(-1), sampled_ok)
    lp_ok = (lps.double() - logp[rows, tok]).abs() <= max(tol, 1e-3)
    return bool(token_ok.all()) and bool(lp_ok.all())


def check(device: torch.device, dtype: torch.dtype) -> dict:
    """The fused sampler against the float64 inverse-CDF draw on random logits, greedy and sampled rows,
    one split a row and several: ``{"sample": None if it agrees, else why not}``."""
    if not (available(device) or (triton is not None and _INTERPRET)):
        return {"sample": "needs triton on a CUDA device"}
    g = torch.Generator(device=device).manual_seed(0)

    def run():
        ok = True
        for B, V, splits in ((6, 3000, None), (3, 5000, (3, 2048))):
            logits = (torch.randn(B, V, generator=g, device=device) * 4).to(dtype)
            temps = torch.tensor([0.0, 1.0, 0.7, 1.3, 0.0, 1.0][:B], device=device)
            u = torch.rand(B, generator=g, device=device)
            tokens, lps = sample(logits, temps, u, splits=splits)
            ok = ok and agrees(logits.float(), temps, u, tokens, lps)
        return ok

    return verdicts({"sample": run})


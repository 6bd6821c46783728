"""An RMSNorm and the matmul that reads it, in one Triton kernel (issue 28's decode step).

A decoder layer normalises its residual stream twice and each time feeds the result straight into a
matmul: ``rms_norm(h) @ W_qkv.T + b`` and ``silu(rms_norm(h) @ W_gate.T) * (rms_norm(h) @ W_up.T)``.
At the 0.5B shape and batch 256 the norm, the SiLU-mul and the round trip of the gate/up output
through memory cost about 7 us of a ~50 us layer. ``norm_matmul`` does it in one launch: each program
first sums the squares of its rows (the rows are short: 896 numbers), then runs the matmul normalising
each tile of ``h`` as it loads it. With ``gated`` it keeps two accumulators, one over the gate rows of the
weight and one over the up rows, and writes ``silu(gate) * up`` only.

Numerics follow the kernels it replaces (``kernels.rms_norm``, a cuBLAS matmul, ``kernels.silu_mul``):
the normalised input is rounded to the weight's dtype before the matmul, the matmul accumulates in fp32
and rounds once (bias added first), gate and up are each rounded before SiLU-mul. Only the order of the
fp32 sums differs from cuBLAS's. 16-bit weights only (an fp32 ``tl.dot`` would run in tf32).

``xn`` (optional) receives the normalised input as well, for LoRA deltas that read it.

Launch settings come from ``LAUNCH`` by the number of rows, measured by ``benchmarks/kernel_sweep.py
--only norm_matmul``; ``check`` runs the kernel against torch once per engine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from masrl.engines.kernels import probe, rms_norm_ref, silu_mul_ref, triton, verdicts
from masrl.modeling.fused import on_device

if triton is not None:
    import triton.language as tl

    @triton.jit(do_not_specialize=["M"])  # one compiled kernel for every batch size
    def _norm_matmul_kernel(x_ptr, ln_ptr, w_ptr, b_ptr, y_ptr, xn_ptr, M, N, K, eps, stride_x, stride_w, stride_y,
                            stride_xn, up_off, HAS_BIAS: tl.constexpr, GATED: tl.constexpr, WRITE_X: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
        num_m = tl.cdiv(M, BM)
        pid = tl.program_id(0)
        pid_m = pid % num_m  # the programs of one weight tile run side by side: it is read from memory once
        pid_n = pid // num_m
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        mm = rm < M
        nm = rn < N
        ss = tl.zeros((BM,), dtype=tl.float32)
        for k0 in range(0, K, BK):
            km = (k0 + rk) < K
            x = tl.load(x_ptr + rm[:, None] * stride_x + (k0 + rk)[None, :], mask=mm[:, None] & km[None, :],
                        other=0.0).to(tl.float32)
            ss += tl.sum(x * x, axis=1)
        rstd = 1.0 / tl.sqrt(ss / K + eps)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc_up = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            if EVEN_K:
                km = rk < BK
            else:
                km = (k0 + rk) < K
            x = tl.load(x_ptr + rm[:, None] * stride_x + (k0 + rk)[None, :], mask=mm[:, None] & km[None, :],
                        other=0.0).to(tl.float32)
            lw = tl.load(ln_ptr + k0 + rk, mask=km, other=0.0).to(tl.float32)
            # HF's order, as kernels.rms_norm: normalise, round, scale, round
            a = ((x * rstd[:, None]).to(w_ptr.dtype.element_ty).to(tl.float32) * lw[None, :]).to(w_ptr.dtype.element_ty)
            if WRITE_X:
                if pid_n == 0:
                    tl.store(xn_ptr + rm[:, None] * stride_xn + (k0 + rk)[None, :], a, mask=mm[:, None] & km[None, :])
            wt = tl.load(w_ptr + rn[None, :] * stride_w + (k0 + rk)[:, None], mask=nm[None, :] & km[:, None], other=0.0)
            acc = tl.dot(a, wt, acc)
            if GATED:
                wu = tl.load(w_ptr + (up_off + rn)[None, :] * stride_w + (k0 + rk)[:, None],
                             mask=nm[None, :] & km[:, None], other=0.0)
                acc_up = tl.dot(a, wu, acc_up)
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=nm, other=0.0).to(tl.float32)[None, :]
        if GATED:
            g = acc.to(y_ptr.dtype.element_ty).to(tl.float32)
            u = acc_up.to(y_ptr.dtype.element_ty).to(tl.float32)
            acc = g / (1.0 + tl.exp(-g)) * u
        tl.store(y_ptr + rm[:, None] * stride_y + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=mm[:, None] & nm[None, :])


# launch settings by rows (the first entry whose bound is at least M); set from kernel_sweep.py's table
LAUNCH: list[tuple[int, dict]] = [
    (16, {"BM": 16, "BN": 64, "BK": 128, "num_warps": 4, "num_stages": 3}),
    (64, {"BM": 64, "BN": 64, "BK": 64, "num_warps": 4, "num_stages": 3}),
    (1 << 62, {"BM": 64, "BN": 128, "BK": 64, "num_warps": 8, "num_stages": 3}),
]
# the decode step fuses from this many rows up (below it the step reads the weights once either way and
# cuBLAS's matrix-vector kernels are hard to beat); kernel_sweep.py's table tells
MIN_ROWS = 1


def launch_for(m: int) -> dict:
    return next(cfg for bound, cfg in LAUNCH if m <= bound)


def norm_matmul(x, ln, eps: float, w, bias=None, *, gated: bool = False, xn=None, launch: dict | None = None):
    """``rms_norm(x; ln, eps) @ w.T (+ bias)``; with ``gated``, ``w`` is ``[gate; up]`` and the result is
    ``silu(gate) * up``. Writes the normalised ``x`` into ``xn`` if given."""
    M, K = x.shape
    n_out = w.shape[0] // 2 if gated else w.shape[0]
    assert x.stride(1) == 1 and w.stride(1) == 1 and w.shape[1] == K and w.dtype != torch.float32
    y = torch.empty((M, n_out), dtype=w.dtype, device=x.device)
    cfg = dict(launch or launch_for(M))
    BM, BN, BK = cfg.pop("BM"), cfg.pop("BN"), cfg.pop("BK")
    grid = (triton.cdiv(M, BM) * triton.cdiv(n_out, BN),)
    with on_device(x):
        _norm_matmul_kernel[grid](x, ln, w, bias if bias is not None else w, y, xn if xn is not None else y, M, n_out, K,
                                  eps, x.stride(0), w.stride(0), y.stride(0), xn.stride(0) if xn is not None else 0,
                                  n_out, HAS_BIAS=bias is not None, GATED=gated, WRITE_X=xn is not None, BM=BM, BN=BN,
                                  BK=BK, EVEN_K=K % BK == 0, **cfg)
    return y


def norm_matmul_ref(x, ln, eps: float, w, bias=None, *, gated: bool = False, xn=None):
    """The torch ops ``norm_matmul`` replaces (also what the decode step runs without it)."""
    a = rms_norm_ref(x, ln, eps)
    if xn is not None:
        xn.copy_(a)
    y = F.linear(a, w, bias)
    return silu_mul_ref(y) if gated else y


def check(device: torch.device, dtype: torch.dtype, hidden: int, n_qkv: int, inter: int) -> dict:
    """``{"norm_matmul": None if it agrees with torch at the model's shapes, else why not}``; empty for fp32
    weights, which the kernel does not take (its dots are 16-bit)."""
    if dtype == torch.float32:
        return {}
    g, rnd, close = probe(device, dtype)

    def run():
        ok = True
        for rows in (3, 40):
            x, ln = rnd(rows, hidden), 1.0 + 0.1 * rnd(hidden)
            for w, bias, gated in ((0.05 * rnd(n_qkv, hidden), rnd(n_qkv), False),
                                   (0.05 * rnd(2 * inter, hidden), None, True)):
                xn1, xn2 = torch.empty_like(x), torch.empty_like(x)
                y1 = norm_matmul(x, ln, 1e-6, w, bias, gated=gated, xn=xn1)
                y2 = norm_matmul_ref(x, ln, 1e-6, w, bias, gated=gated, xn=xn2)
                ok = ok and close(y1, y2) and close(xn1, xn2)
        return ok

    return verdicts({"norm_matmul": run})

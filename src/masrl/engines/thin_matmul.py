"""A Triton matmul for a decode step's thin outputs: ``y = x @ w.T (+ bias) (+ residual)``.

At batch 256 of the 0.5B shape (hidden 896) the o, down and q/k/v projections give outputs of 256 x 896 or
256 x 1,152: in cuBLAS's 128 x 128 tiles that is 14 to 18 tiles for a 132-SM GPU, so most SMs idle while
each tile walks all of K (4,864 for down). Here the tiles are smaller and K is cut into ``S`` runs (split-K):
one program per (row tile, column tile, run), each writing an fp32 partial sum; a second kernel adds the runs
up with the bias and the residual and rounds once. With ``S == 1`` one kernel does it all.

``launch`` is ``(BM, BN, BK, S, num_warps, num_stages)``. ``thin_linear_ref`` is the torch version.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from masrl.modeling.fused import on_device

try:  # triton comes with torch's CUDA builds; CPU-only installs lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def thin_linear_ref(x, w, bias=None, residual=None):
    """``residual + x @ w.T + bias``, in place in ``residual`` when given (as the step's ``addmm_``)."""
    if residual is None:
        return F.linear(x, w, bias)
    if bias is not None:
        return residual.add_(F.linear(x, w, bias))
    return residual.addmm_(x, w.t())


if triton is not None:

    @triton.jit
    def _thin_mm_kernel(x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, p_ptr, M, N, K, k_per,
                        HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PARTIAL: tl.constexpr,
                        EVEN: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pm, pn, ps = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        lo = ps * k_per
        hi = tl.minimum(lo + k_per, K)
        xp = x_ptr + rm[:, None] * K + (lo + rk)[None, :]
        wp = w_ptr + rn[None, :] * K + (lo + rk)[:, None]  # w is [N, K]: read a [BK, BN] tile of w.T
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(lo, hi, BK):
            if EVEN:
                a = tl.load(xp)
                b = tl.load(wp)
            else:
                kk = k + rk
                a = tl.load(xp, mask=(rm[:, None] < M) & (kk[None, :] < hi), other=0.0)
                b = tl.load(wp, mask=(rn[None, :] < N) & (kk[:, None] < hi), other=0.0)
            acc = tl.dot(a, b, acc)
            xp += BK
            wp += BK
        out = rm[:, None] * N + rn[None, :]
        om = (rm[:, None] < M) & (rn[None, :] < N)
        if PARTIAL:
            tl.store(p_ptr + ps * M * N + out, acc, mask=om)
        else:
            if HAS_BIAS:
                acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            if HAS_RES:
                acc += tl.load(r_ptr + out, mask=om, other=0.0).to(tl.float32)
            tl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=om)

    @triton.jit
    def _thin_sum_kernel(p_ptr, b_ptr, r_ptr, y_ptr, MN, N, S: tl.constexpr, HAS_BIAS: tl.constexpr,
                         HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < MN
        acc = tl.load(p_ptr + offs, mask=m, other=0.0)
        for s in tl.static_range(1, S):
            acc += tl.load(p_ptr + s * MN + offs, mask=m, other=0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs % N, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:
            acc += tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=m)


def runs(K: int, BK: int, S: int) -> tuple[int, int]:
    """``(k_per, S)``: each run's span of K, whole ``BK`` blocks, and how many runs that makes."""
    k_per = triton.cdiv(triton.cdiv(K, S), BK) * BK
    return k_per, triton.cdiv(K, k_per)


def thin_linear(x, w, bias=None, residual=None, launch=(64, 64, 64, 1, 4, 4)):
    """``thin_linear_ref`` by the kernels above (``x [M, K]`` and ``w [N, K]`` contiguous)."""
    BM, BN, BK, S, warps, stages = launch
    M, K = x.shape
    N = w.shape[0]
    assert x.is_contiguous() and w.is_contiguous() and w.shape[1] == K
    k_per, S = runs(K, BK, S)
    y = residual if residual is not None else torch.empty((M, N), dtype=x.dtype, device=x.device)
    assert y.is_contiguous()
    even = M % BM == 0 and N % BN == 0 and K % BK == 0
    flags = dict(HAS_BIAS=bias is not None, HAS_RES=residual is not None, EVEN=even, BM=BM, BN=BN, BK=BK,
                 num_warps=warps, num_stages=stages)
    b = bias if bias is not None else y
    with on_device(x):
        if S == 1:
            _thin_mm_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN), 1)](x, w, b, y, y, y, M, N, K, k_per,
                                                                          PARTIAL=False, **flags)
            return y
        part = torch.empty((S, M, N), dtype=torch.float32, device=x.device)
        _thin_mm_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN), S)](x, w, b, y, y, part, M, N, K, k_per,
                                                                      PARTIAL=True, **flags)
        block = 1024
        _thin_sum_kernel[(triton.cdiv(M * N, block),)](part, b, y, y, M * N, N, S=S, HAS_BIAS=bias is not None,
                                                       HAS_RES=residual is not None, BLOCK=block)
    return y


THIN_ROWS = (64, 256)  # batches this kernel takes; fewer rows read the weights once (cuBLAS's GEMV), more fill the GPU
THIN_MAX_N = 4096  # wider outputs (gate/up, the head) give cuBLAS enough tiles


def thin_launch(M: int, N: int, K: int, sms: int) -> tuple | None:
    """The launch for ``[M, K] @ [K, N]`` on a GPU of ``sms`` SMs, or None where cuBLAS is the better call:
    64 x 64 tiles, K cut into enough runs for about one program per SM (at most 8, each 256+ long)."""
    if not THIN_ROWS[0] <= M <= THIN_ROWS[1] or N > THIN_MAX_N:
        return None
    BM, BN = 64, 64
    BK = 128 if K >= 2048 else 64
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    S = max(1, min(8, round(sms / tiles), K // 256))
    return (BM, BN, BK, S, 4, 4 if BK == 64 else 3)


def check(device: torch.device, dtype: torch.dtype) -> dict:
    """``thin_linear`` against torch on odd and even shapes, bias and residual, one run and several:
    ``{"thin_linear": None if it agrees, else why not}``."""
    from masrl.engines import kernels

    _, rnd, close = kernels.probe(device, dtype)

    def agree():
        ok = True
        for (M, N, K), launch in (((64, 128, 512), (64, 64, 64, 1, 4, 2)), ((40, 72, 200), (32, 32, 32, 3, 4, 2)),
                                  ((64, 96, 1024), (32, 32, 64, 4, 4, 2))):
            x, w, b = rnd(M, K), rnd(N, K) * K**-0.5, rnd(N)
            for bias in (None, b):
                for res in (None, rnd(M, N)):
                    y = thin_linear(x, w, bias, None if res is None else res.clone(), launch)
                    ok = ok and close(y, thin_linear_ref(x, w, bias, None if res is None else res.clone()))
        return ok

    return kernels.verdicts({"thin_linear": agree})

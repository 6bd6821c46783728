"""Fused Triton kernels for the static engine's decode step, each with the torch code it replaces.

At batch 1 a decode step of a small model is a few hundred tiny kernels, and on a GPU each costs
a couple of microseconds however little it computes; so the step's time is its kernel count.
Three fusions take a layer from ~25 kernels to ~10:

* ``rms_norm``: one kernel per row instead of six (square, mean, add, rsqrt, two multiplies);
* ``rope_and_cache``: rotary embedding of q and k *and* writing k and v into the KV cache at the
  current slot, in one kernel (instead of ~12: slices, negation, concatenation, products, sums,
  two index copies); the slot is read from device memory, so a CUDA graph can replay it;
* ``silu_mul``: the gated MLP's ``silu(gate) * up`` in one kernel instead of two.

Numerics: each kernel computes in fp32 and rounds once; the torch versions round after every op
(in bf16 that is a difference of about one bf16 ulp, measured by the engine's logprob checks).
``check`` runs every kernel against its torch version on random data once per engine; the engine
uses the kernels only if they agree, and its CPU path always uses torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # triton comes with torch's CUDA builds; CPU-only installs lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


# -- torch references (also the CPU path) ------------------------------------------------------------

def rms_norm_ref(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def rope_and_cache_ref(qkv, cos, sin, kc, vc, slot, H: int, Hkv: int, D: int):
    """``qkv [B, (H+2Hkv)D]``, ``cos, sin [B, D]``; writes k, v at ``slot`` of ``kc, vc [R, Hkv, S, D]``;
    returns roped ``q [B, Hkv, H/Hkv, D]``."""
    B = qkv.shape[0]
    qk = qkv[:, : (H + Hkv) * D].view(B, H + Hkv, D)
    c, s = cos[:, None, :], sin[:, None, :]
    qk = qk * c + torch.cat([-qk[..., D // 2 :], qk[..., : D // 2]], dim=-1) * s
    kc[:B].index_copy_(2, slot, qk[:, H:].unsqueeze(2))
    vc[:B].index_copy_(2, slot, qkv[:, (H + Hkv) * D :].view(B, Hkv, 1, D))
    return qk[:, :H].reshape(B, Hkv, H // Hkv, D)


def silu_mul_ref(gu):
    inter = gu.shape[-1] // 2
    return F.silu(gu[:, :inter]) * gu[:, inter:]


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        y = (x * rstd).to(y_ptr.dtype.element_ty).to(tl.float32) * w  # HF's order: normalise, round, scale
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, slot_ptr,
                           stride_qkv, stride_cs, kc_b, kc_h, kc_s, H: tl.constexpr, HKV: tl.constexpr,
                           D: tl.constexpr, HALF: tl.constexpr):
        b = tl.program_id(0)
        j = tl.program_id(1)  # 0..H-1: a query head; H..H+HKV-1: a key head (and its value head)
        half = HALF
        i = tl.arange(0, HALF)
        base = qkv_ptr + b * stride_qkv + j * D
        x1 = tl.load(base + i).to(tl.float32)
        x2 = tl.load(base + half + i).to(tl.float32)
        c1 = tl.load(cos_ptr + b * stride_cs + i).to(tl.float32)
        c2 = tl.load(cos_ptr + b * stride_cs + half + i).to(tl.float32)
        s1 = tl.load(sin_ptr + b * stride_cs + i).to(tl.float32)
        s2 = tl.load(sin_ptr + b * stride_cs + half + i).to(tl.float32)
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
        if j < H:
            dst = q_ptr + (b * H + j) * D
            tl.store(dst + i, o1.to(q_ptr.dtype.element_ty))
            tl.store(dst + half + i, o2.to(q_ptr.dtype.element_ty))
        else:
            slot = tl.load(slot_ptr)
            h = j - H
            dst = kc_ptr + b * kc_b + h * kc_h + slot * kc_s
            tl.store(dst + i, o1.to(kc_ptr.dtype.element_ty))
            tl.store(dst + half + i, o2.to(kc_ptr.dtype.element_ty))
            full = tl.arange(0, D)
            v = tl.load(qkv_ptr + b * stride_qkv + (H + HKV + h) * D + full)
            tl.store(vc_ptr + b * kc_b + h * kc_h + slot * kc_s + full, v)

    @triton.jit
    def _silu_mul_kernel(gu_ptr, y_ptr, stride_gu, stride_y, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < n
        g = tl.load(gu_ptr + row * stride_gu + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * stride_gu + n + cols, mask=m, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=m)


def rms_norm(x, w, eps):
    y = torch.empty_like(x)
    n = x.shape[-1]
    _rms_norm_kernel[(x.shape[0],)](x, w, y, x.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y


def rope_and_cache(qkv, cos, sin, kc, vc, slot, H: int, Hkv: int, D: int):
    B = qkv.shape[0]
    q = torch.empty((B, H, D), dtype=qkv.dtype, device=qkv.device)
    assert kc.stride(3) == 1 and kc.stride() == vc.stride() and cos.stride(0) == sin.stride(0)
    _rope_cache_kernel[(B, H + Hkv)](qkv, cos, sin, q, kc, vc, slot, qkv.stride(0), cos.stride(0),
                                     kc.stride(0), kc.stride(1), kc.stride(2), H=H, HKV=Hkv, D=D, HALF=D // 2)
    return q.view(B, Hkv, H // Hkv, D)


def silu_mul(gu):
    B, n2 = gu.shape
    n = n2 // 2
    y = torch.empty((B, n), dtype=gu.dtype, device=gu.device)
    block = 1024
    _silu_mul_kernel[(B, triton.cdiv(n, block))](gu, y, gu.stride(0), y.stride(0), n, BLOCK=block)
    return y


def check(device: torch.device, dtype: torch.dtype, H: int, Hkv: int, D: int, hidden: int, inter: int) -> str | None:
    """Run every kernel against its torch version on random data; None if all agree, else why not."""
    try:
        g = torch.Generator(device=device).manual_seed(0)
        tol = 2e-2 if dtype != torch.float32 else 1e-4

        def rnd(*shape):
            return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

        B, S = 3, 16
        x, w = rnd(B, hidden), rnd(hidden)
        if not torch.allclose(rms_norm(x, w, 1e-5).float(), rms_norm_ref(x, w, 1e-5).float(), atol=tol, rtol=tol):
            return "rms_norm disagrees with torch"
        gu = rnd(B, 2 * inter)
        if not torch.allclose(silu_mul(gu).float(), silu_mul_ref(gu).float(), atol=tol, rtol=tol):
            return "silu_mul disagrees with torch"
        qkv = rnd(B, (H + 2 * Hkv) * D)
        ang = rnd(B, D // 2).float()
        cos = torch.cat([ang, ang], -1).cos().to(dtype)
        sin = torch.cat([ang, ang], -1).sin().to(dtype)
        slot = torch.tensor([5], device=device)
        caches = [torch.zeros(B + 1, Hkv, S, D, device=device, dtype=dtype) for _ in range(4)]
        q1 = rope_and_cache(qkv, cos, sin, caches[0], caches[1], slot, H, Hkv, D)
        q2 = rope_and_cache_ref(qkv, cos, sin, caches[2], caches[3], slot, H, Hkv, D)
        if not (torch.allclose(q1.float(), q2.float(), atol=tol, rtol=tol)
                and torch.allclose(caches[0].float(), caches[2].float(), atol=tol, rtol=tol)
                and torch.equal(caches[1], caches[3])):
            return "rope_and_cache disagrees with torch"
    except Exception as exc:  # noqa: BLE001 - any failure means: use the torch path
        return f"{type(exc).__name__}: {exc}"
    return None

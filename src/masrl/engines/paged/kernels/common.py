"""Fused Triton kernels of the paged engine's decode step that know nothing of pages, each with the torch code it
replaces.

At batch 1 a decode step of a small model is a few hundred tiny kernels, and on a GPU each costs a couple of
microseconds however little it computes; so the step's time is its kernel count:

* ``rms_norm``: one kernel per row instead of six (square, mean, add, rsqrt, two multiplies);
* ``silu_mul``: the gated MLP's ``silu(gate) * up`` in one kernel instead of two;
* ``_rope_cache_kernel``: rotary embedding of q and k *and* writing k and v into the KV pool at each row's slot, in
  one kernel (instead of ~12); launched by ``paged.rope_and_cache_paged``.

The paged engine's kernels that read block tables are in ``paged.py``, the sampler in ``sample.py``.

Numerics: each kernel computes in fp32 and rounds once; the torch versions round after every op
(in bf16 that is a difference of about one bf16 ulp, measured by the engine's logprob checks).
``check`` runs every kernel against its torch version on random data once per engine; the engine
uses the kernels only if they agree, and its CPU path always uses torch.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from masrl.modeling.fused import on_device

try:  # triton comes with torch's CUDA builds; CPU-only installs lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


# -- torch references (also the CPU path) ------------------------------------------------------------

def rms_norm_ref(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


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
    def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, slot_ptr, slot_stride,
                           stride_qkv, stride_cs, kc_b, kc_h, kc_s, H: tl.constexpr, HKV: tl.constexpr,
                           D: tl.constexpr, HALF: tl.constexpr):
        # row b's k, v go to kc + b*kc_b + head*kc_h + slot*kc_s, slot = slots[b * slot_stride]: the paged pool
        # passes one slot per row (kc_b 0, stride 1)
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
            slot = tl.load(slot_ptr + b * slot_stride)
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
    with on_device(x):  # Triton launches on the current device: make it the tensors'
        _rms_norm_kernel[(x.shape[0],)](x, w, y, x.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y


def silu_mul(gu):
    B, n2 = gu.shape
    n = n2 // 2
    y = torch.empty((B, n), dtype=gu.dtype, device=gu.device)
    block = 1024
    with on_device(gu):
        _silu_mul_kernel[(B, triton.cdiv(n, block))](gu, y, gu.stride(0), y.stride(0), n, BLOCK=block)
    return y


def probe(device: torch.device, dtype: torch.dtype):
    """What the checks share: a seeded generator, random tensors of ``dtype`` and the agreement test."""
    g = torch.Generator(device=device).manual_seed(0)
    tol = 2e-2 if dtype != torch.float32 else 1e-4

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    def close(a, b):
        return torch.allclose(a.float(), b.float(), atol=tol, rtol=tol)

    return g, rnd, close


def check(device: torch.device, dtype: torch.dtype, H: int, Hkv: int, D: int, hidden: int, inter: int) -> dict:
    """Run every kernel against its torch version on random data: ``{name: None if it agrees, else why not}``."""
    g, rnd, close = probe(device, dtype)

    def rms():
        x, w = rnd(3, hidden), rnd(hidden)
        return close(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5))

    def silu():
        gu = rnd(3, 2 * inter)
        return close(silu_mul(gu), silu_mul_ref(gu))

    return verdicts({"rms_norm": rms, "silu_mul": silu})


def verdicts(checks: dict) -> dict:
    out = {}
    for name, fn in checks.items():
        try:
            out[name] = None if fn() else "disagrees with torch"
        except Exception as exc:  # noqa: BLE001 - any failure means: use the torch version
            out[name] = f"{type(exc).__name__}: {exc}"
    return out

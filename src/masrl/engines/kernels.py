"""Fused Triton kernels for the static engine's decode step, each with the torch code it replaces.

At batch 1 a decode step of a small model is a few hundred tiny kernels, and on a GPU each costs
a couple of microseconds however little it computes; so the step's time is its kernel count.
Four kernels take a layer from ~25 kernels to ~10:

* ``rms_norm``: one kernel per row instead of six (square, mean, add, rsqrt, two multiplies);
* ``rope_and_cache``: rotary embedding of q and k *and* writing k and v into the KV cache at the
  current slot, in one kernel (instead of ~12: slices, negation, concatenation, products, sums,
  two index copies); the slot is read from device memory, so a CUDA graph can replay it;
* ``silu_mul``: the gated MLP's ``silu(gate) * up`` in one kernel instead of two;
* ``decode_attention``: one query position against the cache, one program per (row, KV head)
  holding that head's whole query group, online softmax over blocks of 64 slots (PyTorch's
  memory-efficient kernel took ~13 us per call at batch 1 on an H200; this needs one pass over K/V).

The paged engine's kernels (the rope kernel with a slot per row, attention through block tables) are in
``paged_kernels.py``; both engines use the first three.

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


def decode_attention_ref(q, kc, vc, bias, S: int, scale: float):
    """``q [B, Hkv, G, D]`` against the first ``S`` slots of ``kc, vc [R, Hkv, slots, D]``;
    ``bias [R, slots]`` is 0 on valid slots and -inf elsewhere."""
    B = q.shape[0]
    return F.scaled_dot_product_attention(q, kc[:B, :, :S], vc[:B, :, :S], attn_mask=bias[:B, None, None, :S], scale=scale)


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
        # row b's k, v go to kc + b*kc_b + head*kc_h + slot*kc_s, slot = slots[b * slot_stride]: the static
        # cache passes one slot for every row (stride 0), the paged pool one per row (kc_b 0, stride 1)
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
    def _decode_attn_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, o_ptr, S, scale, stride_kb, stride_kh, stride_ks, stride_bb,
                            HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                            PREC: tl.constexpr):
        _decode_attn(q_ptr, k_ptr, v_ptr, bias_ptr, o_ptr, S, scale, stride_kb, stride_kh, stride_ks, stride_bb,
                     HKV, G, GP, D, BLOCK, PREC)

    @triton.jit
    def _decode_attn_kernel_s(q_ptr, k_ptr, v_ptr, bias_ptr, o_ptr, S: tl.constexpr, scale, stride_kb, stride_kh,
                              stride_ks, stride_bb, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                              D: tl.constexpr, BLOCK: tl.constexpr, PREC: tl.constexpr):
        # the same with S known at compile time: Triton's CPU interpreter cannot loop to a run-time bound
        _decode_attn(q_ptr, k_ptr, v_ptr, bias_ptr, o_ptr, S, scale, stride_kb, stride_kh, stride_ks, stride_bb,
                     HKV, G, GP, D, BLOCK, PREC)

    @triton.jit
    def _decode_attn(q_ptr, k_ptr, v_ptr, bias_ptr, o_ptr, S, scale, stride_kb, stride_kh, stride_ks, stride_bb,
                     HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                     PREC: tl.constexpr):
        # one program per (row, kv head); PREC: "tf32" (exact for bf16 inputs) or "ieee" (fp32 caches):
        # its G query heads against the row's keys, online softmax
        b = tl.program_id(0)
        h = tl.program_id(1)
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        gm = g < G
        qo = ((b * HKV + h) * G + g[:, None]) * D + d[None, :]
        q = tl.load(q_ptr + qo, mask=gm[:, None], other=0.0).to(tl.float32)  # bf16 is exact in tf32
        m_i = tl.full([GP], -1.0e30, tl.float32)  # finite: a block with no valid key leaves the state alone
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        kbase = k_ptr + b * stride_kb + h * stride_kh
        vbase = v_ptr + b * stride_kb + h * stride_kh
        for start in range(0, S, BLOCK):
            sl = start + tl.arange(0, BLOCK)
            sm = sl < S
            k = tl.load(kbase + sl[:, None] * stride_ks + d[None, :], mask=sm[:, None], other=0.0).to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
            bias = tl.load(bias_ptr + b * stride_bb + sl, mask=sm, other=float("-inf")).to(tl.float32)
            scores = scores + bias[None, :]
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(vbase + sl[:, None] * stride_ks + d[None, :], mask=sm[:, None], other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PREC)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(o_ptr + qo, out.to(o_ptr.dtype.element_ty), mask=gm[:, None])

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


def rope_and_cache(qkv, cos, sin, kc, vc, slot, H: int, Hkv: int, D: int):
    B = qkv.shape[0]
    q = torch.empty((B, H, D), dtype=qkv.dtype, device=qkv.device)
    assert kc.stride(3) == 1 and kc.stride() == vc.stride() and cos.stride(0) == sin.stride(0)
    with on_device(qkv):
        _rope_cache_kernel[(B, H + Hkv)](qkv, cos, sin, q, kc, vc, slot, 0, qkv.stride(0), cos.stride(0),
                                         kc.stride(0), kc.stride(1), kc.stride(2), H=H, HKV=Hkv, D=D, HALF=D // 2)
    return q.view(B, Hkv, H // Hkv, D)


def decode_attention(q, kc, vc, bias, S: int, scale: float):
    B, Hkv, G, D = q.shape
    o = torch.empty_like(q)
    assert q.is_contiguous() and kc.stride(3) == 1 and kc.stride() == vc.stride() and bias.stride(1) == 1
    kernel = _decode_attn_kernel_s if _INTERPRET else _decode_attn_kernel
    with on_device(q):
        kernel[(B, Hkv)](q, kc, vc, bias, o, S, scale, kc.stride(0), kc.stride(1), kc.stride(2), bias.stride(0),
                         HKV=Hkv, G=G, GP=max(16, triton.next_power_of_2(G)), D=D, BLOCK=64,
                         PREC="ieee" if q.dtype == torch.float32 else "tf32")
    return o


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

    def rope():
        B, S = 3, 16
        qkv = rnd(B, (H + 2 * Hkv) * D)
        ang = rnd(B, D // 2).float()
        cos, sin = torch.cat([ang, ang], -1).cos().to(dtype), torch.cat([ang, ang], -1).sin().to(dtype)
        slot = torch.tensor([5], device=device)
        c = [torch.zeros(B + 1, Hkv, S, D, device=device, dtype=dtype) for _ in range(4)]
        q1 = rope_and_cache(qkv, cos, sin, c[0], c[1], slot, H, Hkv, D)
        q2 = rope_and_cache_ref(qkv, cos, sin, c[2], c[3], slot, H, Hkv, D)
        return close(q1, q2) and close(c[0], c[2]) and torch.equal(c[1], c[3])

    def attention():
        B, cap, S = 3, 160, 130
        kc, vc = rnd(B + 2, Hkv, cap, D), rnd(B + 2, Hkv, cap, D)
        bias = torch.zeros(B + 2, cap, device=device, dtype=dtype)
        bias[0, :70] = float("-inf")  # a row whose first block has no valid key
        bias[1, 5:90] = float("-inf")
        bias[:, S:] = float("-inf")
        q = rnd(B, Hkv, H // Hkv, D)
        return close(decode_attention(q, kc, vc, bias, S, D**-0.5), decode_attention_ref(q, kc, vc, bias, S, D**-0.5))

    return verdicts({"rms_norm": rms, "silu_mul": silu, "rope_and_cache": rope, "decode_attention": attention})


def verdicts(checks: dict) -> dict:
    out = {}
    for name, fn in checks.items():
        try:
            out[name] = None if fn() else "disagrees with torch"
        except Exception as exc:  # noqa: BLE001 - any failure means: use the torch version
            out[name] = f"{type(exc).__name__}: {exc}"
    return out

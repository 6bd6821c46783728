"""The paged engine's Triton kernels that read block tables, each with the torch code it replaces (``common.py``
holds the ones that know nothing of pages).

* ``rope_and_cache_paged``: ``common._rope_cache_kernel`` with a slot per row: each row's k and v to its
  own slot of a ``[slots, Hkv, D]`` pool;
* ``paged_attention``: one query position against each row's own tokens, looked up through its block
  table, each row stopping at its own length read from device memory (so a CUDA graph replays any length);
  launch settings by input kind and length class (``PAGED_LAUNCH``, ``paged_length_class``);
* ``paged_rope_attention``: the two as one launch, for the short length class (the engine's ``fused_rope``);
* split attention (``paged_attention(..., splits=n)``, ``paged_splits``): a long row's keys in runs, one
  program each, added up by a second kernel, so that a few long rows fill the GPU.

``check`` runs them against their torch versions on random data, as ``common.check`` does the others; the
paged engine uses a kernel only if it agrees (``kernels/__init__.py``: the registry).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from masrl.engines.paged.kernels.common import on_device, probe, triton, verdicts

if triton is not None:
    import triton.language as tl

    from masrl.engines.paged.kernels.common import _rope_cache_kernel


# -- torch references (also the CPU path) ------------------------------------------------------------

def rope_and_cache_paged_ref(qkv, cos, sin, kf, vf, slots, H: int, Hkv: int, D: int):
    """The paged layout: ``kf, vf [slots, Hkv, D]``; row b's k, v go to slot ``slots[b]``."""
    B = qkv.shape[0]
    qk = qkv[:, : (H + Hkv) * D].view(B, H + Hkv, D)
    c, s = cos[:, None, :], sin[:, None, :]
    qk = qk * c + torch.cat([-qk[..., D // 2 :], qk[..., : D // 2]], dim=-1) * s
    kf.index_copy_(0, slots, qk[:, H:].to(kf.dtype))
    vf.index_copy_(0, slots, qkv[:, (H + Hkv) * D :].view(B, Hkv, D))
    return qk[:, :H].reshape(B, Hkv, H // Hkv, D)


def paged_attention_ref(q, kf, vf, tables, lens, S: int, block_size: int, scale: float):
    """``q [B, Hkv, G, D]`` against the first ``lens[b]`` tokens of row b, whose token t lives in slot
    ``tables[b, t // block_size] * block_size + t % block_size`` of ``kf, vf [slots, Hkv, D]``;
    ``S``: at least the longest row."""
    B = q.shape[0]
    t = torch.arange(S, device=q.device)
    idx = tables[:B, t // block_size].long() * block_size + t % block_size  # [B, S]
    k = kf[idx].permute(0, 2, 1, 3)  # [B, Hkv, S, D]
    v = vf[idx].permute(0, 2, 1, 3)
    valid = t[None, :] < lens[:B, None]
    bias = torch.zeros(valid.shape, dtype=q.dtype, device=q.device).masked_fill_(~valid, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, None, None, :], scale=scale)


def paged_rope_attention_ref(qkv, cos, sin, kf, vf, slots, tables, lens, H: int, Hkv: int, D: int, S: int,
                             block_size: int, scale: float):
    """``rope_and_cache_paged_ref`` then ``paged_attention_ref``: this step's k, v into the pool, the roped
    query against each row's ``lens[b]`` tokens (this step's last); returns ``[B, H*D]``."""
    q = rope_and_cache_paged_ref(qkv, cos, sin, kf, vf, slots, H, Hkv, D).to(qkv.dtype)
    return paged_attention_ref(q, kf, vf, tables, lens, S, block_size, scale).reshape(qkv.shape[0], H * D)


if triton is not None:

    @triton.jit
    def _online_softmax_step(scores, tm, v, m_i, l_i, acc, PREC: tl.constexpr, LOWP: tl.constexpr):
        # one block of keys into the running max, sum and output: keys past the row's length (tm false) count
        # for nothing; LOWP: p.v as two 16-bit MMAs, p = hi + lo (about 16 bits of mantissa against tf32's 10)
        scores = tl.where(tm[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if LOWP:
            p_hi = p.to(v.dtype)
            p_lo = (p - p_hi.to(tl.float32)).to(v.dtype)
            pv = tl.dot(p_hi, v) + tl.dot(p_lo, v)
        else:
            pv = tl.dot(p, v.to(tl.float32), input_precision=PREC)
        return m_new, l_i, acc * alpha[:, None] + pv

    @triton.jit
    def _paged_attn_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, len_ptr, o_ptr, part_ptr, scale, stride_ks, stride_kh,
                           stride_bt, NS, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                           BS: tl.constexpr, BLOCK: tl.constexpr, PREC: tl.constexpr, LOWP: tl.constexpr,
                           SPLIT: tl.constexpr):
        # one program per (row, kv head), over the row's own length only (read from device memory, so a
        # CUDA graph replays any length): token t at slot bt[b, t // BS] * BS + t % BS. LOWP (bf16/fp16
        # inputs): q.k and p.v as 16-bit MMAs with fp32 accumulation; q.k is then exact as in tf32.
        # SPLIT: program (b, h, s) takes the s-th of NS runs of whole blocks of the row's keys and writes its
        # running max, sum and unscaled output to part_ptr [B, HKV, NS, GP, D + 2]; _paged_combine_kernel
        # adds the runs up (few long rows: a program a row would leave most of the GPU idle)
        b = tl.program_id(0)
        h = tl.program_id(1)
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        gm = g < G
        qo = ((b * HKV + h) * G + g[:, None]) * D + d[None, :]
        q = tl.load(q_ptr + qo, mask=gm[:, None], other=0.0)
        if not LOWP:
            q = q.to(tl.float32)
        m_i = tl.full([GP], -1.0e30, tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        L = tl.load(len_ptr + b)
        lo = 0
        if SPLIT:
            run = tl.cdiv(tl.cdiv(L, NS), BLOCK) * BLOCK
            lo = tl.program_id(2) * run
            L = tl.minimum(L, lo + run)
        for start in range(lo, L, BLOCK):
            t = start + tl.arange(0, BLOCK)
            tm = t < L
            page = tl.load(bt_ptr + b * stride_bt + t // BS, mask=tm, other=0).to(tl.int64)
            slot = page * BS + t % BS
            off = slot[:, None] * stride_ks + h * stride_kh + d[None, :]
            k = tl.load(k_ptr + off, mask=tm[:, None], other=0.0)
            v = tl.load(v_ptr + off, mask=tm[:, None], other=0.0)
            if LOWP:
                scores = tl.dot(q, tl.trans(k)) * scale
            else:
                scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=PREC) * scale
            m_i, l_i, acc = _online_softmax_step(scores, tm, v, m_i, l_i, acc, PREC, LOWP)
        if SPLIT:  # an empty run leaves m -1e30, l 0, acc 0: it weighs nothing in the sum
            base = part_ptr + ((b * HKV + h) * NS + tl.program_id(2)) * GP * (D + 2)
            tl.store(base + g[:, None] * (D + 2) + d[None, :], acc)
            tl.store(base + g * (D + 2) + D, m_i)
            tl.store(base + g * (D + 2) + D + 1, l_i)
        else:
            out = acc / l_i[:, None]
            tl.store(o_ptr + qo, out.to(o_ptr.dtype.element_ty), mask=gm[:, None])

    @triton.jit
    def _paged_combine_kernel(part_ptr, o_ptr, NS, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                              D: tl.constexpr, NSP: tl.constexpr):
        # the NS runs of (row b, kv head h, query g) as one softmax: each run's sum and output rescaled to the
        # largest running max. One program a query, every run loaded at once (a loop over the runs, a program
        # a KV head, took 11 us a layer at 32 runs: one dependent load after another)
        b = tl.program_id(0)
        h = tl.program_id(1)
        g = tl.program_id(2)
        s = tl.arange(0, NSP)
        d = tl.arange(0, D)
        sm = s < NS
        base = part_ptr + (((b * HKV + h) * NS + s) * GP + g) * (D + 2)
        m_s = tl.load(base + D, mask=sm, other=-1.0e30)
        l_s = tl.load(base + D + 1, mask=sm, other=0.0)
        a_s = tl.load(base[:, None] + d[None, :], mask=sm[:, None], other=0.0)
        w = tl.exp(m_s - tl.max(m_s, 0))
        out = tl.sum(a_s * w[:, None], 0) / tl.sum(l_s * w, 0)
        tl.store(o_ptr + ((b * HKV + h) * G + g) * D + d, out.to(o_ptr.dtype.element_ty))

    @triton.jit
    def _paged_rope_attn_kernel(qkv_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, slot_ptr, bt_ptr, len_ptr, o_ptr, scale,
                                stride_qkv, stride_cs, stride_ks, stride_kh, stride_bt, H: tl.constexpr,
                                HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                                HALF: tl.constexpr, BS: tl.constexpr, BLOCK: tl.constexpr, PREC: tl.constexpr,
                                LOWP: tl.constexpr):
        # _rope_cache_kernel and _paged_attn_kernel in one program per (row, kv head): rope this head's G
        # queries and its key (each rounded to the pool's dtype, as the two kernels store them), write the key
        # and value at the row's slot, attend over the row's earlier len - 1 tokens from the pool (never the
        # slot just written, so no program reads another's store), then this step's token from registers.
        # Queries and keys are kept as two halves, the rotation's own split: q.k = q1.k1 + q2.k2
        b = tl.program_id(0)
        h = tl.program_id(1)
        g = tl.arange(0, GP)
        i = tl.arange(0, HALF)
        d = tl.arange(0, D)
        gm = g < G
        dt = k_ptr.dtype.element_ty
        c1 = tl.load(cos_ptr + b * stride_cs + i).to(tl.float32)
        c2 = tl.load(cos_ptr + b * stride_cs + HALF + i).to(tl.float32)
        s1 = tl.load(sin_ptr + b * stride_cs + i).to(tl.float32)
        s2 = tl.load(sin_ptr + b * stride_cs + HALF + i).to(tl.float32)
        qrow = qkv_ptr + b * stride_qkv + (h * G + g[:, None]) * D
        x1 = tl.load(qrow + i[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
        x2 = tl.load(qrow + HALF + i[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
        q1 = (x1 * c1[None, :] - x2 * s1[None, :]).to(dt)
        q2 = (x2 * c2[None, :] + x1 * s2[None, :]).to(dt)
        krow = qkv_ptr + b * stride_qkv + (H + h) * D
        y1 = tl.load(krow + i).to(tl.float32)
        y2 = tl.load(krow + HALF + i).to(tl.float32)
        k1 = (y1 * c1 - y2 * s1).to(dt)
        k2 = (y2 * c2 + y1 * s2).to(dt)
        vn = tl.load(qkv_ptr + b * stride_qkv + (H + HKV + h) * D + d).to(dt)
        here = tl.load(slot_ptr + b).to(tl.int64) * stride_ks + h * stride_kh
        tl.store(k_ptr + here + i, k1)
        tl.store(k_ptr + here + HALF + i, k2)
        tl.store(v_ptr + here + d, vn)
        if not LOWP:
            q1 = q1.to(tl.float32)
            q2 = q2.to(tl.float32)
        m_i = tl.full([GP], -1.0e30, tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        L = tl.load(len_ptr + b) - 1
        for start in range(0, L, BLOCK):
            t = start + tl.arange(0, BLOCK)
            tm = t < L
            page = tl.load(bt_ptr + b * stride_bt + t // BS, mask=tm, other=0).to(tl.int64)
            off = (page * BS + t % BS)[:, None] * stride_ks + h * stride_kh
            ka = tl.load(k_ptr + off + i[None, :], mask=tm[:, None], other=0.0)
            kb = tl.load(k_ptr + off + HALF + i[None, :], mask=tm[:, None], other=0.0)
            v = tl.load(v_ptr + off + d[None, :], mask=tm[:, None], other=0.0)
            if LOWP:
                scores = (tl.dot(q1, tl.trans(ka)) + tl.dot(q2, tl.trans(kb))) * scale
            else:
                scores = (tl.dot(q1, tl.trans(ka.to(tl.float32)), input_precision=PREC)
                          + tl.dot(q2, tl.trans(kb.to(tl.float32)), input_precision=PREC)) * scale
            m_i, l_i, acc = _online_softmax_step(scores, tm, v, m_i, l_i, acc, PREC, LOWP)
        s_new = (tl.sum(q1.to(tl.float32) * k1.to(tl.float32)[None, :], 1)
                 + tl.sum(q2.to(tl.float32) * k2.to(tl.float32)[None, :], 1)) * scale
        m_new = tl.maximum(m_i, s_new)
        alpha = tl.exp(m_i - m_new)
        p_new = tl.exp(s_new - m_new)
        l_i = l_i * alpha + p_new
        acc = acc * alpha[:, None] + p_new[:, None] * vn.to(tl.float32)[None, :]
        out = acc / l_i[:, None]
        tl.store(o_ptr + (b * H + h * G + g[:, None]) * D + d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=gm[:, None])


def rope_and_cache_paged(qkv, cos, sin, kf, vf, slots, H: int, Hkv: int, D: int):
    B = qkv.shape[0]
    q = torch.empty((B, H, D), dtype=qkv.dtype, device=qkv.device)
    assert kf.stride(2) == 1 and kf.stride() == vf.stride() and cos.stride(0) == sin.stride(0)
    with on_device(qkv):
        _rope_cache_kernel[(B, H + Hkv)](qkv, cos, sin, q, kf, vf, slots, 1, qkv.stride(0), cos.stride(0),
                                         0, kf.stride(1), kf.stride(0), H=H, HKV=Hkv, D=D, HALF=D // 2)
    return q.view(B, Hkv, H // Hkv, D)


# launch settings of ``paged_attention`` by input kind, from benchmarks/kernel_sweep.py on an H200 (0.5B shape:
# 2 KV heads of 64, query groups of 7): at batch 256 x ~192 keys, 16-bit MMAs over 64 keys a block took 9.8-10.0
# us against 11.8-11.9 for tf32 (the earlier setting); 128 keys a block was fastest at batch 64 x 2,048 keys (35.6
# against 58.6 us) but no faster at batch 256 x ~192 (11.8 us). So the paged engine keys its decode graphs by a
# length class too: a batch whose longest row passes PAGED_LONG_KEYS takes "lowp_long". The sweep at five lengths
# (2026-12-02): 64-key blocks win at ~192 keys a row (9.9 against 11.8 us), 128-key blocks from ~512 on (12.35
# against 14.60 us at batch 128; 1.56x at 1,024, 1.64x at 2,048, 1.87x at 8,192); the class goes by the longest
# row, so the threshold sits at the shortest length measured where the long blocks won (docs/benchmarks.md)
PAGED_LAUNCH = {"lowp": {"LOWP": True, "BLOCK": 64, "num_warps": 4, "num_stages": 2},
                "lowp_long": {"LOWP": True, "BLOCK": 128, "num_warps": 4, "num_stages": 3},
                "fp32": {"LOWP": False, "BLOCK": 64, "num_warps": 4, "num_stages": 3}}
PAGED_LONG_KEYS = 512


def paged_length_class(top: int) -> int:
    """0 while every row has at most ``PAGED_LONG_KEYS`` keys, else ``PAGED_LONG_KEYS``: the ``S`` of a paged
    decode graph's key when the fused kernel reads each row's own length."""
    return PAGED_LONG_KEYS if top > PAGED_LONG_KEYS else 0


def paged_launch(dtype: torch.dtype, S: int, launch: dict | None = None) -> dict:
    """The paged attention kernels' launch settings for a pool of ``dtype`` and a graph of length class ``S``;
    ``launch`` overrides them, except that an fp32 pool never rounds to 16 bits."""
    fp32 = dtype == torch.float32
    cfg = {**PAGED_LAUNCH["fp32" if fp32 else "lowp_long" if S >= PAGED_LONG_KEYS else "lowp"], **(launch or {})}
    if fp32:
        cfg["LOWP"] = False
    return cfg


# split attention (flash-decoding) for few long rows: a program a (row, KV head) over 16,000 keys runs one long
# loop on one SM while the others idle. A long-class graph of B rows splits each row's keys into
# paged_splits(B, ...) runs of whole blocks, enough for about PAGED_SPLIT_PROGRAMS programs, at most
# PAGED_MAX_SPLITS runs a row (benchmarks/kernel_sweep.py --only split); short rows never split
PAGED_SPLIT_PROGRAMS = 256
PAGED_MAX_SPLITS = 32


def paged_splits(B: int, Hkv: int, S: int) -> int:
    """Runs each row's keys are split into in a decode graph of ``B`` rows and length class ``S``: 1 (no
    split) for the short class and wherever ``B * Hkv`` programs already fill ``PAGED_SPLIT_PROGRAMS``."""
    if S < PAGED_LONG_KEYS:
        return 1
    return max(1, min(PAGED_MAX_SPLITS, PAGED_SPLIT_PROGRAMS // (B * Hkv)))


def paged_attention(q, kf, vf, tables, lens, S: int, block_size: int, scale: float, launch: dict | None = None,
                    splits: int = 1):
    """``paged_attention_ref`` as one kernel; each row stops at its own length, and ``S`` (a length class,
    ``paged_length_class``) picks the launch settings (``paged_launch``); ``launch`` overrides them (LOWP,
    BLOCK, num_warps, num_stages). ``splits`` > 1: each row's keys in that many runs, one program each, then
    a second kernel adds the runs up (``paged_splits`` says how many)."""
    B, Hkv, G, D = q.shape
    o = torch.empty_like(q)
    assert q.is_contiguous() and kf.stride(2) == 1 and kf.stride() == vf.stride() and tables.stride(1) == 1
    GP = max(16, triton.next_power_of_2(G))
    part = torch.empty((B, Hkv, splits, GP, D + 2), dtype=torch.float32, device=q.device) if splits > 1 else o
    with on_device(q):
        _paged_attn_kernel[(B, Hkv, splits)](q, kf, vf, tables, lens, o, part, scale, kf.stride(0), kf.stride(1),
                                             tables.stride(0), splits, HKV=Hkv, G=G, GP=GP, D=D, BS=block_size,
                                             PREC="ieee" if q.dtype == torch.float32 else "tf32", SPLIT=splits > 1,
                                             **paged_launch(q.dtype, S, launch))
        if splits > 1:
            _paged_combine_kernel[(B, Hkv, G)](part, o, splits, HKV=Hkv, G=G, GP=GP, D=D,
                                                NSP=max(2, triton.next_power_of_2(splits)))
    return o


# one kernel for rope_and_cache_paged + paged_attention in the paged engine's decode step (one launch a layer
# fewer). kernel_sweep.py on an H200: 11.36 against 13.48 us at batch 256 x ~192 keys (0.84x), 43.30 against 39.31
# at batch 64 x 2,048 (1.10x), so the engine uses it for the short length class only (its ``fused_rope`` option;
# tests/gpu/test_paged_gpu.py runs the engine both ways)
def paged_rope_attention(qkv, cos, sin, kf, vf, slots, tables, lens, H: int, Hkv: int, D: int, S: int,
                         block_size: int, scale: float, launch: dict | None = None):
    """``paged_rope_attention_ref`` as one kernel (launch settings as ``paged_attention``'s)."""
    B = qkv.shape[0]
    o = torch.empty((B, H * D), dtype=qkv.dtype, device=qkv.device)
    assert kf.stride(2) == 1 and kf.stride() == vf.stride() and cos.stride(0) == sin.stride(0)
    assert qkv.stride(1) == 1 and tables.stride(1) == 1
    G = H // Hkv
    with on_device(qkv):
        _paged_rope_attn_kernel[(B, Hkv)](qkv, cos, sin, kf, vf, slots, tables, lens, o, scale, qkv.stride(0),
                                          cos.stride(0), kf.stride(0), kf.stride(1), tables.stride(0), H=H, HKV=Hkv,
                                          G=G, GP=max(16, triton.next_power_of_2(G)), D=D, HALF=D // 2,
                                          BS=block_size, PREC="ieee" if kf.dtype == torch.float32 else "tf32",
                                          **paged_launch(kf.dtype, S, launch))
    return o


def check(device: torch.device, dtype: torch.dtype, H: int, Hkv: int, D: int) -> dict:
    """Run every paged kernel against its torch version on random data: ``{name: None if it agrees, else why not}``."""
    g, rnd, close = probe(device, dtype)

    def rope_paged():
        B, slots = 3, 40
        qkv = rnd(B, (H + 2 * Hkv) * D)
        ang = rnd(B, D // 2).float()
        cos, sin = torch.cat([ang, ang], -1).cos().to(dtype), torch.cat([ang, ang], -1).sin().to(dtype)
        where = torch.tensor([7, 33, 2], device=device)
        c = [torch.zeros(slots, Hkv, D, device=device, dtype=dtype) for _ in range(4)]
        q1 = rope_and_cache_paged(qkv, cos, sin, c[0], c[1], where, H, Hkv, D)
        q2 = rope_and_cache_paged_ref(qkv, cos, sin, c[2], c[3], where, H, Hkv, D)
        return close(q1, q2) and close(c[0], c[2]) and torch.equal(c[1], c[3])

    def attention_paged(**kw):
        kf, vf, tables, lens, bs = _pool_case(rnd, g, device, Hkv, D)
        q = rnd(3, Hkv, H // Hkv, D)
        a = paged_attention(q, kf, vf, tables, lens, 160, bs, D**-0.5, **kw)
        return close(a, paged_attention_ref(q, kf, vf, tables, lens, 160, bs, D**-0.5))

    def attention_split():  # runs of 64 keys ([0, 64), [64, 128), [128, 160)), empty runs included
        return attention_paged(launch={"BLOCK": 64}, splits=3)

    return verdicts({"rope_and_cache_paged": rope_paged, "paged_attention": attention_paged,
                     "paged_attention_split": attention_split,
                     "paged_rope_attention": lambda: _check_rope_attention_paged(rnd, close, g, device, dtype, H, Hkv,
                                                                                  D)})


def _pool_case(rnd, g, device, Hkv: int, D: int):
    """A pool of 40 random blocks of 16 slots and 3 rows over 10 of them each, 1, 70 and 160 tokens long:
    ``kf, vf, tables, lens, block_size``."""
    bs, blocks = 16, 40
    kf, vf = rnd(blocks * bs, Hkv, D), rnd(blocks * bs, Hkv, D)
    tables = torch.randperm(blocks - 1, generator=g, device=device)[:30].add(1).view(3, 10).to(torch.int32)
    lens = torch.tensor([1, 70, 160], dtype=torch.int32, device=device)
    return kf, vf, tables, lens, bs


def _check_rope_attention_paged(rnd, close, g, device, dtype, H: int, Hkv: int, D: int) -> bool:
    """``paged_rope_attention`` against its torch version: the output and the pool it wrote."""
    B = 3
    kf, vf, tables, lens, bs = _pool_case(rnd, g, device, Hkv, D)
    pos = lens.long() - 1
    slots = tables.gather(1, (pos // bs)[:, None]).squeeze(1).long() * bs + pos % bs
    qkv = rnd(B, (H + 2 * Hkv) * D)
    ang = rnd(B, D // 2).float()
    cos, sin = torch.cat([ang, ang], -1).cos().to(dtype), torch.cat([ang, ang], -1).sin().to(dtype)
    c = [t.clone() for t in (kf, vf, kf, vf)]
    a = paged_rope_attention(qkv, cos, sin, c[0], c[1], slots, tables, lens, H, Hkv, D, 0, bs, D**-0.5)
    b = paged_rope_attention_ref(qkv, cos, sin, c[2], c[3], slots, tables, lens, H, Hkv, D, 160, bs, D**-0.5)
    return close(a, b) and close(c[0], c[2]) and torch.equal(c[1], c[3])

"""Fused forward/backward ops for the trainer on CUDA (Triton), each with the torch code it replaces.

In an update of a small model the matmuls are few and large, and what else it does is
memory-bound elementwise work launched as many small kernels. Three ops carry most of it:

* ``rope``: ``x * cos + rotate_half(x) * sin`` is five kernels forward and more backward; fused it
  is one kernel each way (the backward of a rotation by an angle is the rotation by minus that
  angle, so it is the same kernel with ``-sin``);
* ``swiglu``: ``silu(gate) * up``, one kernel forward and one backward (instead of ~6);
* ``token_logprobs``: the log-probability of one token per row of bf16 logits, without writing
  the fp32 log-softmax of the whole ``[N, vocab]`` matrix: forward keeps only each row's
  log-sum-exp; backward writes ``g * (onehot - softmax)`` straight into a bf16 gradient.

``enabled(device)`` runs each fused op forward and backward against its torch version on random
data once per device; ops that disagree (or fail) fall back to torch, as does every CPU tensor.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

_VERDICT: dict[str, dict[str, bool]] = {}
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def on_device(t: torch.Tensor):
    """Triton launches on the current CUDA device: make it the tensor's (a policy may train on one GPU
    and sample on another, in one process)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


# -- torch versions ---------------------------------------------------------------------------------

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_ref(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def swiglu_ref(gate, up):
    return F.silu(gate) * up


def token_logprobs_ref(logits, tokens):
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32).gather(-1, tokens[:, None]).squeeze(-1)


# -- kernels ------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, heads, sign, HALF: tl.constexpr):
        t = tl.program_id(0)  # one program per (token, head)
        hd = tl.program_id(1)
        i = tl.arange(0, HALF)
        base = (t * heads + hd) * 2 * HALF
        x1 = tl.load(x_ptr + base + i).to(tl.float32)
        x2 = tl.load(x_ptr + base + HALF + i).to(tl.float32)
        c1 = tl.load(cos_ptr + t * 2 * HALF + i).to(tl.float32)
        c2 = tl.load(cos_ptr + t * 2 * HALF + HALF + i).to(tl.float32)
        s1 = tl.load(sin_ptr + t * 2 * HALF + i).to(tl.float32) * sign
        s2 = tl.load(sin_ptr + t * 2 * HALF + HALF + i).to(tl.float32) * sign
        tl.store(y_ptr + base + i, (x1 * c1 - x2 * s1).to(y_ptr.dtype.element_ty))
        tl.store(y_ptr + base + HALF + i, (x2 * c2 + x1 * s2).to(y_ptr.dtype.element_ty))

    @triton.jit
    def _swiglu_fwd(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        g = tl.load(g_ptr + i, mask=m, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + i, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + i, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _swiglu_bwd(g_ptr, u_ptr, go_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        g = tl.load(g_ptr + i, mask=m, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + i, mask=m, other=0.0).to(tl.float32)
        go = tl.load(go_ptr + i, mask=m, other=0.0).to(tl.float32)
        sg = tl.sigmoid(g)
        tl.store(du_ptr + i, (go * g * sg).to(du_ptr.dtype.element_ty), mask=m)
        tl.store(dg_ptr + i, (go * u * sg * (1.0 + g * (1.0 - sg))).to(dg_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _logprob_fwd(z_ptr, tok_ptr, lp_ptr, lse_ptr, V, stride, BLOCK: tl.constexpr):
        _logprob_fwd_body(z_ptr, tok_ptr, lp_ptr, lse_ptr, V, stride, BLOCK)

    @triton.jit
    def _logprob_fwd_s(z_ptr, tok_ptr, lp_ptr, lse_ptr, V: tl.constexpr, stride, BLOCK: tl.constexpr):
        # V known at compile time: Triton's CPU interpreter cannot loop to a run-time bound
        _logprob_fwd_body(z_ptr, tok_ptr, lp_ptr, lse_ptr, V, stride, BLOCK)

    @triton.jit
    def _logprob_bwd(z_ptr, tok_ptr, lse_ptr, go_ptr, dz_ptr, V, stride, BLOCK: tl.constexpr):
        _logprob_bwd_body(z_ptr, tok_ptr, lse_ptr, go_ptr, dz_ptr, V, stride, BLOCK)

    @triton.jit
    def _logprob_bwd_s(z_ptr, tok_ptr, lse_ptr, go_ptr, dz_ptr, V: tl.constexpr, stride, BLOCK: tl.constexpr):
        _logprob_bwd_body(z_ptr, tok_ptr, lse_ptr, go_ptr, dz_ptr, V, stride, BLOCK)

    @triton.jit
    def _logprob_fwd_body(z_ptr, tok_ptr, lp_ptr, lse_ptr, V, stride, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = z_ptr + row.to(tl.int64) * stride
        m = tl.full([BLOCK], -1.0e30, tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            c = start + tl.arange(0, BLOCK)
            z = tl.load(base + c, mask=c < V, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, z)
            s = s * tl.exp(m - m_new) + tl.exp(z - m_new)
            m = m_new
        mx = tl.max(m, 0)
        lse = mx + tl.log(tl.sum(s * tl.exp(m - mx), 0))
        t = tl.load(tok_ptr + row)
        zt = tl.load(base + t).to(tl.float32)
        tl.store(lp_ptr + row, zt - lse)
        tl.store(lse_ptr + row, lse)

    @triton.jit
    def _logprob_bwd_body(z_ptr, tok_ptr, lse_ptr, go_ptr, dz_ptr, V, stride, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = row.to(tl.int64) * stride
        lse = tl.load(lse_ptr + row)
        go = tl.load(go_ptr + row)
        t = tl.load(tok_ptr + row)
        for start in range(0, V, BLOCK):
            c = start + tl.arange(0, BLOCK)
            z = tl.load(z_ptr + base + c, mask=c < V, other=-float("inf")).to(tl.float32)
            d = go * (tl.where(c == t, 1.0, 0.0) - tl.exp(z - lse))
            tl.store(dz_ptr + base + c, d.to(dz_ptr.dtype.element_ty), mask=c < V)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope_launch(x, cos, sin, 1.0)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return _rope_launch(g, cos, sin, -1.0), None, None


def _rope_launch(x, cos, sin, sign: float):
    """``x [..., heads, D]`` contiguous; ``cos, sin`` broadcast as ``[..., 1, D]``."""
    x = x.contiguous()
    D, heads = x.shape[-1], x.shape[-2]
    tokens = x.numel() // (heads * D)
    c = cos.expand(*x.shape[:-2], 1, D).reshape(tokens, D)
    s = sin.expand(*x.shape[:-2], 1, D).reshape(tokens, D)
    y = torch.empty_like(x)
    with on_device(x):  # Triton launches on the current device: make it the tensors'
        _rope_kernel[(tokens, heads)](x, c, s, y, heads, sign, HALF=D // 2)
    return y


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        y = torch.empty_like(gate)
        n = gate.numel()
        with on_device(gate):
            _swiglu_fwd[(triton.cdiv(n, 1024),)](gate, up, y, n, BLOCK=1024)
        return y

    @staticmethod
    def backward(ctx, go):
        gate, up = ctx.saved_tensors
        go = go.contiguous()
        dg, du = torch.empty_like(gate), torch.empty_like(up)
        n = gate.numel()
        with on_device(gate):
            _swiglu_bwd[(triton.cdiv(n, 1024),)](gate, up, go, dg, du, n, BLOCK=1024)
        return dg, du


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, tokens):
        logits = logits.contiguous()
        N, V = logits.shape
        lp = torch.empty(N, dtype=torch.float32, device=logits.device)
        lse = torch.empty(N, dtype=torch.float32, device=logits.device)
        with on_device(logits):
            (_logprob_fwd_s if _INTERPRET else _logprob_fwd)[(N,)](logits, tokens, lp, lse, V, logits.stride(0),
                                                                   BLOCK=4096, num_warps=8)
        ctx.save_for_backward(logits, tokens, lse)
        return lp

    @staticmethod
    def backward(ctx, go):
        logits, tokens, lse = ctx.saved_tensors
        dz = torch.empty_like(logits)
        N, V = logits.shape
        with on_device(logits):
            (_logprob_bwd_s if _INTERPRET else _logprob_bwd)[(N,)](logits, tokens, lse, go.contiguous().float(), dz,
                                                                   V, logits.stride(0), BLOCK=4096, num_warps=8)
        return dz, None


# -- the ops the model code calls ------------------------------------------------------------------------

def rope(x, cos, sin):
    return _Rope.apply(x, cos, sin) if _use("rope", x) else rope_ref(x, cos, sin)


def swiglu(gate, up):
    return _SwiGLU.apply(gate, up) if _use("swiglu", gate) else swiglu_ref(gate, up)


def token_logprobs(logits, tokens):
    """fp32 log-probabilities of ``tokens [N]`` under softmax over ``logits [N, V]``."""
    return _TokenLogprobs.apply(logits, tokens) if _use("token_logprobs", logits) else token_logprobs_ref(logits, tokens)


def uses(name: str, x: torch.Tensor) -> bool:
    """Whether op ``name`` runs fused for tensors like ``x``."""
    return _use(name, x)


def _can_fuse(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda


def _use(name: str, x: torch.Tensor) -> bool:
    return _can_fuse(x) and enabled(x.device).get(name, False)


def decide(x: torch.Tensor) -> None:
    """Run the start-up check for ``x``'s device now, if it is still to run. A forward whose layers are
    checkpointed calls this first: the check's own forward and backward, run inside a checkpointed layer, would
    count as that layer's saved tensors in the forward and not in the recompute, which torch refuses."""
    if _can_fuse(x):
        enabled(x.device)


def enabled(device: torch.device) -> dict[str, bool]:
    """Which fused ops to use on ``device``, decided once. The check runs with autograd on, also
    when the first use is inside an engine's ``inference_mode``."""
    key = str(device)
    if key not in _VERDICT:
        with torch.inference_mode(False), torch.enable_grad():
            verdict = check(device)
        _VERDICT[key] = {name: why is None for name, why in verdict.items()}
        bad = {name: why for name, why in verdict.items() if why is not None and triton is not None}
        if bad:
            import warnings

            warnings.warn(f"masrl: torch ops instead of fused ones on {key} for {bad}", stacklevel=2)
    return _VERDICT[key]


def check(device: torch.device) -> dict[str, str | None]:
    """Each fused op, forward and backward, against torch in bf16 on random data."""
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(torch.bfloat16).requires_grad_(True)

    def compare(fused, ref, inputs, tol=2e-2, grad_tol=2e-2):
        out_f = fused(*inputs)
        grad = torch.randn(out_f.shape, generator=g, device=device).to(out_f.dtype)
        gf = torch.autograd.grad(out_f, [x for x in inputs if x.requires_grad], grad)
        out_r = ref(*inputs)
        gr = torch.autograd.grad(out_r, [x for x in inputs if x.requires_grad], grad)
        ok = torch.allclose(out_f.float(), out_r.float(), atol=tol, rtol=tol)
        return ok and all(torch.allclose(a.float(), b.float(), atol=grad_tol, rtol=grad_tol) for a, b in zip(gf, gr))

    def rope_case():
        ang = torch.randn(2, 5, 1, 32, generator=g, device=device)
        cos = torch.cat([ang, ang], -1).cos().to(torch.bfloat16)
        sin = torch.cat([ang, ang], -1).sin().to(torch.bfloat16)
        return compare(_Rope.apply, rope_ref, [rnd(2, 5, 3, 64), cos, sin])

    def swiglu_case():
        return compare(_SwiGLU.apply, swiglu_ref, [rnd(7, 3000), rnd(7, 3000)])

    def logprob_case():
        logits = rnd(6, 10000, scale=3.0)
        tokens = torch.randint(0, 10000, (6,), generator=g, device=device)
        return compare(lambda z: _TokenLogprobs.apply(z, tokens), lambda z: token_logprobs_ref(z, tokens), [logits],
                       tol=2e-3)

    out: dict[str, str | None] = {}
    for name, fn in (("rope", rope_case), ("swiglu", swiglu_case), ("token_logprobs", logprob_case)):
        if triton is None:
            out[name] = "triton is not installed"
            continue
        try:
            out[name] = None if fn() else "disagrees with torch"
        except Exception as exc:  # noqa: BLE001 - any failure means: use the torch version
            out[name] = f"{type(exc).__name__}: {exc}"
    return out

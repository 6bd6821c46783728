"""A lean forward pass for Llama-family HF models, shared by the engines and the trainer.

Why not ``model(..., past_key_values=DynamicCache())``: that path copies the growing cache every
step (``torch.cat`` per layer), repeats K/V heads for grouped-query attention, and computes the
output head as a skinny matmul. Here:

* an engine's KV cache is preallocated and written in place; attention reads a view of it;
* keys may come from a *shared prefix* computed once and expanded over the batch (``past``), which
  is how the engine and (on CPU) the trainer avoid recomputing the few-shot prompt that every call
  of an agent starts with. In training the prefix runs with gradients, once; autograd sums the
  gradient over the rows that share it, so the result is exact;
* the trainer can run right-padded rows with causal attention (flash kernels on CUDA), or rows
  *packed* end to end without padding (varlen flash attention, CUDA), optionally recomputing each
  layer's activations in backward (activation checkpointing).

It calls the model's own modules (projections, rotary frequencies, norm weights), so PEFT LoRA
layers work unchanged; a batch that mixes adapters passes ``adapter_names`` to each LoRA layer.
RMSNorm runs as ``F.rms_norm`` (one fused kernel on CUDA) with the module's weight and epsilon;
rotary embedding and SwiGLU run as the fused ops of ``modeling.fused`` on CUDA.
Every tensor it creates lives on the device of the model's weights. Outputs match the HF forward
to float rounding (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from masrl.modeling import fused

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

KV = list[tuple[torch.Tensor, torch.Tensor]]
_NOTICED: set[str] = set()


def core_model(model):
    return model.get_base_model() if hasattr(model, "peft_config") else model


def unsupported(model) -> str | None:
    """Why the lean forward cannot run ``model`` exactly (None: it can). Llama (Llama 3's scaled
    RoPE included), Mistral without a sliding window, Qwen2 (q/k/v biases) and Qwen3 (per-head
    q/k norms) without sliding-window layers."""
    core = core_model(model)
    cfg = core.config
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model type '{kind}' is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if not (hasattr(core, "model") and hasattr(core.model, "layers") and hasattr(core.model, "rotary_emb")):
        return "the model has no .model.layers / .model.rotary_emb"
    if kind == "mistral" and getattr(cfg, "sliding_window", None):
        return f"sliding-window attention (window {cfg.sliding_window})"
    if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        return "sliding-window attention layers"
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):
        return f"activation '{cfg.hidden_act}'"
    return None


def supports(model) -> bool:
    return unsupported(model) is None


def notice_fallback(model, what: str) -> None:
    """One line, once per reason: the plain HF forward runs instead of the lean one (slower, exact)."""
    import sys

    why = unsupported(model)
    if why and why not in _NOTICED:
        _NOTICED.add(why)
        print(f"[masrl] notice: {what} uses the plain HF forward: {why} is not covered by the fast path", file=sys.stderr)


def rms_norm(module, x: torch.Tensor) -> torch.Tensor:
    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", 1e-6)
    return F.rms_norm(x, (x.shape[-1],), module.weight, eps)


def lora_linear(mod, x: torch.Tensor) -> torch.Tensor:
    """A PEFT LoRA Linear's output with its active adapters, computed in ``x``'s dtype: the adapters' (fp32)
    weights are cast to it, where PEFT casts ``x`` to theirs. The same sum as PEFT's forward (bit for bit when
    ``x`` is fp32), but backward keeps no fp32 copy of each adapted projection's input: in a bf16 update of a
    7B shape with every projection adapted, a layer keeps 207 KB a token instead of 314
    (benchmarks/saved_activations.py). Anything but plain LoRA on an unmerged layer (DoRA and other variants,
    merged or disabled adapters) goes through PEFT's own forward."""
    if (mod.disable_adapters or mod.merged or getattr(mod, "lora_variant", None)
            or not isinstance(getattr(mod, "base_layer", None), torch.nn.Linear)):
        return mod(x)
    out = mod.base_layer(x)
    for name in mod.active_adapters:
        if name not in mod.lora_A:
            continue
        a, up = mod.lora_A[name].weight, mod.lora_B[name]
        low = F.linear(mod.lora_dropout[name](x), a.to(x.dtype))
        bias = None if up.bias is None else up.bias.to(x.dtype)
        out = out + F.linear(low, up.weight.to(x.dtype), bias) * mod.scaling[name]
    return out


def causal_mask(key_valid: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """``[B, 1, S, start+S]`` bool: query i (slot start+i) sees valid slots up to its own.

    Every query also sees its own slot, so padding queries never get an empty softmax (NaN).
    """
    end = start + length
    dev = key_valid.device
    causal = torch.ones(length, end, dtype=torch.bool, device=dev).tril(diagonal=start)
    own = torch.zeros(length, end, dtype=torch.bool, device=dev)
    own[torch.arange(length, device=dev), start + torch.arange(length, device=dev)] = True
    return ((causal[None] & key_valid[:, None, :end]) | own[None])[:, None]


def few_query_attention(q, keys, vals, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale, mask) v`` for ``q [B, H, S, D]`` over ``keys/vals [B, KV, K, D]`` (grouped
    query heads: query head h reads key head h // (H / KV)), ``mask [B, 1, S, K]`` bool; the scores and
    softmax in fp32, the matmuls in the inputs' dtype."""
    B, H, S, D = q.shape
    kv, K = keys.shape[1], keys.shape[2]
    g = H // kv
    scores = torch.matmul(q.reshape(B, kv, g * S, D), keys.transpose(-1, -2)).float() * scale
    scores = scores.view(B, kv, g, S, K).masked_fill(~mask.view(B, 1, 1, S, K), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(vals.dtype).view(B, kv, g * S, K)
    return torch.matmul(probs, vals).view(B, H, S, D)


def repeat_kv(keys: torch.Tensor, vals: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``keys, vals [B, KV, K, D]`` repeated to ``heads`` query heads (query head h reads key head h // (heads / KV))."""
    g = heads // keys.shape[1]
    return keys.repeat_interleave(g, dim=1), vals.repeat_interleave(g, dim=1)


def masked_attention(q, keys, vals, mask: torch.Tensor, scale: float, gqa: bool) -> torch.Tensor:
    """SDPA with an explicit mask. On CUDA grouped-query keys and values are repeated to every query head
    first: given a mask, SDPA's flash kernel is out (no masks) and its memory-efficient kernel does not take
    ``enable_gqa``, so the call fell to the math kernel, which holds ``[B, H, S, K]`` scores in fp32 (a
    chunked 16,000-token prefill on an H100: 1.53 s and a 19.9 GiB peak, against 0.26 s and 5.2 GiB
    repeated). HF's SDPA path repeats them too."""
    if gqa and q.device.type == "cuda":
        keys, vals = repeat_kv(keys, vals, q.shape[1])
        gqa = False
    return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, scale=scale, enable_gqa=gqa)


def past_causal_attention(q, keys, vals, scale: float) -> torch.Tensor:
    """One row's ``S`` new queries ``q [S, H, D]`` over its ``C`` past and its own keys ``[C + S, Hkv, D]``, causal:
    query i sees keys up to C + i. Flash attention's causal mask is aligned to the bottom right when there are more
    keys than queries, which is this (SDPA's ``is_causal`` is aligned top left, and takes a mask only on slower
    kernels); GQA native, no mask. CUDA, bf16 or fp16 (the paged engine's chunked prefill of a long prompt)."""
    S, K = q.shape[0], keys.shape[0]
    cu_q = torch.tensor([0, S], dtype=torch.int32, device=q.device)
    cu_k = torch.tensor([0, K], dtype=torch.int32, device=q.device)
    return torch.ops.aten._flash_attention_forward(q, keys, vals, cu_q, cu_k, S, K, 0.0, True, False, scale=scale)[0]


@dataclass
class Packed:
    """Rows laid end to end in one sequence: ``cu_seqlens [N+1]`` int32 offsets, longest row."""

    cu_seqlens: torch.Tensor
    max_len: int


def packed_attention(q, k, v, packed: Packed, scale: float) -> torch.Tensor:
    """Causal attention within each packed row: ``q [T, H, D]``, ``k, v [T, Hkv, D]`` (GQA native)."""
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, packed.cu_seqlens, packed.cu_seqlens, packed.max_len, packed.max_len, 0.0, True, False, scale=scale
    )[0]
    return out


class LlamaForward:
    # decode steps (a few query rows over a long cache) on a CPU in bf16 take ``few_query_attention``: PyTorch's SDPA
    # runs its math kernel there, 8 ms against 0.6 ms for two bf16 matmuls at 24 rows x 700 keys (fp32 SDPA: 1.0
    # ms); from ~128 query rows on (prefill, training) SDPA is as fast or faster. Up to this many query rows (0: SDPA
    # always; an instance may set its own)
    few_queries = 4

    def __init__(self, model):
        self.peft = hasattr(model, "peft_config")
        core = core_model(model)
        self.core = core
        cfg = core.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = self.head_dim**-0.5
        self.layers = list(core.model.layers)
        self.blocks: list | None = None  # sharded (worker.sharding): each layer called through its FSDP block
        self.silu = getattr(cfg, "hidden_act", "silu") in ("silu", "swish")
        self.qk_norm = hasattr(self.layers[0].self_attn, "q_norm")
        if self.peft:
            from peft.tuners.tuners_utils import BaseTunerLayer

            self._lora_types: tuple = (BaseTunerLayer,)
        else:
            self._lora_types = ()

    @property
    def device(self) -> torch.device:
        return self.core.model.embed_tokens.weight.device

    # -- engine cache --------------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype) -> KV:
        shape = (batch, self.n_kv, max_len, self.head_dim)
        # zeros, not empty: masked-out slots still meet the softmax weights (0 * NaN = NaN)
        dev = self.device
        return [(torch.zeros(shape, dtype=dtype, device=dev), torch.zeros(shape, dtype=dtype, device=dev))
                for _ in self.layers]

    @staticmethod
    def select(cache: KV, idx: torch.Tensor) -> KV:
        return [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in cache]

    # -- forward -------------------------------------------------------------------------------
    def _proj(self, mod, x, adapters):
        if isinstance(mod, self._lora_types):
            return mod(x, adapter_names=adapters) if adapters is not None else lora_linear(mod, x)
        return mod(x)

    def rope(self, positions: torch.Tensor, like: torch.Tensor):
        """``cos, sin [B, S, 1, D]`` for ``positions [B, S]`` in ``like``'s dtype."""
        cos, sin = self.core.model.rotary_emb(like, positions)
        return cos.unsqueeze(2), sin.unsqueeze(2)

    def hidden(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        cache: KV | None = None,
        start: int = 0,
        past: KV | None = None,
        adapters: list[str] | None = None,
        return_kv: bool = False,
        last_only: bool = False,
        packed: Packed | None = None,
        checkpoint: bool = False,
    ):
        """Final-norm hidden states of ``ids [B, S]``.

        Keys/values come from: ``cache`` (written in place at slots ``[start, start+S)``, attention
        over ``[0, start+S)``), or ``past`` (prepended, e.g. a shared prefix), or only this chunk.
        ``mask`` is ``[B, 1, S, K]`` bool over those K keys; ``None`` means causal over this chunk
        (right-padded rows). ``packed``: ``ids`` is ``[1, T]``, rows laid end to end.
        ``return_kv``: also return this chunk's keys/values per layer. ``checkpoint``: recompute
        each layer in backward.
        """
        h = self.core.model.embed_tokens(ids)
        cos, sin = self.rope(positions, h)
        if checkpoint:
            fused.decide(h)
        new_kv: KV = []
        for li, layer in enumerate(self.layers):
            kv_in = cache[li] if cache is not None else (past[li] if past is not None else None)
            step, args = ((self.blocks[li], ()) if self.blocks is not None else (self._layer, (layer,)))
            args += (h, cos, sin, mask, kv_in, cache is not None, start, adapters, packed)
            if checkpoint and torch.is_grad_enabled():
                from torch.utils.checkpoint import checkpoint as ckpt

                h, kv = ckpt(step, *args, use_reentrant=False)
            else:
                h, kv = step(*args)
            if return_kv:
                new_kv.append(kv)
        if last_only:
            h = h[:, -1:]
        h = rms_norm(self.core.model.norm, h)
        return (h, new_kv) if return_kv else h

    def _layer(self, layer, h, cos, sin, mask, kv_in, in_cache: bool, start: int, adapters, packed):
        B, S, _ = h.shape
        attn = layer.self_attn
        x = rms_norm(layer.input_layernorm, h)
        q = self._proj(attn.q_proj, x, adapters).view(B, S, self.n_heads, self.head_dim)
        k = self._proj(attn.k_proj, x, adapters).view(B, S, self.n_kv, self.head_dim)
        if self.qk_norm:  # Qwen3: RMSNorm over each head before the rotation
            q, k = rms_norm(attn.q_norm, q), rms_norm(attn.k_norm, k)
        v = self._proj(attn.v_proj, x, adapters).view(B, S, self.n_kv, self.head_dim)
        q = fused.rope(q, cos, sin)  # [B, S, heads, D]
        k = fused.rope(k, cos, sin)
        gqa = self.n_kv != self.n_heads
        if packed is not None:
            o = packed_attention(q[0], k[0], v[0], packed, self.scale).unsqueeze(0)  # [1, T, H, D]
        elif (mask is None and kv_in is not None and not in_cache and B == 1 and q.is_cuda
              and q.dtype in (torch.bfloat16, torch.float16)):  # one row's chunk after its past: no mask, flash
            pk, pv = kv_in  # [1, Hkv, C, D]
            keys, vals = torch.cat([pk[0].transpose(0, 1), k[0]]), torch.cat([pv[0].transpose(0, 1), v[0]])
            o = past_causal_attention(q[0], keys, vals, self.scale).unsqueeze(0)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        else:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if in_cache:
                kc, vc = kv_in
                kc[:, :, start : start + S] = k
                vc[:, :, start : start + S] = v
                keys, vals = kc[:, :, : start + S], vc[:, :, : start + S]
            elif kv_in is not None:
                pk, pv = kv_in
                keys, vals = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
            else:
                keys, vals = k, v
            if (mask is not None and mask.dtype == torch.bool and S <= self.few_queries and q.device.type == "cpu"
                    and q.dtype == torch.bfloat16):
                o = few_query_attention(q, keys, vals, mask, self.scale)
            elif mask is None:
                o = F.scaled_dot_product_attention(q, keys, vals, is_causal=True, scale=self.scale, enable_gqa=gqa)
            else:
                o = masked_attention(q, keys, vals, mask, self.scale, gqa)
            o = o.transpose(1, 2)
        h = h + self._proj(attn.o_proj, o.reshape(B, S, -1), adapters)
        x = rms_norm(layer.post_attention_layernorm, h)
        mlp = layer.mlp
        gate, up = self._proj(mlp.gate_proj, x, adapters), self._proj(mlp.up_proj, x, adapters)
        gated = fused.swiglu(gate, up) if self.silu else mlp.act_fn(gate) * up
        h = h + self._proj(mlp.down_proj, gated, adapters)
        return h, (k, v)

    def head_last(self, h_last: torch.Tensor) -> torch.Tensor:
        """Output logits for ``[B, H]`` hidden states, as ``W @ h.T`` (fast for few rows on a CPU)."""
        head = self.core.lm_head
        logits = torch.mm(head.weight, h_last.t()).t()
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias
        return logits

    def forward(self, ids, positions, cache, start, key_valid, adapters=None) -> torch.Tensor:
        """Engine step: write ``ids`` at ``start`` into ``cache``; return last-position logits."""
        S = ids.shape[1]
        mask = key_valid[:, None, None, : start + 1] if S == 1 else causal_mask(key_valid, start, S)
        h = self.hidden(ids, positions, mask, cache=cache, start=start, adapters=adapters, last_only=True)
        return self.head_last(h[:, -1])

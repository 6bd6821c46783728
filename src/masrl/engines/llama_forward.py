"""A lean forward pass for Llama-family HF models, shared by the engine and the trainer.

Why not ``model(..., past_key_values=DynamicCache())``: on a CPU that path spends a third of
each decode step copying the growing cache (``torch.cat`` per layer per step), repeats K/V heads
for grouped-query attention, and computes the output head as a skinny matmul. Here:

* the engine's KV cache is preallocated and written in place; attention reads a view of it with
  ``enable_gqa``; the head is computed as ``W @ h.T`` (about twice as fast for a few rows);
* keys may come from a *shared prefix* computed once and expanded over the batch (``past``),
  which is how both the engine and the trainer avoid recomputing the few-shot prompt that every
  call of an agent starts with. In training the prefix runs with gradients, once; autograd sums
  the gradient over the rows that share it, so the result is exact.

It calls the model's own modules (norms, projections, rotary embedding), so PEFT LoRA layers
work unchanged; a batch that mixes adapters passes ``adapter_names`` to each LoRA layer, which
runs the base matmul once and the low-rank delta per adapter sub-batch. Outputs match the HF
forward to float rounding (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

KV = list[tuple[torch.Tensor, torch.Tensor]]


def supports(model) -> bool:
    core = model.get_base_model() if hasattr(model, "peft_config") else model
    cfg = core.config
    if getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if cfg.model_type != "llama" and getattr(cfg, "use_sliding_window", False):
        return False
    return hasattr(core, "model") and hasattr(core.model, "layers") and hasattr(core.model, "rotary_emb")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def causal_mask(key_valid: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """``[B, 1, S, start+S]`` bool: query i (slot start+i) sees valid slots up to its own.

    Every query also sees its own slot, so padding queries never get an empty softmax (NaN).
    """
    end = start + length
    causal = torch.ones(length, end, dtype=torch.bool).tril(diagonal=start)
    own = torch.zeros(length, end, dtype=torch.bool)
    own[torch.arange(length), start + torch.arange(length)] = True
    return ((causal[None] & key_valid[:, None, :end]) | own[None])[:, None]


class LlamaForward:
    def __init__(self, model):
        self.peft = hasattr(model, "peft_config")
        core = model.get_base_model() if self.peft else model
        self.core = core
        cfg = core.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = self.head_dim**-0.5
        self.layers = list(core.model.layers)
        if self.peft:
            from peft.tuners.tuners_utils import BaseTunerLayer

            self._lora_types: tuple = (BaseTunerLayer,)
        else:
            self._lora_types = ()

    # -- engine cache --------------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype) -> KV:
        shape = (batch, self.n_kv, max_len, self.head_dim)
        # zeros, not empty: masked-out slots still meet the softmax weights (0 * NaN = NaN)
        return [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in self.layers]

    @staticmethod
    def select(cache: KV, idx: torch.Tensor) -> KV:
        return [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in cache]

    # -- forward -------------------------------------------------------------------------------
    def _proj(self, mod, x, adapters):
        if adapters is not None and isinstance(mod, self._lora_types):
            return mod(x, adapter_names=adapters)
        return mod(x)

    def hidden(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        *,
        cache: KV | None = None,
        start: int = 0,
        past: KV | None = None,
        adapters: list[str] | None = None,
        return_kv: bool = False,
        last_only: bool = False,
    ):
        """Final-norm hidden states of ``ids [B, S]``.

        Keys/values come from: ``cache`` (written in place at slots ``[start, start+S)``, attention
        over ``[0, start+S)``), or ``past`` (prepended, e.g. a shared prefix), or only this chunk.
        ``mask`` is ``[B, 1, S, K]`` bool over those K keys. ``return_kv``: also return this
        chunk's keys/values per layer.
        """
        B, S = ids.shape
        h = self.core.model.embed_tokens(ids)
        cos, sin = self.core.model.rotary_emb(h, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        new_kv: KV = []
        gqa = self.n_kv != self.n_heads
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = self._proj(attn.q_proj, x, adapters).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
            k = self._proj(attn.k_proj, x, adapters).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)
            v = self._proj(attn.v_proj, x, adapters).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if return_kv:
                new_kv.append((k, v))
            if cache is not None:
                kc, vc = cache[li]
                kc[:, :, start : start + S] = k
                vc[:, :, start : start + S] = v
                keys, vals = kc[:, :, : start + S], vc[:, :, : start + S]
            elif past is not None:
                pk, pv = past[li]
                keys, vals = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
            else:
                keys, vals = k, v
            o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, scale=self.scale, enable_gqa=gqa)
            h = h + self._proj(attn.o_proj, o.transpose(1, 2).reshape(B, S, -1), adapters)
            x = layer.post_attention_layernorm(h)
            mlp = layer.mlp
            gated = mlp.act_fn(self._proj(mlp.gate_proj, x, adapters)) * self._proj(mlp.up_proj, x, adapters)
            h = h + self._proj(mlp.down_proj, gated, adapters)
        if last_only:
            h = h[:, -1:]
        h = self.core.model.norm(h)
        return (h, new_kv) if return_kv else h

    def head_last(self, h_last: torch.Tensor) -> torch.Tensor:
        """Output logits for ``[B, H]`` hidden states, as ``W @ h.T`` (fast for few rows)."""
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

"""A lean forward pass with a preallocated KV cache, for Llama-family HF models.

Why not ``model(..., past_key_values=DynamicCache())``: on a CPU that path spends a third of
each decode step copying the growing cache (``torch.cat`` per layer per step), repeats K/V heads
for grouped-query attention, and computes the output head as a skinny matmul. Here the cache is
written in place, attention reads a view of the filled part with ``enable_gqa``, and the head is
computed as ``W @ h.T``, which MKL runs about twice as fast for a few dozen rows.

It calls the model's own modules (norms, projections, rotary embedding), so LoRA layers from
PEFT work unchanged; a batch that mixes adapters passes ``adapter_names`` to each LoRA layer,
which runs the base matmul once and the low-rank delta per adapter sub-batch. Logits match the
HF forward to float rounding (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def supports(model) -> bool:
    core = model.get_base_model() if hasattr(model, "peft_config") else model
    cfg = core.config
    if getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True) and cfg.model_type != "llama":
        return False
    return hasattr(core, "model") and hasattr(core.model, "layers") and hasattr(core.model, "rotary_emb")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaDecoder:
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

            self._lora_types = (BaseTunerLayer,)
        else:
            self._lora_types = ()

    # -- cache ---------------------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype) -> list[list[torch.Tensor]]:
        shape = (batch, self.n_kv, max_len, self.head_dim)
        return [[torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)] for _ in self.layers]

    @staticmethod
    def select(cache: list[list[torch.Tensor]], idx: torch.Tensor) -> list[list[torch.Tensor]]:
        return [[k.index_select(0, idx), v.index_select(0, idx)] for k, v in cache]

    # -- forward -------------------------------------------------------------------------------
    def _proj(self, mod, x, adapters):
        if adapters is not None and isinstance(mod, self._lora_types):
            return mod(x, adapter_names=adapters)
        return mod(x)

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: list[list[torch.Tensor]],
        start: int,
        key_valid: torch.Tensor,
        adapters: list[str] | None = None,
    ) -> torch.Tensor:
        """Run ``ids [B, S]`` written to cache slots ``[start, start + S)``; return last-position logits.

        ``key_valid [B, start + S]`` marks real (non-padding) slots.
        """
        B, S = ids.shape
        end = start + S
        h = self.core.model.embed_tokens(ids)
        cos, sin = self.core.model.rotary_emb(h, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        if S == 1:
            mask = key_valid[:, None, None, :end]
        else:
            causal = torch.ones(S, end, dtype=torch.bool).tril(diagonal=start)
            # every query also sees its own slot, so padding rows never have an empty (NaN) softmax
            own = torch.zeros(S, end, dtype=torch.bool)
            own[torch.arange(S), start + torch.arange(S)] = True
            mask = ((causal[None] & key_valid[:, None, :end]) | own[None])[:, None]
        for layer, (kc, vc) in zip(self.layers, cache):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = self._proj(attn.q_proj, x, adapters).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
            k = self._proj(attn.k_proj, x, adapters).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)
            v = self._proj(attn.v_proj, x, adapters).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kc[:, :, start:end] = k
            vc[:, :, start:end] = v
            o = F.scaled_dot_product_attention(
                q, kc[:, :, :end], vc[:, :, :end], attn_mask=mask, scale=self.scale, enable_gqa=self.n_kv != self.n_heads
            )
            h = h + self._proj(attn.o_proj, o.transpose(1, 2).reshape(B, S, -1), adapters)
            x = layer.post_attention_layernorm(h)
            mlp = layer.mlp
            gated = mlp.act_fn(self._proj(mlp.gate_proj, x, adapters)) * self._proj(mlp.up_proj, x, adapters)
            h = h + self._proj(mlp.down_proj, gated, adapters)
        last = self.core.model.norm(h[:, -1])
        head = self.core.lm_head
        logits = torch.mm(head.weight, last.t()).t()
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias
        return logits

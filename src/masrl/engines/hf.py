"""HFEngine: batched sampling from a Hugging Face causal LM.

One ``generate`` call runs one batch: a left-padded prefill, then one decode step per token.
Every row carries its own sampling parameters and, on a PEFT model, its own LoRA adapter.
Rows that finish (EOS, a stop string, their own token limit) are dropped from the KV cache once
half the batch has finished, so a few long answers do not keep paying for the whole batch.

Llama-family models run through ``LlamaDecoder`` (in-place KV cache; see its docstring); any
other architecture runs the model's own forward with a ``DynamicCache``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from masrl.engines import llama_decode
from masrl.engines.sampling import sample_tokens


@dataclass
class GenRequest:
    prompt_ids: list[int]
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    adapter: str | None = None  # LoRA adapter name on a shared base; None: the plain model
    ignore_eos: bool = False  # generate exactly max_new_tokens (benchmarks)


@dataclass
class GenOutput:
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length"
    meta: dict = field(default_factory=dict)


class _HFForward:
    """Fallback stepper over the model's own forward and a DynamicCache."""

    def __init__(self, model):
        self.model = model
        core = model.get_base_model() if hasattr(model, "peft_config") else model
        params = inspect.signature(type(core).forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def new_cache(self, batch, max_len, dtype):
        from transformers import DynamicCache

        return DynamicCache()

    @staticmethod
    def select(cache, idx):
        cache.reorder_cache(idx)
        return cache

    def forward(self, ids, positions, cache, start, key_valid, adapters=None):
        kwargs = {self.cache_kw: cache, "use_cache": True, "logits_to_keep": 1}
        if adapters is not None:
            kwargs["adapter_names"] = adapters
        out = self.model(input_ids=ids, attention_mask=key_valid[:, : start + ids.shape[1]].long(),
                         position_ids=positions, **kwargs)
        return out.logits[:, -1, :]


class HFEngine:
    def __init__(self, model, tokenizer, stop_ids: list[int], *, seed: int = 0, compact_ratio: float = 0.5,
                 fast_path: bool = True):
        self.model = model
        self.tok = tokenizer
        self.stop_set = set(int(s) for s in stop_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.stop_set))
        self.generator = torch.Generator().manual_seed(seed)
        self.compact_ratio = compact_ratio
        self.is_peft = hasattr(model, "peft_config")
        use_fast = fast_path and llama_decode.supports(model)
        self.stepper = llama_decode.LlamaDecoder(model) if use_fast else _HFForward(model)
        self.dtype = next(model.parameters()).dtype

    @torch.inference_mode()
    def generate(self, requests: list[GenRequest]) -> list[GenOutput]:
        if not requests:
            return []
        B = len(requests)
        plen = max(len(r.prompt_ids) for r in requests)
        max_new = max(r.max_new_tokens for r in requests)
        ids = torch.full((B, plen), self.pad_id, dtype=torch.long)
        key_valid = torch.zeros((B, plen + max_new), dtype=torch.bool)
        for i, r in enumerate(requests):
            n = len(r.prompt_ids)
            ids[i, plen - n :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            key_valid[i, plen - n :] = True
        positions = (key_valid[:, :plen].long().cumsum(-1) - 1).clamp(min=0)
        temps = torch.tensor([r.temperature for r in requests], dtype=torch.float32)
        top_ps = torch.tensor([r.top_p for r in requests], dtype=torch.float32)
        adapters = [r.adapter or "__base__" for r in requests] if self.is_peft else None

        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        finish = ["length"] * B
        # batch position -> request index, or None once that row finished (it rides along, ignored,
        # until the next compaction drops it from the cache)
        rows: list[int | None] = list(range(B))
        cache = self.stepper.new_cache(B, plen + max_new, self.dtype)
        logits = self.stepper.forward(ids, positions, cache, 0, key_valid, adapters)
        next_pos = positions[:, -1:] + 1
        cur = plen
        while True:
            tokens, lps = sample_tokens(logits, temps, top_ps, self.generator)
            for b, (t, lp) in enumerate(zip(tokens.tolist(), lps.tolist())):
                i = rows[b]
                if i is None:
                    continue
                out_ids[i].append(t)
                out_lp[i].append(lp)
                req = requests[i]
                if (not req.ignore_eos and t in self.stop_set) or (req.stop and self._hit_stop(out_ids[i], req.stop)):
                    finish[i], rows[b] = "stop", None
                elif len(out_ids[i]) >= req.max_new_tokens:
                    rows[b] = None
            active = [b for b, i in enumerate(rows) if i is not None]
            if not active:
                break
            if len(active) <= self.compact_ratio * len(rows):
                idx = torch.tensor(active, dtype=torch.long)
                cache = self.stepper.select(cache, idx)
                key_valid, tokens, next_pos = key_valid[idx], tokens[idx], next_pos[idx]
                temps, top_ps = temps[idx], top_ps[idx]
                rows = [rows[b] for b in active]
                if adapters is not None:
                    adapters = [adapters[b] for b in active]
            key_valid[:, cur] = True
            logits = self.stepper.forward(tokens.unsqueeze(-1), next_pos, cache, cur, key_valid, adapters)
            next_pos = next_pos + 1
            cur += 1
        return [
            GenOutput(
                completion_ids=out_ids[i],
                logprobs=out_lp[i],
                text=self.tok.decode(out_ids[i], skip_special_tokens=True),
                finish_reason=finish[i],
            )
            for i in range(B)
        ]

    def _hit_stop(self, ids: list[int], stop: tuple[str, ...]) -> bool:
        tail = self.tok.decode(ids[-16:], skip_special_tokens=True)
        return any(s in tail for s in stop)

"""HFEngine: batched sampling from a Hugging Face causal LM.

One ``generate`` call runs one batch: a left-padded prefill, then one decode step per token.
Every row carries its own sampling parameters and, on a PEFT model, its own LoRA adapter.
Rows that finish (EOS, a stop string, their own token limit) are dropped from the KV cache once
half the batch has finished, so a few long answers do not keep paying for the whole batch.

Llama-family models run through the lean forward (``modeling.lean.LlamaForward``: an in-place KV
cache); any other architecture runs the model's own forward with a ``DynamicCache``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from masrl.engines.defaults import EngineDefaults
from masrl.engines.sampling import BatchFlags, counter_uniforms, sample_tokens
from masrl.messages import GenOutput, GenRequest
from masrl.modeling import lean as llama_forward
from masrl.modeling.prefix import slot_layout

PREFILL_CELLS = 8_000_000  # rows x new tokens x keys of one prefill slice (its attention scores, per head)


class _HFForward:
    """Fallback stepper over the model's own forward and a DynamicCache."""

    def __init__(self, model):
        self.model = model
        core = model.get_base_model() if hasattr(model, "peft_config") else model
        params = inspect.signature(type(core).forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def device(self):
        return next(self.model.parameters()).device

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


class HFEngine(EngineDefaults):
    def __init__(self, model, tokenizer, stop_ids: list[int], *, seed: int = 0, compact_ratio: float = 0.5,
                 fast_path: bool = True, min_prefix: int = 16):
        self.model = model
        self.tok = tokenizer
        self.stop_set = set(int(s) for s in stop_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.stop_set))
        self.compact_ratio = compact_ratio
        self.is_peft = hasattr(model, "peft_config")
        use_fast = fast_path and llama_forward.supports(model)
        if fast_path and not use_fast:
            llama_forward.notice_fallback(model, "rollout")
        self.stepper = llama_forward.LlamaForward(model) if use_fast else _HFForward(model)
        self.share_prefix = use_fast
        self.min_prefix = min_prefix
        first = next(model.parameters())
        self.dtype, self.dev = first.dtype, first.device
        self.device = str(self.dev)
        self.generator = torch.Generator(device=self.dev).manual_seed(seed)

    def weights_updated(self, policies=None) -> None:  # reads the live parameters
        return None

    def adapters(self) -> list[str]:
        return list(self.model.peft_config) if self.is_peft else []

    def memory(self) -> dict[str, int]:
        return {}  # its KV cache lives only during a generate

    def release(self) -> None:  # its caches live for one generate call
        return None

    @torch.inference_mode()
    def _generate(self, requests: list[GenRequest]) -> list[GenOutput]:
        if not requests:
            return []
        B = len(requests)
        st = self._prefill(requests)
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        finish = ["length"] * B
        n_sampled = 0
        while True:
            tokens, lps = sample_tokens(st.logits, st.temps, st.top_ps, self.generator, st.flags,
                                        None if st.U is None else st.U[:, n_sampled])
            n_sampled += 1
            self._take(requests, st.rows, tokens.tolist(), lps.tolist(), out_ids, out_lp, finish)
            active = [b for b, i in enumerate(st.rows) if i is not None]
            if not active:
                break
            if len(active) <= self.compact_ratio * len(st.rows):
                tokens = st.compact(self.stepper, active, tokens)
            st.key_valid[:, st.cur] = True
            st.logits = self.stepper.forward(tokens.unsqueeze(-1), st.next_pos, st.cache, st.cur, st.key_valid,
                                             st.adapters)
            st.next_pos = st.next_pos + 1
            st.cur += 1
        return [GenOutput(completion_ids=out_ids[i], logprobs=out_lp[i],
                          text=self.tok.decode(out_ids[i], skip_special_tokens=True), finish_reason=finish[i])
                for i in range(B)]

    def _prefill(self, requests: list[GenRequest]) -> "_Decoding":
        """The KV cache over every prompt and the first logits. Slot layout per row: [shared prefix |
        gap | left-padded rest of prompt | generated]; invalid slots are masked out, and positions
        follow each row's own tokens, not slots."""
        B, dev = len(requests), self.dev
        prompts = [list(r.prompt_ids) for r in requests]
        adapters = [r.adapter or "__base__" for r in requests] if self.is_peft else None
        max_new = max(r.max_new_tokens for r in requests)
        groups, pre, pmax, smax = slot_layout(prompts, keys=adapters, min_prefix=self.min_prefix, share=self.share_prefix)
        total = pmax + smax + max_new
        cache = self.stepper.new_cache(B, total, self.dtype)
        key_valid = torch.zeros((B, total), dtype=torch.bool, device=dev)
        for rows, plen in groups:
            if plen > 0:
                self._fill_prefix(cache, key_valid, rows, prompts[rows[0]][:plen], adapters[rows[0]] if adapters else None)
        ids = torch.full((B, smax), self.pad_id, dtype=torch.long)
        positions = torch.zeros((B, smax), dtype=torch.long)
        valid = torch.zeros((B, total), dtype=torch.bool)
        for i, p in enumerate(prompts):
            n = len(p) - pre[i]
            ids[i, smax - n :] = torch.tensor(p[pre[i] :], dtype=torch.long)
            positions[i, smax - n :] = torch.arange(pre[i], len(p))
            valid[i, pmax + smax - n : pmax + smax] = True
        ids, positions = ids.to(dev), positions.to(dev)
        key_valid |= valid.to(dev)
        temps = [r.sampling.temperature for r in requests]
        top_ps = [r.sampling.top_p for r in requests]
        logits = self._prefill_rows(ids, positions, cache, pmax, key_valid, adapters)
        return _Decoding(
            cache=cache, key_valid=key_valid, logits=logits, cur=pmax + smax, adapters=adapters,
            next_pos=torch.tensor([[len(p)] for p in prompts], dtype=torch.long, device=dev),
            temps=torch.tensor(temps, dtype=torch.float32, device=dev),
            top_ps=torch.tensor(top_ps, dtype=torch.float32, device=dev),
            flags=BatchFlags.of(temps, top_ps),
            U=_uniforms(requests, max_new, dev),  # [B, max_new] per-call random numbers, or None
            rows=list(range(B)))

    def _prefill_rows(self, ids, positions, cache, start: int, key_valid, adapters):
        """The prefill's forward, in slices of rows whose attention scores (rows x new tokens x keys) stay
        under ``PREFILL_CELLS``: a batch of 32 long conversations otherwise built every layer's scores at once
        (a 135M model's evaluation peaked 2-3 GB above its training steps on a CPU). Each row's numbers are its
        own either way; the lean forward writes a slice's keys and values into its rows of the cache."""
        B, S = ids.shape
        per = max(1, PREFILL_CELLS // max(1, S * (start + S)))
        if per >= B or not isinstance(self.stepper, llama_forward.LlamaForward):
            return self.stepper.forward(ids, positions, cache, start, key_valid, adapters)
        out = []
        for r0 in range(0, B, per):
            rows = slice(r0, min(B, r0 + per))
            out.append(self.stepper.forward(ids[rows], positions[rows], [(k[rows], v[rows]) for k, v in cache], start,
                                            key_valid[rows], adapters[rows] if adapters is not None else None))
        return torch.cat(out)

    def _take(self, requests, rows, tokens, lps, out_ids, out_lp, finish) -> None:
        """Append each live row's sampled token; a row that hit EOS, a stop string or its own limit
        is marked finished (``rows[b] = None``): it rides along, ignored, until the next compaction."""
        for b, (t, lp) in enumerate(zip(tokens, lps)):
            i = rows[b]
            if i is None:
                continue
            out_ids[i].append(t)
            out_lp[i].append(lp)
            req = requests[i].sampling
            if (not req.ignore_eos and t in self.stop_set) or (req.stop and self._hit_stop(out_ids[i], req.stop)):
                finish[i], rows[b] = "stop", None
            elif len(out_ids[i]) >= req.max_new_tokens:
                rows[b] = None

    def _fill_prefix(self, cache, key_valid, rows: list[int], prefix: list[int], adapter: str | None) -> None:
        """Run a shared prefix once (batch of 1) and copy its keys/values into every row of the group."""
        from masrl.modeling.lean import causal_mask

        n = len(prefix)
        dev = self.dev
        ids = torch.tensor([prefix], dtype=torch.long, device=dev)
        mask = causal_mask(torch.ones((1, n), dtype=torch.bool, device=dev), 0, n)
        _, kv = self.stepper.hidden(ids, torch.arange(n, device=dev).unsqueeze(0), mask,
                                    adapters=[adapter] if adapter else None, return_kv=True, last_only=True)
        idx = torch.tensor(rows, dtype=torch.long, device=dev)
        for (kc, vc), (k, v) in zip(cache, kv):
            kc[idx, :, :n] = k
            vc[idx, :, :n] = v
        key_valid[idx, :n] = True

    def _hit_stop(self, ids: list[int], stop: tuple[str, ...]) -> bool:
        tail = self.tok.decode(ids[-16:], skip_special_tokens=True)
        return any(s in tail for s in stop)


@dataclass
class _Decoding:
    """The state of one batch between decode steps. ``rows``: batch position -> request index, or
    None once that row finished."""

    cache: object
    key_valid: torch.Tensor
    logits: torch.Tensor
    cur: int
    adapters: list[str] | None
    next_pos: torch.Tensor
    temps: torch.Tensor
    top_ps: torch.Tensor
    flags: BatchFlags
    U: torch.Tensor | None
    rows: list[int | None]

    def compact(self, stepper, active: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """Keep only the ``active`` batch positions (the cache too); returns their tokens."""
        idx = torch.tensor(active, dtype=torch.long, device=self.key_valid.device)
        self.cache = stepper.select(self.cache, idx)
        self.key_valid, self.next_pos = self.key_valid[idx], self.next_pos[idx]
        self.temps, self.top_ps = self.temps[idx], self.top_ps[idx]
        if self.U is not None:
            self.U = self.U[idx]
        self.rows = [self.rows[b] for b in active]
        if self.adapters is not None:
            self.adapters = [self.adapters[b] for b in active]
        return tokens[idx]


def _uniforms(requests: list[GenRequest], n: int, device) -> torch.Tensor | None:
    """Each row's random numbers for its first ``n`` tokens, when every request carries a seed."""
    if not requests or any(r.seed is None for r in requests):
        return None
    return torch.from_numpy(counter_uniforms([r.seed for r in requests], n)).to(device=device, dtype=torch.float32)

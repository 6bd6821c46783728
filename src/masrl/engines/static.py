"""StaticEngine: a preallocated KV cache, decode steps replayed as CUDA graphs, few host round trips.

What makes a decode step cheap on a GPU is not arithmetic (a 0.5B model at batch 1 moves ~1 GB per
step, a fifth of a millisecond on an H200) but the hundreds of kernel launches and host syncs
around it. So:

* **Static buffers.** One KV cache ``[rows, kv_heads, slots, head_dim]`` per layer, plus token,
  position, slot and attention-bias buffers, allocated once at the largest batch and length seen
  (rounded up to buckets) and reused; a compaction moves live rows to the front in place.
* **CUDA graphs.** The decode step for a (batch bucket, key-length bucket) is captured once and
  replayed: one launch instead of ~20 per layer. The graph reads the buffers above, so the host
  only writes inputs between replays. Prefill (variable shapes) runs eagerly through the shared
  lean forward. On a CPU the same step runs eagerly (and is what the CPU tests check).
* **Fused projections.** q/k/v and gate/up run as one matmul each over fused copies of the weights
  (``weights_updated`` refreshes them in place after an update, so captured graphs stay valid).
* **LoRA in the graph.** Every adapter's A (and scaled B) matrices are concatenated along the rank
  dimension; a row's own columns are selected by a 0/1 mask, so a batch that mixes adapters runs
  two small matmuls per projection group and no per-adapter indexing (which a graph cannot replay).
* **Few syncs.** Sampling stays on the device; the host reads the sampled tokens every
  ``sync_every`` steps (for EOS, stop strings, lengths), one chunk behind the device, so the GPU
  never waits for the host's checks. A row that finished inside a chunk rides along until then;
  its extra tokens are dropped, never returned.

The step itself (fused weights, LoRA columns, kernels, graph capture) is ``engines/decoder.py``'s
``GraphDecoder``, shared with the paged engine; this engine adds its cache, its buffers and its loop.

Numerics: decode computes exactly what the lean forward computes, up to the kernels' rounding;
prefill *is* the lean forward. The logprob of each sampled token is that of softmax(logits / T).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from masrl.engines import kernels
from masrl.engines.decode_weights import DecodeWeights, batch_bucket, slot_bucket
from masrl.engines.decoder import GraphDecoder
from masrl.engines.hf import _uniforms
from masrl.engines.sampling import BatchFlags, stop_string_at
from masrl.messages import GenOutput, GenRequest
from masrl.modeling.lean import causal_mask
from masrl.modeling.prefix import slot_layout
from masrl.modeling.sizes import tensor_bytes


class StaticEngine(GraphDecoder):
    def __init__(self, model, tokenizer, stop_ids: list[int], *, device: str, seed: int = 0, cuda_graphs: bool = True,
                 sync_every: int = 8, max_batch_size: int = 256, min_prefix: int = 16, compact_ratio: float = 0.5,
                 prefill_tokens: int = 16384, fused_kernels: bool = True):
        super().__init__(model, tokenizer, stop_ids, device=device, seed=seed, cuda_graphs=cuda_graphs,
                         fused_kernels=fused_kernels)
        self.sync_every = sync_every
        self.max_batch_size = max_batch_size
        self.min_prefix = min_prefix
        self.compact_ratio = compact_ratio
        self.prefill_tokens = prefill_tokens
        self.rows_cap = 0
        self.slots_cap = 0
        self.stats["syncs"] = 0

    # -- Engine interface (adapters, weights_updated: GraphDecoder) --------------------------------
    def memory(self) -> dict[str, int]:
        kv = tensor_bytes([t for pair in self.__dict__.get("cache", []) for t in pair])
        buffers = tensor_bytes([self.__dict__.get(n) for n in ("bias", "tok_buf", "pos_buf", "row_adapter")]
                               + list(self.__dict__.get("masks", {}).values()))
        return {"kv": kv, "weights": self._weight_bytes(), "buffers": buffers}

    def release(self) -> None:
        self._release(("cache", "bias", "tok_buf", "pos_buf", "slot_t", "row_adapter", "masks", "col_index"))
        self.rows_cap = self.slots_cap = 0

    def generate(self, requests: list[GenRequest]) -> list[GenOutput]:
        if not requests:
            return []
        if self.w is None:
            self.w = DecodeWeights(self.model, self._adapters)
        out: list[GenOutput] = []
        with self._kernels(), torch.inference_mode():
            for i in range(0, len(requests), self.max_batch_size):
                out += self._generate(requests[i : i + self.max_batch_size])
        return out

    # -- buffers ---------------------------------------------------------------------------------
    def _ensure(self, rows: int, slots: int) -> None:
        if rows <= self.rows_cap and slots <= self.slots_cap:
            return
        self.rows_cap = max(rows, self.rows_cap)
        self.slots_cap = max(slot_bucket(slots, 256), self.slots_cap)
        R, S, dev = self.rows_cap, self.slots_cap, self.dev
        self.graphs.clear()  # they point at the old buffers
        self.graph_pool = None  # a pool whose graphs are all gone is freed: never capture into it again
        self.cache = self.fwd.new_cache(R, S, self.dtype)
        self.bias = torch.full((R, S), float("-inf"), dtype=self.dtype, device=dev)
        self.tok_buf = torch.zeros(R, dtype=torch.long, device=dev)
        self.pos_buf = torch.zeros(R, dtype=torch.long, device=dev)
        self.slot_t = torch.zeros(1, dtype=torch.long, device=dev)
        self.row_adapter = torch.full((R,), -1, dtype=torch.long, device=dev)
        self.masks = {cols: torch.zeros((R, len(cols)), dtype=self.dtype, device=dev) for cols in self.w.layouts}
        self.col_index = {cols: torch.tensor(cols, dtype=torch.long, device=dev) for cols in self.w.layouts}

    def _refresh_masks(self, n: int) -> None:
        for cols, m in self.masks.items():
            m[:n].copy_((self.row_adapter[:n, None] == self.col_index[cols][None, :]).to(self.dtype))

    # -- one decode step over the static buffers (what a CUDA graph captures) ----------------------
    def _attention(self, li, qkv, cos, sin, B, S):
        f, fwd = self.fused, self.fwd
        rope = kernels.rope_and_cache if f.get("rope_and_cache") else kernels.rope_and_cache_ref
        attend = kernels.decode_attention if f.get("decode_attention") else kernels.decode_attention_ref
        kc, vc = self.cache[li]
        q = rope(qkv, cos, sin, kc, vc, self.slot_t, fwd.n_heads, fwd.n_kv, fwd.head_dim)  # writes k, v at the slot
        return attend(q, kc, vc, self.bias, S, fwd.scale).reshape(B, fwd.n_heads * fwd.head_dim)

    def _decode_body(self, B: int, S: int) -> torch.Tensor:
        self.bias[:B].index_fill_(1, self.slot_t, 0.0)
        logits = self._layers(B, S)
        self.slot_t.add_(1)
        return logits

    def _step_state(self, B: int) -> list[torch.Tensor]:
        return [self.pos_buf, self.slot_t, self.bias[:B]]

    # -- prefill (eager, the lean forward over the static cache) ----------------------------------
    def _prefill(self, prompts, groups, pre, pmax, smax, adapters, n) -> torch.Tensor:
        dev = self.dev
        views = [(k[:n], v[:n]) for k, v in self.cache]
        for rows, plen in groups:
            if plen > 0:
                self._fill_prefix(rows, prompts[rows[0]][:plen], adapters[rows[0]] if adapters else None)
        ids = torch.full((n, smax), self.pad_id, dtype=torch.long)
        positions = torch.zeros((n, smax), dtype=torch.long)
        valid = torch.zeros((n, pmax + smax), dtype=torch.bool)
        for i, p in enumerate(prompts):
            k = len(p) - pre[i]
            ids[i, smax - k :] = torch.tensor(p[pre[i] :], dtype=torch.long)
            positions[i, smax - k :] = torch.arange(pre[i], len(p))
            valid[i, smax + pmax - k :] = True
            valid[i, : pre[i]] = True
        ids, positions, valid = ids.to(dev), positions.to(dev), valid.to(dev)
        self.bias[:n, : pmax + smax].masked_fill_(valid, 0.0)
        logits = torch.empty((n, self.core.lm_head.weight.shape[0]), dtype=self.dtype, device=dev)
        step = max(1, self.prefill_tokens // max(1, pmax + smax))
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            mask = causal_mask(valid[r0:r1], pmax, smax)
            rows_kv = [(k[r0:r1], v[r0:r1]) for k, v in views]
            h = self.fwd.hidden(ids[r0:r1], positions[r0:r1], mask, cache=rows_kv, start=pmax,
                                adapters=adapters[r0:r1] if adapters else None, last_only=True)
            logits[r0:r1] = self.fwd.head_last(h[:, -1]).to(self.dtype)
        return logits

    def _fill_prefix(self, rows: list[int], prefix: list[int], adapter: str | None) -> None:
        dev, n = self.dev, len(prefix)
        ids = torch.tensor([prefix], dtype=torch.long, device=dev)
        mask = causal_mask(torch.ones((1, n), dtype=torch.bool, device=dev), 0, n)
        _, kv = self.fwd.hidden(ids, torch.arange(n, device=dev).unsqueeze(0), mask,
                                adapters=[adapter] if adapter else None, return_kv=True, last_only=True)
        idx = torch.tensor(rows, dtype=torch.long, device=dev)
        for (kc, vc), (k, v) in zip(self.cache, kv):
            kc[idx, :, :n] = k
            vc[idx, :, :n] = v

    # -- the loop ----------------------------------------------------------------------------------
    def _generate(self, requests: list[GenRequest]) -> list[GenOutput]:
        n = len(requests)
        st = self._start(requests)
        out = _Outputs(n)
        while True:
            launched = self._launch_chunk(st)
            # read the chunk before the one just launched: the device keeps working meanwhile
            while len(st.pending) > (1 if launched else 0):
                self._absorb_one(st, requests, out)
            if all(out.done) or st.steps >= st.max_new - 1:
                while st.pending:  # the last reads (not counted as syncs: nothing waits on them)
                    self._absorb_one(st, requests, out, count=False)
                break
            live = [b for b, i in enumerate(st.rows) if not out.done[i]]
            if batch_bucket(len(live)) < st.Bb and len(live) <= self.compact_ratio * len(st.rows):
                self._shrink(st, live)
        return [GenOutput(out.ids[i], out.lps[i], self.tok.decode(out.ids[i], skip_special_tokens=True), out.finish[i])
                for i in range(n)]

    def _start(self, requests: list[GenRequest]) -> "_Batch":
        """Buffers sized for the batch, the prefill, and the first sampled token of every row."""
        n, dev = len(requests), self.dev
        prompts = [list(r.prompt_ids) for r in requests]
        adapters = [r.adapter or "__base__" for r in requests] if self.is_peft else None
        sp = [r.sampling for r in requests]
        max_new = max(r.max_new_tokens for r in requests)
        groups, pre, pmax, smax = slot_layout(prompts, keys=adapters, min_prefix=self.min_prefix)
        Bb = batch_bucket(n)
        self._ensure(Bb, pmax + smax + max_new)
        self.bias[:Bb].fill_(float("-inf"))
        self.bias[n:Bb, 0] = 0.0  # bucket padding rows attend to something (no empty softmax)
        self.row_adapter[:Bb] = -1
        if adapters is not None:
            self.row_adapter[:n] = torch.tensor([self.slot_of.get(a, -1) for a in adapters], device=dev)
        self._refresh_masks(Bb)
        st = _Batch(Bb=Bb, cur=pmax + smax, max_new=max_new, rows=list(range(n)),  # buffer row -> request
                    temps=torch.tensor([s.temperature for s in sp], dtype=torch.float32, device=dev),
                    top_ps=torch.tensor([s.top_p for s in sp], dtype=torch.float32, device=dev),
                    flags=BatchFlags.of([s.temperature for s in sp], [s.top_p for s in sp]),
                    U=_uniforms(requests, max_new, dev))  # [n, max_new], rows follow the buffer rows
        logits = self._prefill(prompts, groups, pre, pmax, smax, adapters, n)
        self.pos_buf[:n] = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
        self.slot_t.fill_(st.cur)
        tokens, lps = self._draw(logits, st.temps, st.top_ps, st.flags, None if st.U is None else st.U[:, 0])
        st.pending.append((torch.stack([tokens]), torch.stack([lps]), list(st.rows)))
        self.tok_buf[:n].copy_(tokens)
        return st

    def _launch_chunk(self, st: "_Batch") -> bool:
        """Up to ``sync_every`` decode steps on the device, sampled tokens kept there (no host read);
        returns whether any step ran."""
        chunk_t, chunk_l = [], []
        active_rows = len(st.rows)
        while len(chunk_t) < self.sync_every and st.steps < st.max_new - 1:
            logits = self._decode(st.Bb, slot_bucket(st.cur + 1))
            tokens, lps = self._draw(logits[:active_rows], st.temps, st.top_ps, st.flags,
                                     None if st.U is None else st.U[:, st.steps + 1])
            self.tok_buf[:active_rows].copy_(tokens)
            chunk_t.append(tokens)
            chunk_l.append(lps)
            st.cur += 1
            st.steps += 1
        if chunk_t:
            st.pending.append((torch.stack(chunk_t), torch.stack(chunk_l), list(st.rows)))
        return bool(chunk_t)

    def _absorb_one(self, st: "_Batch", requests, out: "_Outputs", count: bool = True) -> None:
        t_chunk, l_chunk, row_map = st.pending.pop(0)
        self._absorb(t_chunk.tolist(), l_chunk.tolist(), row_map, requests, out.ids, out.lps, out.finish, out.done,
                     [r.max_new_tokens for r in requests])
        self.stats["syncs"] += count

    def _shrink(self, st: "_Batch", live: list[int]) -> None:
        """Compact the unfinished rows to the front of the buffers and drop to a smaller batch bucket."""
        st.temps, st.top_ps = self._compact(live, st.temps, st.top_ps)
        if st.U is not None:
            st.U = st.U.index_select(0, torch.tensor(live, dtype=torch.long, device=self.dev))
        st.rows = [st.rows[b] for b in live]
        st.Bb = batch_bucket(len(st.rows))

    def _absorb(self, t_chunk, l_chunk, row_map, requests, out_ids, out_lp, finish, done, limits) -> None:
        """Append one chunk of sampled tokens ``[steps][rows]`` to each unfinished request, up to
        the first of: a stop token, a stop string, its token limit (the eager engine's rules)."""
        for b, i in enumerate(row_map):
            if done[i]:
                continue
            s = requests[i].sampling
            ids = out_ids[i]
            new = [t[b] for t in t_chunk][: limits[i] - len(ids)]
            k, reason = len(new), None
            if not s.ignore_eos and not self.stop_set.isdisjoint(new):
                k, reason = next(j for j, t in enumerate(new) if t in self.stop_set) + 1, "stop"
            if s.stop:
                hit = stop_string_at(self.tok, ids, new[:k], s.stop)
                if hit is not None:
                    k, reason = hit, "stop"
            ids.extend(new[:k])
            out_lp[i].extend(t[b] for t in l_chunk[:k])
            if reason is not None:
                finish[i], done[i] = reason, True
            elif len(ids) >= limits[i]:
                done[i] = True

    def _compact(self, live: list[int], temps, top_ps):
        """Move live rows to the front of every buffer (graphs keep pointing at the same storage)."""
        idx = torch.tensor(live, dtype=torch.long, device=self.dev)
        m = len(live)
        for kc, vc in self.cache:
            kc[:m] = kc.index_select(0, idx)
            vc[:m] = vc.index_select(0, idx)
        for buf in (self.bias, self.tok_buf, self.pos_buf, self.row_adapter):
            buf[:m] = buf.index_select(0, idx)
        Bb = batch_bucket(m)
        self.bias[m:Bb].fill_(float("-inf"))
        self.bias[m:Bb, 0] = 0.0
        self.row_adapter[m:Bb] = -1
        self._refresh_masks(Bb)
        return temps.index_select(0, idx), top_ps.index_select(0, idx)


@dataclass
class _Batch:
    """One generate call's state between decode chunks."""

    Bb: int  # the batch bucket the graphs run at
    cur: int  # the next KV slot
    max_new: int
    rows: list[int]  # buffer row -> request index
    temps: torch.Tensor
    top_ps: torch.Tensor
    flags: BatchFlags
    U: torch.Tensor | None  # per-call random numbers [rows, max_new], or None
    steps: int = 0
    pending: list = field(default_factory=list)  # (tokens [steps, rows], logprobs, row map) not yet read


class _Outputs:
    """What each request has produced so far."""

    def __init__(self, n: int):
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.lps: list[list[float]] = [[] for _ in range(n)]
        self.finish = ["length"] * n
        self.done = [False] * n

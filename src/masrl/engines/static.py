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

Numerics: decode computes exactly what the lean forward computes, up to the kernels' rounding;
prefill *is* the lean forward. The logprob of each sampled token is that of softmax(logits / T).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from masrl.engines import kernels
from masrl.engines.decode_weights import (
    DecodeWeights,
    base_linear,
    batch_bucket,
    capture_stream,
    lora_delta,
    residual_linear,
    slot_bucket,
)
from masrl.engines.hf import _uniforms
from masrl.engines.sampling import BatchFlags, sample_tokens, stop_string_at
from masrl.messages import GenOutput, GenRequest
from masrl.modeling.lean import LlamaForward, causal_mask
from masrl.modeling.prefix import slot_layout


class StaticEngine:
    def __init__(self, model, tokenizer, stop_ids: list[int], *, device: str, seed: int = 0, cuda_graphs: bool = True,
                 sync_every: int = 8, max_batch_size: int = 256, min_prefix: int = 16, compact_ratio: float = 0.5,
                 prefill_tokens: int = 16384, fused_kernels: bool = True):
        self.model = model
        self.tok = tokenizer
        self.fwd = LlamaForward(model)
        self.core = self.fwd.core
        self.stop_set = set(int(s) for s in stop_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.stop_set))
        self.dev = torch.device(device)
        self.device = str(self.dev)
        self.dtype = self.core.model.embed_tokens.weight.dtype
        self.is_peft = hasattr(model, "peft_config")
        self._adapters = list(model.peft_config) if self.is_peft else []
        self.slot_of = {name: i for i, name in enumerate(self._adapters)}
        self.w = DecodeWeights(model, self._adapters)
        self.use_graphs = cuda_graphs and self.dev.type == "cuda"
        self.fused: dict[str, bool] = {}  # kernel name -> use the fused Triton version
        if fused_kernels and kernels.available(self.dev):
            cfg = self.core.config
            verdict = kernels.check(self.dev, self.dtype, self.fwd.n_heads, self.fwd.n_kv, self.fwd.head_dim,
                                    cfg.hidden_size, cfg.intermediate_size)
            self.fused = {name: why is None for name, why in verdict.items()}
            bad = {name: why for name, why in verdict.items() if why is not None}
            if bad:
                import warnings

                warnings.warn(f"masrl static engine: torch ops instead of fused kernels for {bad}", stacklevel=2)
        self.sync_every = sync_every
        self.max_batch_size = max_batch_size
        self.min_prefix = min_prefix
        self.compact_ratio = compact_ratio
        self.prefill_tokens = prefill_tokens
        self.generator = torch.Generator(device=self.dev).manual_seed(seed)
        rot = self.core.model.rotary_emb
        self.inv_freq = rot.inv_freq
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.rows_cap = 0
        self.slots_cap = 0
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.pool = None
        self.stats = {"graphs_captured": 0, "decode_steps": 0, "syncs": 0,
                      "fused_kernels": sorted(n for n, on in self.fused.items() if on)}

    # -- Engine interface ------------------------------------------------------------------------
    def adapters(self) -> list[str]:
        return list(self._adapters)

    def weights_updated(self, policies: list[str] | None = None) -> None:
        if self.w is None:  # released: rebuilt from the live weights on the next generate
            return
        lora = self.is_peft
        self.w.refresh(base=not lora, adapters=lora)

    def memory(self) -> dict[str, int]:
        from masrl.modeling.sizes import tensor_bytes

        kv = tensor_bytes([t for pair in self.__dict__.get("cache", []) for t in pair])
        weights = 0
        if self.w is not None:
            own = [t for e in self.w.layers for t in (e["w_qkv"], e["w_gu"], e["b_qkv"])]
            own += [t for e in self.w.layers for g in e["lora"].values() for t in (g.a, g.b)]
            weights = tensor_bytes(own)
        buffers = tensor_bytes([self.__dict__.get(n) for n in ("bias", "tok_buf", "pos_buf", "row_adapter")]
                               + list(self.__dict__.get("masks", {}).values()))
        return {"kv": kv, "weights": weights, "buffers": buffers}

    def release(self) -> None:
        for graph, _ in self.graphs.values():
            graph.reset()  # frees the graph's private memory pool now, not when the object is collected
        self.graphs.clear()
        self.pool = None
        self.w = None
        self.rows_cap = self.slots_cap = 0
        for name in ("cache", "bias", "tok_buf", "pos_buf", "slot_t", "row_adapter", "masks", "col_index"):
            self.__dict__.pop(name, None)
        self.stats["releases"] = self.stats.get("releases", 0) + 1

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

    @contextlib.contextmanager
    def _kernels(self):
        """This engine's device, and attention kernels with fixed costs (cuDNN's attention plans
        anew for every new key length, ~45 ms each time on an H200 with torch 2.11)."""
        if self.dev.type != "cuda":
            yield
            return
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with torch.cuda.device(self.dev), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                       SDPBackend.MATH]):
            yield

    # -- buffers ---------------------------------------------------------------------------------
    def _ensure(self, rows: int, slots: int) -> None:
        if rows <= self.rows_cap and slots <= self.slots_cap:
            return
        self.rows_cap = max(rows, self.rows_cap)
        self.slots_cap = max(slot_bucket(slots, 256), self.slots_cap)
        R, S, dev = self.rows_cap, self.slots_cap, self.dev
        self.graphs.clear()  # they point at the old buffers
        self.pool = None  # a pool whose graphs are all gone is freed: never capture into it again
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
    def _lora(self, e, name: str, x: torch.Tensor, y: torch.Tensor, B: int) -> torch.Tensor:
        return lora_delta(e, name, x, y, self.masks, B)

    def _decode_body(self, B: int, S: int) -> torch.Tensor:
        fwd, dt = self.fwd, self.dtype
        H, Hkv, D = fwd.n_heads, fwd.n_kv, fwd.head_dim
        f = self.fused
        rms = kernels.rms_norm if f.get("rms_norm") else kernels.rms_norm_ref
        rope = kernels.rope_and_cache if f.get("rope_and_cache") else kernels.rope_and_cache_ref
        silu_mul = kernels.silu_mul if f.get("silu_mul") else kernels.silu_mul_ref
        attend = kernels.decode_attention if f.get("decode_attention") else kernels.decode_attention_ref
        slot = self.slot_t
        self.bias[:B].index_fill_(1, slot, 0.0)
        freqs = self.pos_buf[:B, None].float() * self.inv_freq[None, :].float()
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * self.rope_scale).to(dt)  # [B, D]
        sin = (emb.sin() * self.rope_scale).to(dt)
        h = F.embedding(self.tok_buf[:B], self.core.model.embed_tokens.weight)
        for li, e in enumerate(self.w.layers):
            x = rms(h, e["ln1"].weight, e["ln1"].variance_epsilon)
            qkv = self._lora(e, "qkv", x, F.linear(x, e["w_qkv"], e["b_qkv"]), B)
            if e["q_norm"] is not None:  # Qwen3: RMSNorm over each query and key head, in place
                for mod, lo, n in ((e["q_norm"], 0, H), (e["k_norm"], H, Hkv)):
                    part = qkv[:, lo * D : (lo + n) * D].view(B, n, D)
                    part.copy_(F.rms_norm(part, (D,), mod.weight, mod.variance_epsilon))
            kc, vc = self.cache[li]
            q = rope(qkv, cos, sin, kc, vc, slot, H, Hkv, D)  # also writes k, v at the slot
            o = attend(q, kc, vc, self.bias, S, fwd.scale).reshape(B, H * D)
            h = self._lora(e, "o", o, residual_linear(h, o, base_linear(e["o"])), B)
            x = rms(h, e["ln2"].weight, e["ln2"].variance_epsilon)
            gu = self._lora(e, "gu", x, F.linear(x, e["w_gu"]), B)
            a = silu_mul(gu) if e["silu"] else e["act"](gu[:, : gu.shape[-1] // 2]) * gu[:, gu.shape[-1] // 2 :]
            h = self._lora(e, "down", a, residual_linear(h, a, base_linear(e["down"])), B)
        norm = self.core.model.norm
        h = rms(h, norm.weight, norm.variance_epsilon)
        head = self.core.lm_head
        logits = F.linear(h, head.weight, getattr(head, "bias", None))
        self.pos_buf[:B].add_(1)
        self.slot_t.add_(1)
        return logits

    def _decode(self, B: int, S: int) -> torch.Tensor:
        self.stats["decode_steps"] += 1
        if not self.use_graphs:
            return self._decode_body(B, S)
        key = (B, S)
        if key not in self.graphs:
            self.graphs[key] = self._capture(B, S)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits

    def _capture(self, B: int, S: int):
        saved = (self.pos_buf.clone(), self.slot_t.clone(), self.bias[:B].clone())
        side = capture_stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):  # warm-up: kernels pick their algorithms outside the capture
            self._decode_body(B, S)
        torch.cuda.current_stream(self.dev).wait_stream(side)
        self.pos_buf.copy_(saved[0])
        self.slot_t.copy_(saved[1])
        self.bias[:B].copy_(saved[2])
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # the capture stream named, on this engine's device: torch.cuda.graph's default is one stream for
        # the whole process, made on whichever device was current at the first capture, so an engine on
        # cuda:0 built after one on cuda:1 captured on a stream of the other device and failed
        with torch.cuda.device(self.dev), torch.cuda.graph(graph, pool=self.pool, stream=side,
                                                           capture_error_mode="thread_local"):
            logits = self._decode_body(B, S)
        self.stats["graphs_captured"] += 1
        return graph, logits

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
        tokens, lps = sample_tokens(logits, st.temps, st.top_ps, self.generator, st.flags,
                                    None if st.U is None else st.U[:, 0])
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
            tokens, lps = sample_tokens(logits[:active_rows], st.temps, st.top_ps, self.generator, st.flags,
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

"""PagedEngine: continuous batching over a paged KV cache held to a memory budget.

Agent workloads are multi-turn and long-tailed: an episode's next call starts only when its last
returned, and a few long calls hold a whole one-shot batch up. Here a call is a ``Sequence``
(engines/scheduler.py) and the engine runs steps, not batches:

* **Continuous batching.** Every step the scheduler either prefills waiting calls or advances every
  running call by one token. ``generate`` is safe to call from several threads at once: the calls
  of a second ``generate`` join the running decode at the next step boundary, and each caller
  returns as soon as *its* calls are done (one thread runs the steps; the others wait on a
  condition and take over when it leaves).
* **Paged KV under a budget.** Keys and values live in one pool of ``block_size``-slot blocks
  (engines/blocks.py) sized from ``gpu_memory_utilization`` (the fraction of the device's memory,
  or of the host's on a CPU, the pool may take) or ``kv_blocks``. Memory grows with the tokens in
  use. When the pool is dry the newest call is pre-empted and recomputed later; a call is refused
  (an exception in its place, the others run) only if it could not fit the pool alone.
* **Shared prefixes.** Full blocks are cached by a chained hash of their tokens: a GRPO group's
  samples share their prompt's blocks (one prefill per group) and an episode's next turn reuses
  its earlier turns' blocks (the prompt of turn k+1 extends turn k token for token).
* **The static engine's decode step**: fused q/k/v and gate/up weights, LoRA adapters of one base
  mixed in one batch, fused Triton kernels and CUDA graphs on a GPU (per batch and length bucket;
  the graph reads the block tables from device buffers the host rewrites between replays).

Numerics: prefill is the lean forward (as the trainer computes); decode is the static engine's step
over the paged cache. Token ``t`` of a call with a seed uses ``counter_uniforms(seed)[t]`` whatever
step, batch or pre-emption it lands in, so results do not depend on what ran beside it.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from masrl.engines import kernels
from masrl.engines.blocks import BlockPool
from masrl.engines.decode_weights import (
    DecodeWeights,
    base_linear,
    batch_bucket,
    capture_stream,
    lora_delta,
    residual_linear,
    slot_bucket,
)
from masrl.engines.sampling import BatchFlags, counter_uniforms, sample_tokens, stop_string_at
from masrl.engines.scheduler import Scheduler, Sequence
from masrl.errors import PromptError
from masrl.messages import GenOutput, GenRequest
from masrl.modeling.lean import LlamaForward, causal_mask, core_model


def kv_bytes_per_token(model, dtype: torch.dtype) -> int:
    cfg = core_model(model).config
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * cfg.num_hidden_layers * kv * d * torch.tensor([], dtype=dtype).element_size()


def device_memory(dev: torch.device) -> int:
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass
class _Call:
    """What a sequence needs beyond its tokens."""

    request: GenRequest
    uniforms: np.ndarray | None  # [max_new] when the request carries a seed


class PagedEngine:
    def __init__(self, model, tokenizer, stop_ids: list[int], *, device: str, seed: int = 0, block_size: int = 16,
                 gpu_memory_utilization: float = 0.04, kv_blocks: int | None = None, max_batch_size: int = 256,
                 prefill_tokens: int = 8192, sync_every: int = 8, cuda_graphs: bool = True, fused_kernels: bool = True,
                 **_ignored):
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
        self.block_size = block_size
        per_token = kv_bytes_per_token(model, self.dtype)
        if kv_blocks is None:
            kv_blocks = int(gpu_memory_utilization * device_memory(self.dev)) // (per_token * block_size)
        if kv_blocks < 2:
            raise ValueError(f"the KV budget holds {kv_blocks} blocks of {block_size} tokens ({per_token:,} bytes a "
                             f"token); raise rollout.gpu_memory_utilization")
        self.kv_blocks = kv_blocks
        self.max_batch_size = max_batch_size
        self.prefill_tokens = prefill_tokens
        self.sync_every = sync_every
        self.use_graphs = cuda_graphs and self.dev.type == "cuda"
        self.fused: dict[str, bool] = {}
        if fused_kernels and kernels.available(self.dev):
            cfg = self.core.config
            verdict = kernels.check(self.dev, self.dtype, self.fwd.n_heads, self.fwd.n_kv, self.fwd.head_dim,
                                    cfg.hidden_size, cfg.intermediate_size)
            self.fused = {name: why is None for name, why in verdict.items()}
        self.generator = torch.Generator(device=self.dev).manual_seed(seed)
        self.host_rng = np.random.default_rng(seed)
        rot = self.core.model.rotary_emb
        self.inv_freq = rot.inv_freq
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.w: DecodeWeights | None = None
        self.pool: BlockPool | None = None
        self.sched: Scheduler | None = None
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.graph_pool = None
        self.rows_cap = self.width_cap = 0
        self._cv = threading.Condition()
        self._inbox: list[Sequence] = []
        self._runner: int | None = None
        self.stats = {"graphs_captured": 0, "decode_steps": 0, "prefill_steps": 0, "preemptions": 0,
                      "prefill_tokens": 0, "cached_tokens": 0, "peak_blocks": 0, "joined": 0,
                      "fused_kernels": sorted(n for n, on in self.fused.items() if on)}

    # -- Engine interface ------------------------------------------------------------------------
    def adapters(self) -> list[str]:
        return list(self._adapters)

    def weights_updated(self, policies: list[str] | None = None) -> None:
        if self.pool is not None:
            self.pool.forget()  # cached blocks were computed with the old weights
        if self.w is not None:
            self.w.refresh(base=not self.is_peft, adapters=self.is_peft)

    def memory(self) -> dict[str, int]:
        from masrl.modeling.sizes import tensor_bytes

        kv = tensor_bytes([t for pair in self.kv for t in pair])
        weights = 0
        if self.w is not None:
            own = [t for e in self.w.layers for t in (e["w_qkv"], e["w_gu"], e["b_qkv"])]
            own += [t for e in self.w.layers for g in e["lora"].values() for t in (g.a, g.b)]
            weights = tensor_bytes(own)
        buffers = tensor_bytes([self.__dict__.get(n) for n in ("tok_buf", "pos_buf", "slot_buf", "len_buf", "bt_buf")]
                               + list(self.__dict__.get("masks", {}).values()))
        return {"kv": kv, "weights": weights, "buffers": buffers}

    def release(self) -> None:
        with self._cv:
            if self._runner is not None or self._inbox:
                raise RuntimeError("PagedEngine.release while calls are running")
        for graph, _ in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.graph_pool = None
        self.w = None
        self.kv = []
        self.pool = self.sched = None
        self.rows_cap = self.width_cap = 0
        for name in ("tok_buf", "pos_buf", "slot_buf", "len_buf", "bt_buf", "row_adapter", "masks", "col_index"):
            self.__dict__.pop(name, None)
        self.stats["releases"] = self.stats.get("releases", 0) + 1

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | Exception]:
        """Run ``requests`` to their ends; other threads' calls may run beside them. A call that can
        never fit the KV budget gets a ``PromptError`` in its place."""
        if not requests:
            return []
        self._build()
        seqs = [self._sequence(r) for r in requests]
        todo = [s for s in seqs if s.error is None]
        with self._cv:
            if self._runner is not None:
                self.stats["joined"] += len(todo)
            self._inbox.extend(todo)
            self._cv.notify_all()
            while not all(s.done for s in todo):
                if self._runner is None:
                    self._runner = threading.get_ident()
                    try:
                        self._run_until(todo)
                    finally:
                        self._runner = None
                        self._cv.notify_all()
                else:
                    self._cv.wait()
        return [self._output(s) for s in seqs]

    def _output(self, s: Sequence) -> GenOutput | Exception:
        if s.error is not None:
            if isinstance(s.error, PromptError):
                return s.error
            raise s.error
        return GenOutput(list(s.generated), list(s.logprobs), self.tok.decode(s.generated, skip_special_tokens=True),
                         s.finish, meta={"preempted": s.preempted, "cached_tokens": s.cached})

    def _sequence(self, r: GenRequest) -> Sequence:
        n = r.max_new_tokens
        u = None if r.seed is None else counter_uniforms([r.seed], n)[0]
        seq = Sequence(list(r.prompt_ids), n, key=(r.adapter if self.is_peft else None), payload=_Call(r, u))
        if not self.sched.fits(seq):
            seq.error = PromptError(
                f"the call needs {len(seq.prompt) + n:,} tokens of KV cache; the engine's budget holds "
                f"{self.pool.usable * self.block_size:,} ({self.pool.usable} blocks of {self.block_size}); raise "
                f"rollout.gpu_memory_utilization or lower max_new_tokens")
        return seq

    # -- the step loop (one thread at a time; called with the condition held) ----------------------
    def _run_until(self, mine: list[Sequence]) -> None:
        while not all(s.done for s in mine):
            for s in self._inbox:
                self.sched.add(s)
            self._inbox.clear()
            self._cv.release()
            try:
                with self._kernels(), torch.inference_mode():
                    finished = self._step()
            except BaseException as exc:  # the engine failed: every call it holds fails with it
                self._cv.acquire()
                for s in self.sched.drop_all():
                    s.error = exc
                raise
            self._cv.acquire()
            if finished:
                self._cv.notify_all()

    def _step(self) -> bool:
        step = self.sched.schedule(lookahead=self.sync_every)
        if step is None:
            raise RuntimeError("paged engine: calls are waiting but none can be scheduled (a bug: please report it)")
        pool = self.sched.pool
        self.stats["peak_blocks"] = max(self.stats["peak_blocks"], pool.used())
        if step.kind == "prefill":
            logits = self._prefill(step.seqs)
            for s in step.seqs:
                self.sched.registered(s)
            finished = self._sample(step.seqs, logits)
        else:
            finished = self._decode(step.seqs)
        st = self.sched.stats
        for k in ("preemptions", "prefill_tokens", "cached_tokens"):
            self.stats[k] = st[k]
        return finished

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> bool:
        calls = [s.payload for s in seqs]
        sp = [c.request.sampling for c in calls]
        temps = [p.temperature for p in sp]
        top_ps = [p.top_p for p in sp]
        u = np.array([c.uniforms[len(s.generated)] if c.uniforms is not None else self.host_rng.random()
                      for s, c in zip(seqs, calls)], dtype=np.float32)
        dev = self.dev
        tokens, lps = sample_tokens(logits[: len(seqs)], torch.tensor(temps, device=dev),
                                    torch.tensor(top_ps, device=dev), self.generator, BatchFlags.of(temps, top_ps),
                                    torch.from_numpy(u).to(dev))
        any_done = False
        for s, p, t, lp in zip(seqs, sp, tokens.tolist(), lps.tolist()):
            s.generated.append(t)
            s.logprobs.append(lp)
            if not p.ignore_eos and t in self.stop_set:
                s.finish = "stop"
            elif p.stop:
                ids = s.generated
                if stop_string_at(self.tok, ids[:-1], [t], p.stop) is not None:
                    s.finish = "stop"
            if s.finish is None and len(s.generated) >= s.max_new:
                s.finish = "length"
            if s.finish is not None:
                self.sched.finished(s)
                any_done = True
        return any_done

    @contextlib.contextmanager
    def _kernels(self):
        if self.dev.type != "cuda":
            yield
            return
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with torch.cuda.device(self.dev), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                       SDPBackend.MATH]):
            yield

    # -- the pool and the buffers --------------------------------------------------------------------
    def _build(self) -> None:
        if self.w is None:
            self.w = DecodeWeights(self.model, self._adapters)
        if self.pool is None:
            self.pool = BlockPool(self.kv_blocks, self.block_size)
            self.sched = Scheduler(self.pool, max_seqs=self.max_batch_size, prefill_tokens=self.prefill_tokens)
            slots, shape = self.kv_blocks * self.block_size, (self.fwd.n_kv, self.fwd.head_dim)
            self.kv = [(torch.zeros((slots, *shape), dtype=self.dtype, device=self.dev),
                        torch.zeros((slots, *shape), dtype=self.dtype, device=self.dev)) for _ in self.fwd.layers]

    def _ensure(self, rows: int, width: int) -> None:
        if rows <= self.rows_cap and width <= self.width_cap:
            return
        self.rows_cap = max(rows, self.rows_cap)
        self.width_cap = max(-(-width // 64) * 64, self.width_cap)
        R, W, dev = self.rows_cap, self.width_cap, self.dev
        self.graphs.clear()
        self.graph_pool = None
        self.tok_buf = torch.zeros(R, dtype=torch.long, device=dev)
        self.pos_buf = torch.zeros(R, dtype=torch.long, device=dev)
        self.slot_buf = torch.zeros(R, dtype=torch.long, device=dev)
        self.len_buf = torch.ones(R, dtype=torch.int32, device=dev)
        self.bt_buf = torch.zeros((R, W), dtype=torch.int32, device=dev)
        self.row_adapter = torch.full((R,), -1, dtype=torch.long, device=dev)
        self.masks = {cols: torch.zeros((R, len(cols)), dtype=self.dtype, device=dev) for cols in self.w.layouts}
        self.col_index = {cols: torch.tensor(cols, dtype=torch.long, device=dev) for cols in self.w.layouts}
        self.bt_host = np.zeros((R, W), dtype=np.int32)

    # -- prefill: the lean forward over each call's uncached tokens, keys and values into its blocks --
    def _prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Logits after each sequence's last token. Rows are batched up to ``prefill_tokens`` (rows x
        longest row); a sequence with more new tokens than that runs alone, ``prefill_tokens`` at a
        time over its blocks so far (chunked prefill: memory stays flat however long the prompt)."""
        V = self.core.lm_head.weight.shape[0]
        logits = torch.empty((len(seqs), V), dtype=self.dtype, device=self.dev)
        budget = self.prefill_tokens
        order = sorted(range(len(seqs)), key=lambda i: seqs[i].length - seqs[i].cached)
        chunk: list[int] = []
        for i in order + [None]:
            if i is not None:
                s = seqs[i]
                if s.length - s.cached > budget:
                    for start in range(s.cached, s.length, budget):
                        end = min(s.length, start + budget)
                        self._prefill_rows([(s, start, end)], logits, [i] if end == s.length else None)
                    continue
                width = max([seqs[j].length for j in chunk] + [s.length])
                if not chunk or (len(chunk) + 1) * width <= budget:
                    chunk.append(i)
                    continue
            if chunk:
                self._prefill_rows([(seqs[j], seqs[j].cached, seqs[j].length) for j in chunk], logits, chunk)
            chunk = [] if i is None else [i]
        return logits

    def _prefill_rows(self, spans: list[tuple[Sequence, int, int]], logits: torch.Tensor,
                      where: list[int] | None) -> None:
        """Compute tokens ``[start, end)`` of each sequence over its keys and values before ``start``
        (in its blocks), write theirs into its blocks, and (``where``) put the last position's logits
        in those rows of ``logits``."""
        dev, bs = self.dev, self.block_size
        B = len(spans)
        C = max(a for _, a, _ in spans)
        N = max(e - a for _, a, e in spans)
        ids = torch.full((B, N), self.pad_id, dtype=torch.long)
        pos = torch.zeros((B, N), dtype=torch.long)
        valid = torch.zeros((B, C + N), dtype=torch.bool)
        past_idx = torch.zeros((B, C), dtype=torch.long)
        new_slots, new_rows, new_cols = [], [], []
        for b, (s, c, end) in enumerate(spans):
            toks = s.tokens
            n = end - c
            ids[b, :n] = torch.tensor(toks[c:end], dtype=torch.long)
            pos[b, :n] = torch.arange(c, end)
            valid[b, :c] = True
            valid[b, C : C + n] = True
            t = torch.arange(end)
            table = torch.tensor(s.table, dtype=torch.long)
            slot = table[t // bs] * bs + t % bs
            past_idx[b, :c] = slot[:c]
            new_slots.append(slot[c:])
            new_rows += [b] * n
            new_cols += range(n)
            s.kv_len = end
        ids, pos, valid = ids.to(dev), pos.to(dev), valid.to(dev)
        past_idx = past_idx.to(dev)
        past = None
        if C > 0:
            past = [(kf[past_idx].permute(0, 2, 1, 3), vf[past_idx].permute(0, 2, 1, 3)) for kf, vf in self.kv]
        adapters = [s.key or "__base__" for s, _, _ in spans] if self.is_peft else None
        mask = causal_mask(valid, C, N)
        h, new_kv = self.fwd.hidden(ids, pos, mask, past=past, adapters=adapters, return_kv=True)
        slots = torch.cat(new_slots).to(dev)
        rows = torch.tensor(new_rows, dtype=torch.long, device=dev)
        cols = torch.tensor(new_cols, dtype=torch.long, device=dev)
        for (kf, vf), (k, v) in zip(self.kv, new_kv):  # k, v [B, Hkv, N, D]
            kf.index_copy_(0, slots, k[rows, :, cols].to(kf.dtype))
            vf.index_copy_(0, slots, v[rows, :, cols].to(vf.dtype))
        if where is not None:
            last = torch.tensor([e - a - 1 for _, a, e in spans], dtype=torch.long, device=dev)
            hl = h[torch.arange(B, device=dev), last]
            logits[torch.tensor(where, device=dev)] = self.fwd.head_last(hl).to(self.dtype)

    # -- decode: one token for every running call ------------------------------------------------------
    def _decode(self, seqs: list[Sequence]) -> bool:
        """Up to ``sync_every`` decode steps for every running call, the sampled tokens kept on the
        device and read back once; a call that finishes inside the chunk rides along to its end (its
        extra tokens dropped; writes past its blocks land in the scratch block). Returns whether a
        call finished."""
        B, bs, dev = len(seqs), self.block_size, self.dev
        Bb = batch_bucket(B)
        k = max(1, min(self.sync_every, max(s.max_new - len(s.generated) for s in seqs)))
        kv = np.array([s.kv_len for s in seqs], dtype=np.int64)
        top = int(kv.max()) + k
        # the fused kernel reads each row's length on the device: one graph per batch bucket serves any length
        S = 0 if self.fused.get("paged_attention") else slot_bucket(top)
        self._ensure(Bb, max(max(len(s.table) for s in seqs), -(-top // bs), -(-max(S, 1) // bs)) + 1)
        self._load_rows(seqs, Bb, kv)
        sp = [s.payload.request.sampling for s in seqs]
        temps_l, top_ps_l = [p.temperature for p in sp], [p.top_p for p in sp]
        temps, top_ps = torch.tensor(temps_l, device=dev), torch.tensor(top_ps_l, device=dev)
        flags = BatchFlags.of(temps_l, top_ps_l)
        U_dev = torch.from_numpy(self._uniforms(seqs, k)).to(dev)
        toks, lps = [], []
        for j in range(k):
            logits = self._decode_step(Bb, S)
            t, lp = sample_tokens(logits[:B], temps, top_ps, self.generator, flags, U_dev[:, j])
            self.tok_buf[:B].copy_(t)
            toks.append(t)
            lps.append(lp)
        T, L = torch.stack(toks).t().tolist(), torch.stack(lps).t().tolist()  # one read per chunk
        return self._take(seqs, sp, T, L)

    def _load_rows(self, seqs: list[Sequence], Bb: int, kv: np.ndarray) -> None:
        """The chunk's inputs into the device buffers: block tables, positions, last tokens, adapters."""
        B = len(seqs)
        bt = self.bt_host
        bt[:Bb] = 0
        for b, s in enumerate(seqs):
            bt[b, : len(s.table)] = s.table
        pos = np.zeros(Bb, dtype=np.int64)
        pos[:B] = kv
        self.bt_buf[:Bb].copy_(torch.from_numpy(bt[:Bb]))
        self.pos_buf[:Bb].copy_(torch.from_numpy(pos))
        self.tok_buf[:B].copy_(torch.tensor([s.generated[-1] for s in seqs]))
        if self.is_peft:
            ad = [self.slot_of.get(s.key, -1) for s in seqs] + [-1] * (Bb - B)
            self.row_adapter[:Bb].copy_(torch.tensor(ad))
            for cols, m in self.masks.items():
                m[:Bb].copy_((self.row_adapter[:Bb, None] == self.col_index[cols][None, :]).to(self.dtype))

    def _uniforms(self, seqs: list[Sequence], k: int) -> np.ndarray:
        """``[rows, k]``: each call's random numbers for its next ``k`` tokens (by its seed's counter)."""
        U = np.empty((len(seqs), k), dtype=np.float32)
        for b, s in enumerate(seqs):
            u, g = s.payload.uniforms, len(s.generated)
            if u is not None:
                row = u[g : g + k]
                U[b, : len(row)] = row
                U[b, len(row) :] = 0.5  # past its limit: the tokens are dropped
            else:
                U[b] = self.host_rng.random(k)
        return U

    def _take(self, seqs: list[Sequence], sp: list, T: list[list[int]], L: list[list[float]]) -> bool:
        """Each call keeps its chunk's tokens up to its first stop or its limit; returns whether one finished."""
        any_done = False
        for s, p, new, new_lp in zip(seqs, sp, T, L):
            new = new[: s.max_new - len(s.generated)]
            n, reason = len(new), None
            if not p.ignore_eos and not self.stop_set.isdisjoint(new):
                n, reason = next(j for j, t in enumerate(new) if t in self.stop_set) + 1, "stop"
            if p.stop:
                hit = stop_string_at(self.tok, s.generated, new[:n], p.stop)
                if hit is not None:
                    n, reason = hit, "stop"
            s.generated += new[:n]
            s.logprobs += new_lp[:n]
            s.kv_len += n
            if reason is not None:
                s.finish = reason
            elif len(s.generated) >= s.max_new:
                s.finish = "length"
            if s.finish is not None:
                self.sched.finished(s)
                any_done = True
        return any_done

    def _decode_step(self, Bb: int, S: int) -> torch.Tensor:
        self.stats["decode_steps"] += 1
        if not self.use_graphs:
            return self._decode_body(Bb, S)
        key = (Bb, S)
        if key not in self.graphs:
            self.graphs[key] = self._capture(Bb, S)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits

    def _lora(self, e, name: str, x: torch.Tensor, y: torch.Tensor, B: int) -> torch.Tensor:
        return lora_delta(e, name, x, y, self.masks, B)

    def _decode_body(self, B: int, S: int) -> torch.Tensor:
        fwd, dt = self.fwd, self.dtype
        H, Hkv, D = fwd.n_heads, fwd.n_kv, fwd.head_dim
        f = self.fused
        rms = kernels.rms_norm if f.get("rms_norm") else kernels.rms_norm_ref
        rope = kernels.rope_and_cache_paged if f.get("rope_and_cache_paged") else kernels.rope_and_cache_paged_ref
        silu_mul = kernels.silu_mul if f.get("silu_mul") else kernels.silu_mul_ref
        attend = kernels.paged_attention if f.get("paged_attention") else kernels.paged_attention_ref
        freqs = self.pos_buf[:B, None].float() * self.inv_freq[None, :].float()
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * self.rope_scale).to(dt)
        sin = (emb.sin() * self.rope_scale).to(dt)
        bs, pos = self.block_size, self.pos_buf[:B]
        slots = self.slot_buf[:B]
        slots.copy_(self.bt_buf[:B].gather(1, (pos // bs)[:, None]).squeeze(1).long() * bs + pos % bs)
        lens = self.len_buf[:B]
        lens.copy_(pos + 1)
        tables = self.bt_buf[:B]
        h = F.embedding(self.tok_buf[:B], self.core.model.embed_tokens.weight)
        for li, e in enumerate(self.w.layers):
            x = rms(h, e["ln1"].weight, e["ln1"].variance_epsilon)
            qkv = self._lora(e, "qkv", x, F.linear(x, e["w_qkv"], e["b_qkv"]), B)
            if e["q_norm"] is not None:
                for mod, lo, n in ((e["q_norm"], 0, H), (e["k_norm"], H, Hkv)):
                    part = qkv[:, lo * D : (lo + n) * D].view(B, n, D)
                    part.copy_(F.rms_norm(part, (D,), mod.weight, mod.variance_epsilon))
            kf, vf = self.kv[li]
            q = rope(qkv, cos, sin, kf, vf, slots, H, Hkv, D)
            o = attend(q, kf, vf, tables, lens, S, self.block_size, fwd.scale).reshape(B, H * D)
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
        return logits

    def _capture(self, B: int, S: int):
        side = capture_stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        saved = self.pos_buf.clone()
        with torch.cuda.stream(side):  # warm-up (writes the slots the replay will: harmless)
            self._decode_body(B, S)
        torch.cuda.current_stream(self.dev).wait_stream(side)
        self.pos_buf.copy_(saved)
        if self.graph_pool is None:
            self.graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.dev), torch.cuda.graph(graph, pool=self.graph_pool, stream=side,
                                                           capture_error_mode="thread_local"):
            logits = self._decode_body(B, S)
        self.pos_buf.copy_(saved)  # capturing ran nothing, but keep the host's positions exact either way
        self.stats["graphs_captured"] += 1
        return graph, logits


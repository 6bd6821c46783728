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
* **Shared prefixes.** A GRPO group's samples fork from its first: one prefill per group (full blocks
  shared, the partial last block copied, the logits reused). Full blocks are also cached by a
  chained hash of their tokens, so an episode's next turn reuses its earlier turns' blocks (the
  prompt of turn k+1 extends turn k token for token).
* **The static engine's decode step** (``engines/decoder.py``, shared): fused q/k/v and gate/up weights, LoRA adapters of one base
  mixed in one batch, fused Triton kernels and CUDA graphs on a GPU (per batch and length bucket;
  the graph reads the block tables from device buffers the host rewrites between replays).

Numerics: prefill is the lean forward (as the trainer computes); decode is the static engine's step
over the paged cache. Token ``t`` of a call with a seed uses ``counter_uniforms(seed)[t]`` whatever
step, batch or pre-emption it lands in, so results do not depend on what ran beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from masrl.engines import kv_pool, paged_calls, paged_kernels
from masrl.engines.blocks import BlockPool
from masrl.engines.decode_weights import DecodeWeights, batch_bucket, slot_bucket
from masrl.engines.decoder import GraphDecoder
from masrl.engines.paged_prefill import PoolPrefill, block_tables, rows_bucket, token_rows
from masrl.engines.sampling import BatchFlags, counter_uniforms
from masrl.engines.scheduler import Scheduler, Sequence
from masrl.errors import PromptError
from masrl.messages import GenOutput, GenRequest
from masrl.modeling.sizes import tensor_bytes

# A prefill whose calls' new tokens read at most ROWS_PREFILL_KEYS keys in all (new tokens x their past, each
# row reading its own) runs as token rows through the decode graphs, ROWS_PREFILL_BATCH rows a replay
ROWS_PREFILL_KEYS = 1 << 21
ROWS_PREFILL_BATCH = 512


@dataclass
class _Job:
    """A weight change waiting for a step boundary (``at_boundary``)."""

    fn: Callable[[], None]
    error: BaseException | None = None
    done: bool = False


class PagedEngine(GraphDecoder):
    joins_running_decode = True  # a second generate's calls join the running decode (the driver overlaps batches)

    def __init__(self, model, tokenizer, stop_ids: list[int], *, device: str, seed: int = 0, block_size: int = 16,
                 gpu_memory_utilization: float = 0.04, kv_blocks: int | None = None, max_batch_size: int = 256,
                 prefill_tokens: int = 8192, sync_every: int = 8, cuda_graphs: bool = True, fused_kernels: bool = True,
                 graph_prefill: bool | None = None, overlap_chunks: bool | None = None, **_ignored):
        super().__init__(model, tokenizer, stop_ids, device=device, seed=seed, cuda_graphs=cuda_graphs,
                         fused_kernels=fused_kernels)
        # _prefill_rows (rollout.graph_prefill): None = where the decode step replays CUDA graphs (eager on a CPU,
        # the rows save no launches there; docs/benchmarks.md has the GPU figures)
        self.graph_prefill = self.use_graphs if graph_prefill is None else graph_prefill
        # rollout.overlap_chunks: the next decode chunk is queued before the host takes the last one's tokens
        # (None: on a GPU, where the host's bookkeeping then runs while the device decodes)
        self.overlap_chunks = self.dev.type == "cuda" if overlap_chunks is None else overlap_chunks
        self._inflight: paged_calls.Chunk | None = None  # a chunk on the device whose tokens are not taken yet
        self.block_size = block_size
        self.kv_blocks = kv_pool.pool_blocks(model, self.dtype, self.dev, block_size, gpu_memory_utilization, kv_blocks)
        self.max_batch_size = max_batch_size
        self.prefill = PoolPrefill(self.fwd, block_size=block_size, budget=prefill_tokens, pad_id=self.pad_id,
                                   dtype=self.dtype, dev=self.dev, is_peft=self.is_peft)
        self.sync_every = sync_every
        self.host_rng = np.random.default_rng(seed)
        self.pool: BlockPool | None = None
        self.sched: Scheduler | None = None
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.rows_cap = self.width_cap = 0
        self._cv = threading.Condition()
        self._inbox: list[Sequence] = []
        self._runner: int | None = None
        self._boundary: list[_Job] = []  # at_boundary jobs waiting for the next step boundary
        self.stats.update({"prefill_steps": 0, "preemptions": 0, "prefill_tokens": 0, "cached_tokens": 0,
                           "peak_blocks": 0, "joined": 0, "forks": 0, "row_prefills": 0, "forward_prefills": 0,
                           "swaps_mid_call": 0, "overlapped_chunks": 0})
        self._taken_preemptions = 0  # the pre-emptions counted at the last take_counters
        self._last_sampling = None  # (ids of the calls, _sampling's result, the calls) of the last chunk

    # -- Engine interface (adapters: GraphDecoder) ---------------------------------------------------
    def weights_updated(self, policies: list[str] | None = None) -> None:
        if self.pool is not None:
            self.pool.forget()  # cached blocks were computed with the old weights
            self.sched.epoch += 1  # and blocks of calls running now never join the cache
        super().weights_updated(policies)

    def at_boundary(self, fn) -> None:
        """Run ``fn`` (a weight change) between two engine steps: at once when no step runs, else by
        the thread running the steps at its next step boundary; return when it has run. Calls
        running then go on with the new weights over the keys and values they have (AReaL's
        interruptible generation); their blocks never join the prefix cache."""
        with self._cv:
            if self._runner is None:
                fn()
                return
            job = _Job(fn)
            self._boundary.append(job)
            self._cv.notify_all()
            while not job.done:
                if self._runner is None:  # the runner left before reaching a boundary: run what waits
                    self._run_boundary()
                else:
                    self._cv.wait()
            if job.error is not None:
                raise job.error

    def _run_boundary(self) -> None:
        """The waiting ``at_boundary`` jobs (called with the condition held, between steps)."""
        while self._boundary:
            job = self._boundary.pop(0)
            if self.sched is not None and self.sched.running:
                self.stats["swaps_mid_call"] += 1
            try:
                job.fn()
            except BaseException as exc:  # the caller raises it
                job.error = exc
            job.done = True
        self._cv.notify_all()

    def memory(self) -> dict[str, int]:
        kv = tensor_bytes([t for pair in self.kv for t in pair])
        buffers = tensor_bytes([self.__dict__.get(n) for n in ("tok_buf", "pos_buf", "slot_buf", "len_buf", "bt_buf")]
                               + list(self.__dict__.get("masks", {}).values()))
        return {"kv": kv, "weights": self._weight_bytes(), "buffers": buffers}

    def take_counters(self) -> dict[str, float]:
        """Since the last take: calls pre-empted for want of blocks (``preemptions``) and the pool's
        fullest point (``pool_peak``, the fraction of its blocks in use). A pool that fills and
        pre-empts often is too small for the batch: its calls are computed again."""
        done = self.stats["preemptions"] - self._taken_preemptions
        self._taken_preemptions = self.stats["preemptions"]
        peak = self.stats["peak_blocks"] / max(1, self.kv_blocks)
        self.stats["peak_blocks"] = self.pool.used() if self.pool is not None else 0
        return {"preemptions": float(done), "pool_peak": peak}

    def release(self) -> None:
        with self._cv:
            if self._runner is not None or self._inbox:
                raise RuntimeError("PagedEngine.release while calls are running")
        self._release(("tok_buf", "pos_buf", "slot_buf", "len_buf", "bt_buf", "row_adapter", "masks", "col_index"))
        self.kv = []
        self.pool = self.sched = None
        self._last_sampling = self._inflight = None
        self.rows_cap = self.width_cap = 0

    def generate(self, requests: list[GenRequest],
                 on_done: Callable[[int, GenOutput], None] | None = None) -> list[GenOutput | Exception]:
        """Run ``requests`` to their ends; other threads' calls may run beside them. A call that can
        never fit the KV budget gets a ``PromptError`` in its place. ``on_done(i, output)`` is called
        as soon as request ``i`` finishes (from whichever thread runs the engine's steps, between two
        steps), so a short call need not wait for a long one of its batch; the list still comes back
        whole at the end."""
        if not requests:
            return []
        self._build()
        seqs = [self._sequence(r, i, on_done) for i, r in enumerate(requests)]
        todo = [s for s in seqs if s.error is None]
        with self._cv:
            if self._runner is not None:
                self.stats["joined"] += len(todo)
            self._inbox.extend(todo)
            self._cv.notify_all()
            while not all(paged_calls.settled(s) for s in todo):
                if self._runner is None:
                    self._runner = threading.get_ident()
                    try:
                        self._run_until(todo)
                    finally:
                        self._run_boundary()
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

    def _sequence(self, r: GenRequest, index: int = 0, on_done=None) -> Sequence:
        n = r.max_new_tokens
        u = None if r.seed is None else counter_uniforms([r.seed], n)[0]
        seq = Sequence(list(r.prompt_ids), n, key=(r.adapter if self.is_peft else None),
                       payload=paged_calls.Call(r, u, index, on_done))
        if not self.sched.fits(seq):
            seq.error = PromptError(
                f"the call needs {len(seq.prompt) + n:,} tokens of KV cache; the engine's budget holds "
                f"{self.pool.usable * self.block_size:,} ({self.pool.usable} blocks of {self.block_size}); raise "
                f"rollout.gpu_memory_utilization or lower max_new_tokens")
        return seq

    # -- the step loop (one thread at a time; called with the condition held) ----------------------
    def _run_until(self, mine: list[Sequence]) -> None:
        while not all(paged_calls.settled(s) for s in mine):
            for s in self._inbox:
                self.sched.add(s)
            self._inbox.clear()
            finished = self._unlocked(self._step)
            if self._boundary and self._inflight is not None:  # a weight change waits for the chunk in flight
                finished |= self._unlocked(self._take_inflight)
            self._run_boundary()
            if finished:
                self._cv.notify_all()
        if self._inflight is not None:  # other callers' calls: the next runner starts with none in flight
            if self._unlocked(self._take_inflight):
                self._cv.notify_all()

    def _unlocked(self, work: Callable[[], bool]) -> bool:
        """``work()`` with the condition released (other callers may queue calls meanwhile)."""
        self._cv.release()
        try:
            with self._kernels(), torch.inference_mode():
                out = work()
        except BaseException as exc:  # the engine failed: every call it holds fails with it
            self._cv.acquire()
            self._inflight = None
            for s in self.sched.drop_all():
                s.error = exc
            raise
        self._cv.acquire()
        return out

    def _step(self) -> bool:
        if self._inflight is not None:
            return self._take_inflight(follow=not self.sched.waiting and not self._boundary)
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
            finished = self._decode_chunk(step.seqs)
        st = self.sched.stats
        for k in ("preemptions", "prefill_tokens", "cached_tokens", "forks"):
            self.stats[k] = st[k]
        return finished

    # -- prefill: the calls' new tokens into their blocks, the logits after each call's last ----------------
    def _prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Token rows through the decode step's graphs (``_prefill_rows``) when they are on and the rows read
        few keys in all (next turns: a few new tokens over a cached past); else the lean forward
        (``PoolPrefill.run``: long prompts, where its attention reads each key once for all new tokens)."""
        lead = [s for s in seqs if s.fork_of is None]
        n = np.array([s.length - s.cached for s in lead], dtype=np.int64)
        c = np.array([s.cached for s in lead], dtype=np.int64)
        if not self.graph_prefill or int((n * c + n * (n + 1) // 2).sum()) > ROWS_PREFILL_KEYS:
            self.stats["forward_prefills"] += 1
            return self.prefill.run(seqs, self.kv)
        self.stats["row_prefills"] += 1
        return self._prefill_rows(seqs, lead, n, c)

    def _prefill_rows(self, seqs: list[Sequence], lead: list[Sequence], n: np.ndarray, c: np.ndarray) -> torch.Tensor:
        """A prefill as decode steps whose rows are tokens: row ``t`` of call ``s`` is the token at position
        ``cached + t`` over ``s``'s block table. Every layer writes all rows' keys and values into their
        slots before any row attends, so a row sees its call's earlier new tokens as it would its cached
        past: one replay of a captured decode graph computes up to ``ROWS_PREFILL_BATCH`` new tokens of any
        number of calls, where the lean forward pads every call to the longest and launches each kernel
        from Python. The graph stops before the output head (variant "rows"); the head runs on each leader's
        last row; forks copy its logits (``PoolPrefill``)."""
        dev, bs, pk = self.dev, self.block_size, paged_kernels
        logits = torch.empty((len(seqs), self.core.lm_head.weight.shape[0]), dtype=self.dtype, device=dev)
        row_of, pos, last = token_rows(n, c)
        T = len(row_of)
        toks = torch.from_numpy(np.fromiter((t for s in lead for t in s.tokens[s.cached : s.length]), dtype=np.int64,
                                            count=T))
        into = np.array([i for i, s in enumerate(seqs) if s.fork_of is None], dtype=np.int64)
        tables = block_tables(lead)
        width = tables.shape[1]
        keys = [s.key for s in lead]
        self.variant = "rows"
        try:
            for a in range(0, T, ROWS_PREFILL_BATCH):
                b = min(T, a + ROWS_PREFILL_BATCH)
                Bb = rows_bucket(b - a)
                top = int(pos[a:b].max()) + 1
                S = pk.paged_length_class(top) if self.fused.get("paged_attention") else slot_bucket(top)
                self._ensure(Bb, max(width, -(-max(S, 1) // bs)) + 1)
                who = row_of[a:b]
                self._load(Bb, tables[who], pos[a:b], toks[a:b], [keys[j] for j in who])
                h = self._decode(Bb, S, count=False)  # final hidden states of the rows
                done = np.nonzero((last >= a) & (last < b))[0]
                if len(done):
                    logits[torch.from_numpy(into[done]).to(dev)] = self._head(h[torch.from_numpy(last[done] - a).to(dev)])
        finally:
            self.variant = ""
        for s in lead:
            s.kv_len = s.length
        self.prefill.copy_forks(seqs, logits, self.kv)
        return logits

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> bool:
        """Each just-prefilled call's next token, from the prefill's logits."""
        sp, temps, top_ps, flags = self._sampling(seqs)
        u = torch.from_numpy(self._uniforms(seqs, 1)[:, 0]).to(self.dev)
        tokens, lps = self._draw(logits[: len(seqs)], temps, top_ps, flags, u)
        return self._take(seqs, sp, [[t] for t in tokens.tolist()], [[x] for x in lps.tolist()], decoded=False)

    def _sampling(self, seqs: list[Sequence]) -> tuple[list, torch.Tensor, torch.Tensor, BatchFlags]:
        """The calls' sampling settings and their device tensors; the last ones again while the same calls
        decode (most chunks: the running set changes only when a call joins or leaves)."""
        key = tuple(map(id, seqs))
        if self._last_sampling is not None and self._last_sampling[0] == key:
            return self._last_sampling[1]
        sp = [s.payload.request.sampling for s in seqs]
        temps, top_ps = [p.temperature for p in sp], [p.top_p for p in sp]
        out = (sp, torch.tensor(temps, device=self.dev), torch.tensor(top_ps, device=self.dev),
               BatchFlags.of(temps, top_ps))
        self._last_sampling = (key, out, list(seqs))  # the calls kept alive, so their ids are not reused
        return out

    # -- the pool and the buffers --------------------------------------------------------------------
    def _build(self) -> None:
        """The fused weights and the pool, once: under the engine's lock, since several callers may
        arrive at a fresh engine at once (one pool, not two; none sees a pool whose cache is not there)."""
        with self._cv:
            if self.w is None:
                self.w = DecodeWeights(self.model, self._adapters)
            if self.pool is not None:
                return
            self.kv = kv_pool.allocate(self.model, len(self.fwd.layers), self.kv_blocks * self.block_size,
                                       (self.fwd.n_kv, self.fwd.head_dim), self.dtype, self.dev)
            self.sched = Scheduler(BlockPool(self.kv_blocks, self.block_size), max_seqs=self.max_batch_size,
                                   prefill_tokens=self.prefill.budget)
            self.pool = self.sched.pool

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

    # -- decode: one token for every running call ------------------------------------------------------
    def _decode_chunk(self, seqs: list[Sequence]) -> bool:
        """Up to ``sync_every`` decode steps for every running call, the sampled tokens kept on the
        device and read back once; a call that finishes inside the chunk rides along to its end (its
        extra tokens dropped; writes past its blocks land in the scratch block). With ``overlap_chunks``
        the tokens are taken at the next step, after the chunk that follows is queued. Returns whether a
        call finished."""
        k = max(1, min(self.sync_every, max(s.max_new - len(s.generated) for s in seqs)))
        chunk = self._launch(seqs, k)
        if self.overlap_chunks:
            self._inflight = chunk
            return False
        return self._take(seqs, chunk.sp, *chunk.results())

    def _take_inflight(self, follow: bool = False) -> bool:
        """Take the tokens of the chunk in flight; first, when ``follow`` and its calls can go on
        (``paged_calls.continuation_steps``), queue the chunk that follows it from the device's state, so the
        device decodes while the host keeps tokens and tells callers."""
        c, self._inflight = self._inflight, None
        k = paged_calls.continuation_steps(c, self.sched.running, self.sched.pool, self.sync_every) if follow else 0
        if k:
            self._inflight = self._launch(c.seqs, k, ahead=c.k)
            if self._inflight is not None:
                self.sched.stats["decodes"] += 1
                self.stats["overlapped_chunks"] += 1
        T, L = c.results()
        live = [i for i, s in enumerate(c.seqs) if s.finish is None and s.error is None]
        return self._take([c.seqs[i] for i in live], [c.sp[i] for i in live], [T[i] for i in live],
                          [L[i] for i in live])

    def _launch(self, seqs: list[Sequence], k: int, ahead: int = 0) -> paged_calls.Chunk | None:
        """Queue ``k`` decode steps of ``seqs``: from the host's state (``ahead`` 0), or going on from the
        device's tokens and positions ``ahead`` steps past it (a chunk in flight; only the block tables are
        sent again, from pinned memory, so nothing waits for that chunk). None: going on would need larger
        step buffers (new buffers lose the device's state; the host takes the chunk in flight first)."""
        B, bs, dev = len(seqs), self.block_size, self.dev
        Bb = batch_bucket(B)
        kv = np.array([s.kv_len + ahead for s in seqs], dtype=np.int64)
        top = int(kv.max()) + k
        # the fused kernel reads each row's length on the device: one graph per batch bucket and length class
        # (short rows and long ones launch it differently) serves any length
        S = paged_kernels.paged_length_class(top) if self.fused.get("paged_attention") else slot_bucket(top)
        width = max(max(len(s.table) for s in seqs), -(-top // bs), -(-max(S, 1) // bs)) + 1
        if ahead:
            if Bb > self.rows_cap or width > self.width_cap:
                return None
            self.bt_host[:B] = 0
            tables = block_tables(seqs)
            self.bt_host[:B, : tables.shape[1]] = tables
            self.bt_buf[:B].copy_(self._staged(self.bt_host[:B]), non_blocking=True)
        else:
            self._ensure(Bb, width)
            self._load_rows(seqs, Bb, kv)
        sp, temps, top_ps, flags = self._sampling(seqs)
        U_dev = self._staged(self._uniforms(seqs, k, ahead)).to(dev, non_blocking=True)
        toks, lps = [], []
        for j in range(k):
            logits = self._decode(Bb, S)
            t, lp = self._draw(logits[:B], temps, top_ps, flags, U_dev[:, j])
            self.tok_buf[:B].copy_(t)
            toks.append(t)
            lps.append(lp)
        return paged_calls.Chunk.launched(seqs, sp, torch.stack(toks), torch.stack(lps))

    def _staged(self, a: np.ndarray) -> torch.Tensor:
        """``a`` as a host tensor a non-blocking copy can read: pinned (a private copy) on a GPU."""
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.pin_memory() if self.dev.type == "cuda" else t

    def _load_rows(self, seqs: list[Sequence], Bb: int, kv: np.ndarray) -> None:
        """The chunk's inputs into the device buffers: block tables, positions, last tokens, adapters."""
        self._load(Bb, block_tables(seqs), kv, torch.tensor([s.generated[-1] for s in seqs]), [s.key for s in seqs])

    def _load(self, Bb: int, tables: np.ndarray, pos: np.ndarray, toks: torch.Tensor, keys: list) -> None:
        """Rows ``[0, B)`` of the step's device buffers: each row's block table, position, token and adapter
        (``keys``); rows ``[B, Bb)`` are pads (block table of zeros, position 0: they write the scratch block)."""
        B, w = tables.shape
        bt = self.bt_host
        bt[:Bb] = 0
        bt[:B, :w] = tables
        p = np.zeros(Bb, dtype=np.int64)
        p[:B] = pos
        self.bt_buf[:Bb].copy_(torch.from_numpy(bt[:Bb]))
        self.pos_buf[:Bb].copy_(torch.from_numpy(p))
        self.tok_buf[:B].copy_(toks)
        if self.is_peft:
            ad = [self.slot_of.get(k, -1) for k in keys] + [-1] * (Bb - B)
            self.row_adapter[:Bb].copy_(torch.tensor(ad))
            for cols, m in self.masks.items():
                m[:Bb].copy_((self.row_adapter[:Bb, None] == self.col_index[cols][None, :]).to(self.dtype))

    def _uniforms(self, seqs: list[Sequence], k: int, ahead: int = 0) -> np.ndarray:
        return paged_calls.chunk_uniforms(seqs, k, self.host_rng, ahead)

    def _take(self, seqs: list[Sequence], sp: list, T: list[list[int]], L: list[list[float]], *,
              decoded: bool = True) -> bool:
        """Each call keeps its new tokens (``paged_calls.keep_tokens``); returns whether one finished."""
        return paged_calls.keep_tokens(seqs, sp, T, L, stop_set=self.stop_set, tok=self.tok, sched=self.sched,
                                       output=self._output, decoded=decoded)

    def _check_kernels(self) -> dict:
        fwd = self.fwd
        return {**super()._check_kernels(),
                **paged_kernels.check(self.dev, self.dtype, fwd.n_heads, fwd.n_kv, fwd.head_dim)}

    def _attention(self, li, qkv, cos, sin, B, S):
        f, fwd, pk = self.fused, self.fwd, paged_kernels
        kf, vf = self.kv[li]
        if f.get("paged_rope_attention") and S < pk.PAGED_LONG_KEYS and self.variant != "rows":
            # pk.PAGED_FUSED_ROPE: the two below as one (slower than the two kernels at long lengths;
            # benchmarks/kernel_sweep.py). Not for a prefill's token rows: a row reads keys that other rows of
            # its call write in the same launch, so every row's keys must be written before any row attends
            return pk.paged_rope_attention(qkv, cos, sin, kf, vf, self.slot_buf[:B], self.bt_buf[:B], self.len_buf[:B],
                                           fwd.n_heads, fwd.n_kv, fwd.head_dim, S, self.block_size, fwd.scale)
        rope = pk.rope_and_cache_paged if f.get("rope_and_cache_paged") else pk.rope_and_cache_paged_ref
        attend = pk.paged_attention if f.get("paged_attention") else pk.paged_attention_ref
        q = rope(qkv, cos, sin, kf, vf, self.slot_buf[:B], fwd.n_heads, fwd.n_kv, fwd.head_dim)
        o = attend(q, kf, vf, self.bt_buf[:B], self.len_buf[:B], S, self.block_size, fwd.scale)
        return o.reshape(B, fwd.n_heads * fwd.head_dim)

    def _decode_body(self, B: int, S: int) -> torch.Tensor:
        """Each row's slot (through its block table) and length from its position, then the step."""
        bs, pos = self.block_size, self.pos_buf[:B]
        self.slot_buf[:B].copy_(self.bt_buf[:B].gather(1, (pos // bs)[:, None]).squeeze(1).long() * bs + pos % bs)
        self.len_buf[:B].copy_(pos + 1)
        return self._layers(B, S)

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
* **The static engine's decode step** (``engines/decoder.py``, shared; what a step does on the device is in
  ``engines/paged_steps.py``): fused q/k/v and gate/up weights, LoRA adapters of one base
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

from masrl.engines import kv_pool, paged_calls
from masrl.engines.blocks import BlockPool
from masrl.engines.decode_weights import DecodeWeights
from masrl.engines.paged_prefill import PoolPrefill
from masrl.engines.paged_steps import PagedSteps
from masrl.engines.sampling import counter_uniforms
from masrl.engines.scheduler import Scheduler, Sequence
from masrl.errors import PromptError
from masrl.messages import GenOutput, GenRequest
from masrl.modeling.sizes import tensor_bytes


@dataclass
class _Job:
    """A weight change waiting for a step boundary (``at_boundary``)."""

    fn: Callable[[], None]
    error: BaseException | None = None
    done: bool = False


class PagedEngine(PagedSteps):
    joins_running_decode = True  # a second generate's calls join the running decode (the driver overlaps batches)
    swaps_between_steps = True  # at_boundary: a weight change between two steps, running calls going on

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

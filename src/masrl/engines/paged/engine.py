"""PagedEngine: continuous batching over a paged KV cache held to a memory budget.

Agent workloads are multi-turn and long-tailed: an episode's next call starts only when its last
returned, and a few long calls hold a whole one-shot batch up. Here a call is a ``Sequence``
(scheduler.py) and the engine runs steps, not batches:

* **Continuous batching.** Every step the scheduler either prefills waiting calls or advances every
  running call by one token. ``generate`` is safe to call from several threads at once: the calls
  of a second ``generate`` join the running decode at the next step boundary, and each caller
  returns as soon as *its* calls are done (one thread runs the steps; the others wait on a
  condition and take over when it leaves).
* **Paged KV under a budget.** Keys and values live in one pool of ``block_size``-slot blocks
  (blocks.py) sized from ``gpu_memory_utilization`` (the fraction of the device's memory,
  or of the host's on a CPU, the pool may take) or ``kv_blocks``. Memory grows with the tokens in
  use. When the pool is dry the newest call is pre-empted and recomputed later; a call is refused
  (an exception in its place, the others run) only if it could not fit the pool alone.
* **Shared prefixes.** A GRPO group's samples fork from its first: one prefill per group (full blocks
  shared, the partial last block copied, the logits reused). Full blocks are also cached by a
  chained hash of their tokens, so an episode's next turn reuses its earlier turns' blocks (the
  prompt of turn k+1 extends turn k token for token).
* **The device side is the model runner** (runner.py): fused q/k/v and gate/up weights, LoRA adapters of one base
  mixed in one batch, fused Triton kernels and CUDA graphs on a GPU (per batch bucket and length class;
  the graph reads the block tables from device buffers the host rewrites between replays). This class keeps
  the calls: their tokens, stop rules and results (calls.py), the threads and the weight changes between steps.

Numerics: prefill is the lean forward (as the trainer computes) or the decode step's token rows; decode is the
runner's step over the paged cache. Token ``t`` of a call with a seed uses ``counter_uniforms(seed)[t]`` whatever
step, batch or pre-emption it lands in, so results do not depend on what ran beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from masrl.engines.defaults import EngineDefaults
from masrl.engines.paged import blocks
from masrl.engines.paged import calls as paged_calls
from masrl.engines.paged.blocks import BlockPool
from masrl.engines.paged.calls import Sequence
from masrl.engines.paged.runner import ModelRunner, PagedOptions
from masrl.engines.paged.scheduler import Scheduler
from masrl.engines.sampling import counter_uniforms
from masrl.errors import PromptError
from masrl.messages import GenOutput, GenRequest


@dataclass
class _Job:
    """A weight change waiting for a step boundary (``at_boundary``)."""

    fn: Callable[[], None]
    error: BaseException | None = None
    done: bool = False


class PagedEngine(EngineDefaults):
    joins_running_decode = True  # a second generate's calls join the running decode (the driver overlaps batches)
    swaps_between_steps = True  # at_boundary: a weight change between two steps, running calls going on

    @staticmethod
    def option_names() -> list[str]:
        return PagedOptions.names()

    def __init__(self, model, tokenizer, stop_ids: list[int], *, device: str, seed: int = 0, **options):
        """``options``: the engine's settings (``PagedOptions``: a key it does not hold is an error)."""
        self.options = o = PagedOptions.of(options)
        self.model = model
        self.tok = tokenizer
        self.stop_set = set(int(s) for s in stop_ids)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.stop_set))
        # the engine's one stats object: the runner, the scheduler and the block pool count into it (they are
        # rebuilt after a release; it is not)
        self.stats: dict = {"peak_blocks": 0, "joined": 0, "swaps_mid_call": 0, "overlapped_chunks": 0}
        self.runner = ModelRunner(model, device=device, seed=seed, pad_id=pad_id, stats=self.stats, options=o)
        self.dev = self.runner.dev
        self.device = str(self.dev)
        self.is_peft = self.runner.is_peft
        self.overlap_chunks = self.dev.type == "cuda" if o.overlap_chunks is None else o.overlap_chunks
        self._inflight: paged_calls.Chunk | None = None  # a chunk on the device whose tokens are not taken yet
        self.block_size = o.block_size
        self.kv_blocks = blocks.pool_blocks(model, self.runner.dtype, self.dev, o.block_size, o.gpu_memory_utilization,
                                            o.kv_blocks)
        self.sync_every = o.sync_every
        self.host_rng = np.random.default_rng(seed)
        self.pool: BlockPool | None = None
        self.sched: Scheduler | None = None
        self._cv = threading.Condition()
        self._inbox: list[Sequence] = []
        self._stepping: int | None = None  # the thread running the steps
        self._boundary: list[_Job] = []  # at_boundary jobs waiting for the next step boundary
        self._taken_preemptions = 0  # the pre-emptions counted at the last take_counters

    # -- Engine interface ----------------------------------------------------------------------------
    def adapters(self) -> list[str]:
        return list(self.runner.adapters)

    def weights_updated(self, policies: list[str] | None = None) -> None:
        if self.pool is not None:
            self.pool.forget()  # cached blocks were computed with the old weights
            self.sched.epoch += 1  # and blocks of calls running now never join the cache
        self.runner.refresh()

    def stale_weights(self) -> list[str]:
        """What this engine samples from that still holds older weights than the model's (empty: it samples the live
        weights); the worker asks after every publish."""
        return self.runner.stale()

    def at_boundary(self, fn) -> None:
        """Run ``fn`` (a weight change) between two engine steps: at once when no step runs, else by
        the thread running the steps at its next step boundary; return when it has run. Calls
        running then go on with the new weights over the keys and values they have (AReaL's
        interruptible generation); their blocks never join the prefix cache."""
        with self._cv:
            if self._stepping is None:
                fn()
                return
            job = _Job(fn)
            self._boundary.append(job)
            self._cv.notify_all()
            while not job.done:
                if self._stepping is None:  # the runner left before reaching a boundary: run what waits
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
        return self.runner.memory()

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
            if self._stepping is not None or self._inbox:
                raise RuntimeError("PagedEngine.release while calls are running")
        self.runner.release()
        self.pool = self.sched = None
        self._inflight = None

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
            if self._stepping is not None:
                self.stats["joined"] += len(todo)
            self._inbox.extend(todo)
            self._cv.notify_all()
            while not all(paged_calls.settled(s) for s in todo):
                if self._stepping is None:
                    self._stepping = threading.get_ident()
                    try:
                        self._run_until(todo)
                    finally:
                        self._run_boundary()
                        self._stepping = None
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
                       call=paged_calls.Call(r, u, index, on_done))
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
            with self.runner.device_scope(), torch.inference_mode():
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
            logits = self.runner.prefill(step.seqs)
            for s in step.seqs:
                self.sched.registered(s)
            finished = self._sample(step.seqs, logits)
        else:
            finished = self._decode_chunk(step.seqs)
        return finished

    # -- sampling and decode chunks: the runner's device work, the calls' tokens kept here -------------------
    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> bool:
        """Each just-prefilled call's next token, from the prefill's logits."""
        r = self.runner
        sp, temps, top_ps, flags = r.sampling(seqs)
        u = torch.from_numpy(self._uniforms(seqs, 1)[:, 0]).to(self.dev)
        tokens, lps = r.draw(logits[: len(seqs)], temps, top_ps, flags, u)
        return self._take(seqs, sp, [[t] for t in tokens.tolist()], [[x] for x in lps.tolist()], decoded=False)

    def _decode_chunk(self, seqs: list[Sequence]) -> bool:
        """Up to ``sync_every`` decode steps for every running call, the sampled tokens kept on the
        device and read back once; a call that finishes inside the chunk rides along to its end (its
        extra tokens dropped; writes past its blocks land in the scratch block). With ``overlap_chunks``
        the tokens are taken at the next step, after the chunk that follows is queued. Returns whether a
        call finished."""
        k = max(1, min(self.sync_every, max(s.max_new - len(s.generated) for s in seqs)))
        chunk = self.runner.launch(seqs, k, lambda: self._uniforms(seqs, k))
        if self.overlap_chunks:
            self._inflight = chunk
            return False
        return self._take(seqs, chunk.sp, *chunk.results())

    def _take_inflight(self, follow: bool = False) -> bool:
        """Take the tokens of the chunk in flight; first, when ``follow`` and its calls can go on
        (``calls.continuation_steps``), queue the chunk that follows it from the device's state, so the
        device decodes while the host keeps tokens and tells callers."""
        c, self._inflight = self._inflight, None
        k = paged_calls.continuation_steps(c, self.sched.running, self.sched.pool, self.sync_every) if follow else 0
        if k:
            self._inflight = self.runner.launch(c.seqs, k, lambda: self._uniforms(c.seqs, k, c.k), ahead=c.k)
            if self._inflight is not None:
                self.stats["decodes"] += 1
                self.stats["overlapped_chunks"] += 1
        T, L = c.results()
        live = [i for i, s in enumerate(c.seqs) if s.finish is None and s.error is None]
        return self._take([c.seqs[i] for i in live], [c.sp[i] for i in live], [T[i] for i in live],
                          [L[i] for i in live])

    def _uniforms(self, seqs: list[Sequence], k: int, ahead: int = 0) -> np.ndarray:
        return paged_calls.chunk_uniforms(seqs, k, self.host_rng, ahead)

    def _take(self, seqs: list[Sequence], sp: list, T: list[list[int]], L: list[list[float]], *,
              decoded: bool = True) -> bool:
        """Each call keeps its new tokens (``calls.keep_tokens``); returns whether one finished."""
        return paged_calls.keep_tokens(seqs, sp, T, L, stop_set=self.stop_set, tok=self.tok, sched=self.sched,
                                       output=self._output, decoded=decoded)

    # -- the pool ----------------------------------------------------------------------------------------
    def _build(self) -> None:
        """The runner's weights and pool, and the scheduler, once: under the engine's lock, since several callers
        may arrive at a fresh engine at once (one pool, not two; none sees a pool whose cache is not there)."""
        with self._cv:
            self.runner.build(self.kv_blocks)
            if self.pool is not None:
                return
            self.sched = Scheduler(BlockPool(self.kv_blocks, self.block_size, stats=self.stats),
                                   max_seqs=self.options.max_batch_size, prefill_tokens=self.options.prefill_tokens,
                                   stats=self.stats)
            self.pool = self.sched.pool

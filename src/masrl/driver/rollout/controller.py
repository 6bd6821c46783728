"""Controller: runs workflows concurrently, scores them, and routes rewards to workers by call_id.

The controller never holds tensors: it sees traces (text, parsed output, call ids) and hands
each worker only ``{call_id: reward}`` for the calls that worker served.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from typing import Callable

from masrl.agents import AgentSpec
from masrl.config import RolloutConfig
from masrl.data.tasks import Task
from masrl.driver.rollout.batcher import Batcher
from masrl.driver.rollout.context import Branch, WorkflowContext
from masrl.errors import InfraError, WorkflowBug
from masrl.messages import GenCall
from masrl.rewards import combine_all
from masrl.seeding import stable_seed
from masrl.trace import Trace, new_id
from masrl.worker.interface import PolicyHost
from masrl.workflows.base import Hooks, Workflow, hooks_of


class Controller:
    def __init__(self, workflow: Workflow, agents: dict[str, AgentSpec], workers: list[PolicyHost], batchers: list[Batcher],
                 allocators: list, settings: RolloutConfig, tools: dict[str, Callable] | None = None,
                 hooks: Hooks | None = None):
        self.workflow = workflow
        self.hooks = hooks or hooks_of(workflow)  # the plan's, where a run built it
        self.agents = agents
        self.workers = workers
        self.batchers = batchers
        self.allocators = allocators
        self.settings = settings
        self.tools = tools or {}
        self.open_traces: dict[str, Trace] = {}  # episodes running now (what a stop must drop)
        self._held: asyncio.Event | None = None  # set while training_held; its end releases waiting calls
        self._quiet: asyncio.Event | None = None  # set when the last training call in flight returns
        self._training_calls = 0
        self.worker_of: dict[str, int] = {}
        for i, w in enumerate(workers):
            for p in w.policy_names:
                self.worker_of[p] = i

    async def submit(self, agent: str, gen: GenCall):
        """One call to the batcher of the host serving ``gen.policy`` (what a context's ``call`` ends in).
        A training call waits while training is held (``training_held``)."""
        if not gen.record:
            return await self.batchers[self.worker_of[gen.policy]].submit(gen)
        await self.admit()  # again: a hold may have begun since the context's own wait
        self._training_calls += 1
        try:
            return await self.batchers[self.worker_of[gen.policy]].submit(gen)
        finally:
            self._training_calls -= 1
            if not self._training_calls and self._quiet is not None:
                self._quiet.set()

    async def admit(self) -> None:
        """Wait while training is held (a training context awaits this before its call's timeout starts)."""
        while self._held is not None:
            await self._held.wait()

    @contextlib.asynccontextmanager
    async def training_held(self):
        """A block in which no training call samples: those already submitted finish first (on the
        weights that were in place when they were sent), new ones wait until the block ends. The
        evaluation runs inside one, so that with asynchronous rollouts no training call samples the
        weights an evaluation swaps in (a policy's EMA) or competes with it."""
        if self._held is not None:  # nested: the outer block holds already
            yield
            return
        self._held = asyncio.Event()
        try:
            while self._training_calls:
                self._quiet = asyncio.Event()
                await self._quiet.wait()
            yield
        finally:
            held, self._held, self._quiet = self._held, None, None
            held.set()

    async def run_episode(self, task: Task, sample_idx: int, train: bool, temperature: float | None, sem,
                          seed: int | None = None, branch: Branch | None = None) -> Trace:
        """One workflow run of ``task`` (sample ``sample_idx``) under ``sem``, scored; an infrastructure
        failure is recorded on the trace, a bug raises ``WorkflowBug``."""
        trace = Trace(trace_id=new_id("trace"), task_id=task.id, sample_idx=sample_idx)
        ctx = WorkflowContext(trace, self.agents, self.submit, admit=self.admit if train else None,
                              train=train, call_timeout_s=self.settings.call_timeout_s,
                              tools=self.tools, temperature=temperature,
                              seed=None if seed is None else stable_seed(seed, task.id, sample_idx), branch=branch)
        async with sem:
            self.open_traces[trace.trace_id] = trace
            t0 = time.perf_counter()
            try:
                await asyncio.wait_for(self.workflow.run(task, ctx), self.settings.trace_timeout_s)
                trace.metrics.update(self.workflow.score(trace, task))
            except asyncio.TimeoutError:
                trace.error = f"trace timed out after {self.settings.trace_timeout_s:g}s"
            except InfraError as exc:  # infrastructure (ToolError included): dropped from training and counted
                trace.error = str(exc)
            except Exception as exc:  # a bug in a workflow, parser or scorer: stop the run, say where
                tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                raise WorkflowBug(f"task {task.id} (sample {sample_idx}) of workflow "
                                  f"'{getattr(self.workflow, 'name', type(self.workflow).__name__)}' raised:\n{tb}") from exc
            finally:
                self.open_traces.pop(trace.trace_id, None)
            trace.duration_s = time.perf_counter() - t0
        return trace

    async def run_branch(self, task: Task, trace: Trace, at: int, alt: int, sem, seed: int | None) -> Trace:
        """``trace`` re-run from its call ``at`` with alternative ``alt`` of that call (nothing trains)."""
        return await self.run_episode(task, trace.sample_idx, False, None, sem, seed,
                                   branch=Branch(tuple(trace.calls), at, alt))

    async def rollout(self, tasks: list[Task], samples_per_task: int, *, train: bool,
                      temperature: float | None = None, on_done: Callable[[Trace], None] | None = None,
                      seed: int | None = None) -> list[Trace]:
        """Run every task ``samples_per_task`` times. ``seed``: sampling derives from it, the task,
        the sample, the agent and the turn, so the same seed gives the same tokens however the
        calls are batched (None: the engines' own generators)."""
        sem = asyncio.Semaphore(self.settings.max_in_flight)
        jobs = [asyncio.ensure_future(self.run_episode(t, k, train, temperature, sem, seed))
                for t in tasks for k in range(samples_per_task)]
        traces = []
        try:
            for fut in asyncio.as_completed(jobs):
                tr = await fut
                traces.append(tr)
                if on_done is not None:
                    on_done(tr)
        except BaseException:  # a bug (or Ctrl-C): stop every other workflow of the rollout too
            for j in jobs:
                j.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
        order = {(t.id, k): i for i, t in enumerate(tasks) for k in range(samples_per_task)}
        traces.sort(key=lambda tr: order[(tr.task_id, tr.sample_idx)])
        return traces

    def drop_traces(self, traces: list[Trace]) -> None:
        """Take these traces' calls out of the next update (each host forgets its own)."""
        self.drop_calls([c for tr in traces for c in tr.calls])

    def drop_calls(self, calls: list) -> None:
        """Forget these calls (trace call records) at the hosts that served them."""
        drops: dict[int, list[str]] = {}
        for c in calls:
            drops.setdefault(self.worker_of[c.policy], []).append(c.call_id)
        for i, ids in drops.items():
            self.workers[i].drop(ids)

    async def score(self, traces: list[Trace], tasks: dict[str, Task]) -> dict[int, dict[str, float]]:
        """Every live trace's calls scored by the reward allocators (the one scoring path of training and
        evaluation): off the event loop, every trace's at once, under ``rollout.reward_timeout_s``. A trace whose
        scoring failed (a judge that failed; an allocator that hung, raised or gave NaN) is failed and keeps no
        reward. Returns each scored trace's (by ``id``) reward per call id."""
        live = [tr for tr in traces if not tr.failed]
        results = await asyncio.to_thread(combine_all, [(tr, tasks[tr.task_id]) for tr in live], self.allocators,
                                          self.settings.reward_timeout_s)
        out = {}
        for tr, totals in zip(live, results):
            if isinstance(totals, InfraError):
                tr.error = f"reward: {totals}"
                for c in tr.calls:
                    c.reward, c.reward_parts = None, {}
            else:
                out[id(tr)] = totals
        return out

    async def assign_rewards(self, traces: list[Trace], tasks: dict[str, Task]) -> None:
        """Score calls (``score``) and route rewards (or drops, for failed traces) to the worker of each call."""
        per_worker: dict[int, dict[str, float]] = {}
        drops: dict[int, list[str]] = {}
        scored = await self.score(traces, tasks)
        for tr in traces:
            if tr.failed:
                for c in tr.calls:
                    drops.setdefault(self.worker_of[c.policy], []).append(c.call_id)
                continue
            totals = scored[id(tr)]
            for c in tr.calls:
                if c.call_id in totals:
                    per_worker.setdefault(self.worker_of[c.policy], {})[c.call_id] = totals[c.call_id]
        for i, ids in drops.items():
            self.workers[i].drop(ids)
        for i, rewards in per_worker.items():
            self.workers[i].commit_rewards(rewards)

    def update(self, traces: list[Trace] | None = None, *, keep_pending: bool = False) -> dict[str, dict[str, float]]:
        """Train every worker; with ``traces``, write the advantage each call was trained with onto it.
        A host in this process updates holding its device's compute lock, so an engine batch never
        reads weights an optimizer step is writing, unless its engine samples from a copy of the
        weights (``overlaps_update``): then batches run during the update on the old weights."""
        metrics: dict[str, dict[str, float]] = {}
        adv: dict[str, float] = {}
        shared = self._shared_calls()
        for w in self.workers:  # offload_weights: all out first, then each in for its own update only
            w.park()

        def one(w):
            lock = self.batchers[self.workers.index(w)].compute_lock
            if lock is None or w.overlaps_update:  # its engine reads a copy: it keeps sampling meanwhile
                lock = contextlib.nullcontext()
            with lock:
                return (w.train_step({p: shared[p] for p in w.policy_names if p in shared}, keep_pending=keep_pending),
                        w.advantages())

        if len(self.workers) > 1 and all(w.separate_process for w in self.workers):
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(len(self.workers)) as pool:  # actors update at once, each on its own devices
                results = list(pool.map(one, self.workers))
        else:  # one process: one update at a time
            results = [one(w) for w in self.workers]
        for m, a in results:
            metrics.update(m)
            adv.update(a)
        for tr in traces or []:
            for c in tr.calls:
                c.advantage = adv.get(c.call_id)
        return metrics

    def policy_kl(self, max_calls: int) -> dict[str, float]:
        """``KL(A || B)`` for every ordered pair of trainable policies on one tokenizer, estimated on up
        to ``max_calls`` of A's calls this step: mean over their tokens of log pi_A - log pi_B (the
        k1 estimator; tokens sampled from A). Run before the update, on the weights that sampled."""
        trainable = [(p, w) for w in self.workers for p in w.trainable_names]
        out: dict[str, float] = {}
        for a, wa in trainable:
            mine = wa.rewarded([a])[:max_calls]
            if not mine:
                continue
            own = wa.score(a, mine)
            for b, wb in trainable:
                ta, tb = wa.get_tokenizer(), wb.get_tokenizer()
                if b == a or (ta is not tb and ta.get_vocab() != tb.get_vocab()):
                    continue
                other = wb.score(b, mine)
                diffs = [x - y for xs, ys in zip(own, other) for x, y in zip(xs, ys)]
                out[f"{a}->{b}"] = sum(diffs) / max(1, len(diffs))
        return out

    def _shared_calls(self) -> dict:
        """For each policy with ``share_from``: copies of its sources' rewarded calls (a seeded
        share of them), marked with the importance-weight cap; empty when no policy shares."""
        import dataclasses
        import random

        out: dict[str, list] = {}
        for w in self.workers:
            for name, spec in w.specs.items():
                if not spec.share_from or name not in w.trainable_names:
                    continue
                rng = random.Random(f"share-{name}-{w.get_step()}")
                picked = []
                for src, share in spec.share_from.items():
                    for s in self.workers[self.worker_of[src]].rewarded([src]):
                        if share >= 1.0 or rng.random() < share:
                            picked.append(dataclasses.replace(
                                s, call_id=f"{s.call_id}@{name}", policy=name, is_cap=spec.share_is_cap,
                                key={**s.key, "shared_from": src}, advantage=0.0, token_adv=None, returns=None,
                                old_values=None, ref_logprobs=None, old_logprobs=None, train_reward=None))
                out[name] = picked
        return out

    async def aclose(self) -> None:
        for b in self.batchers:
            await b.aclose()
        for alloc in self.allocators:  # reward plugins' worker processes
            close_alloc = getattr(alloc, "close", None)
            if close_alloc is not None:
                close_alloc()
        close = self.hooks.aclose  # a workflow that serves (the external one's gateway)
        if close is not None:
            await close()

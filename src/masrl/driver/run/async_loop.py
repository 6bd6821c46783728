"""Asynchronous rollouts (``rollout.mode: async``): workflows keep running while policies update.

The synchronous step generates every trace of a step, then updates, then generates again, so the
slowest trace holds every update back and no trace runs during an update. Here episodes run
continuously, ``rollout.tasks_per_step`` tasks ahead of the updates:

- a task's group is complete when all its samples have finished; its rewards are assigned when
  an update takes it (never for a group half done, so a GRPO group is always whole, and an update
  trains the groups it took and no others);
- once ``tasks_per_step`` complete groups are waiting, the update starts in a thread and the
  event loop keeps launching and serving episodes meanwhile. With ``rollout.overlap_update`` (on by
  default on CUDA) the engine samples from its own copy of the weights through the whole update and
  the new weights are copied in between two engine batches when it ends; without it, the engine and
  the optimizer of one device take turns (the batchers' compute lock, held by the update), so
  in-flight generations finish their engine batch on the old weights and wait; hosts on other
  devices (Ray) generate through the whole update;
- every call records the version of the weights that sampled it; an update reports its calls'
  staleness and drops those past ``policies.X.max_staleness``, which also bounds how far episodes
  run ahead of the updates (as AReaL's rollout controller does), so few calls are sampled only to
  be dropped; ``algorithm.tis_cap`` and
  ``algorithm.mis`` correct with the recomputed logprobs;
- an update trains on its groups' calls and keeps the calls of episodes still running
  (``train_step(keep_pending=True)``); a checkpoint follows an update, so a kill loses at most the
  episodes in flight, and ``--resume`` starts the task stream after the checkpoint's step.

Sampling seeds follow the task's place in the stream and the sample, as in the synchronous loop;
which weights sample which call depends on timing, so async runs do not repeat each other exactly.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from masrl.config import RolloutConfig
from masrl.data.tasks import Task
from masrl.driver import faults
from masrl.driver.observe.metrics import summarize_traces
from masrl.driver.rollout.controller import Controller
from masrl.driver.run.stream import TaskStream
from masrl.seeding import stable_seed
from masrl.trace import Trace


@dataclass
class AsyncStep:
    """One update of the asynchronous loop: its metrics record and the traces it trained on."""

    record: dict
    traces: list[Trace]


class AsyncRollouts:
    """Keeps episodes running and hands out complete groups, ``tasks_per_step`` at a time.

    What it needs of the run is in its arguments: the controller (to run episodes, assign rewards,
    drop calls and update), the task stream, the rollout settings, the run's seed, the staleness
    bound, and the number of updates already made (a resumed run restarts after its checkpoint).
    """

    def __init__(self, controller: Controller, stream: TaskStream, settings: RolloutConfig, *, seed: int,
                 max_staleness: int | None, updates: int = 0):
        self.ctl, self.stream, self.r, self.seed = controller, stream, settings, seed
        self.max_staleness = max_staleness
        self.updates = updates
        self.next_task = updates * settings.tasks_per_step
        self.sem = asyncio.Semaphore(settings.max_in_flight)
        self.running: dict[asyncio.Task, int] = {}
        self.groups: dict[int, list[Trace]] = {}
        self.ready: list[tuple[Task, list[Trace]]] = []
        self.started = time.perf_counter()

    def fill(self) -> None:
        """Launch tasks until ``2 x tasks_per_step`` are in flight or waiting (one step ahead); with
        ``max_staleness`` s, no further than the task stream's first ``(updates + s + 1) x
        tasks_per_step`` tasks, so that a call is not sampled only to be dropped as too old."""
        ahead = len(set(self.running.values())) + len(self.ready)
        limit = None if self.max_staleness is None else (self.updates + self.max_staleness + 1) * self.r.tasks_per_step
        while ahead < 2 * self.r.tasks_per_step and (limit is None or self.next_task < limit):
            k = self.next_task
            self.next_task += 1
            task = self.stream[k]
            self.groups[k] = []
            seed = stable_seed(self.seed, "train", "async", k)
            for s in range(self.r.samples_per_task):
                job = asyncio.ensure_future(self.ctl.run_episode(task, s, True, None, self.sem, seed))
                self.running[job] = k
            ahead += 1

    async def next_groups(self) -> list[tuple[Task, list[Trace]]]:
        """Wait until ``tasks_per_step`` groups are complete; returns them with their rewards assigned
        (groups completed beyond those wait, unrewarded, for the next update)."""
        while len(self.ready) < self.r.tasks_per_step:
            self.fill()
            if not self.running:  # cannot happen: the staleness bound always admits this update's tasks
                raise RuntimeError(f"async rollouts: {len(self.ready)} groups ready, none running, "
                                   f"{self.r.tasks_per_step} needed")
            done, _ = await asyncio.wait(list(self.running), return_when=asyncio.FIRST_COMPLETED)
            for job in done:
                k = self.running.pop(job)
                trace = job.result()  # a workflow bug raises here and stops the run
                self.groups[k].append(trace)
                if len(self.groups[k]) == self.r.samples_per_task:
                    self.ready.append((self.stream[k], self.groups.pop(k)))
            faults.point(f"rollout:{self.updates + 1}")
        batch, self.ready = self.ready[: self.r.tasks_per_step], self.ready[self.r.tasks_per_step:]
        for task, traces in batch:  # rewards now, so that the update trains this batch's groups and no others
            await self.ctl.assign_rewards(traces, {task.id: task})
        # calls no reward paid would wait for ever among the pending ones (keep_pending): they go now
        unpaid = [c for _, traces in batch for t in traces if not t.failed for c in t.calls if c.reward is None]
        if unpaid:
            self.ctl.drop_calls(unpaid)
        return batch

    async def step(self) -> AsyncStep:
        """One update: the next complete groups, then the update in a thread while episodes keep running."""
        t0 = time.perf_counter()
        groups = await self.next_groups()
        traces = [t for _, g in groups for t in g]
        t1 = time.perf_counter()
        faults.point(f"update:{self.updates + 1}")
        self.fill()  # the next step's episodes run while this update does
        running = len(self.running)
        served = sum(b.stats.items for b in self.ctl.batchers)
        policies = await asyncio.to_thread(self.ctl.update, traces, keep_pending=True)
        t2 = time.perf_counter()
        served = sum(b.stats.items for b in self.ctl.batchers) - served
        self.updates += 1
        record = {"step": self.updates, "rollout_s": t1 - t0, "update_s": t2 - t1, "rollout": summarize_traces(traces),
                  "policies": policies, "async": {"episodes_running_at_update": running, "calls_during_update": served,
                                                  "versions": sorted({c.policy_version for t in traces for c in t.calls})}}
        return AsyncStep(record, traces)

    async def stop(self) -> None:
        """Cancel the episodes still running; their calls leave the hosts' buffers."""
        unfinished = list(self.ctl.open_traces.values())  # before the cancel: a cancelled episode leaves that list
        for job in self.running:
            job.cancel()
        left = await asyncio.gather(*self.running, return_exceptions=True)
        self.running.clear()
        for b in self.ctl.batchers:  # a batch that was running finishes; its cancelled calls are forgotten
            await b.drain()
        unfinished += [t for g in self.groups.values() for t in g] + [t for _, g in self.ready for t in g]
        unfinished += [t for t in left if not isinstance(t, BaseException)]
        self.ctl.drop_traces(unfinished)
        self.groups.clear()
        self.ready.clear()

"""Which tasks each step trains on: the run's task stream, the same after a resume, and dynamic sampling.

Dynamic sampling (DAPO, Yu et al., 2025): tasks that teach nothing leave the update and are replaced.

A GRPO group whose calls all earned the same reward has zero advantage: its calls add no gradient
but still count in the batch. Late in the math team's H200 runs 40-87% of sequences were such. A
task is *flat* when every group its calls belong to (``algorithm.group_key``) has equal rewards;
with ``rollout.dynamic_sampling: N`` its calls are dropped from the update and fresh tasks are
rolled out in its place, up to N extra rollouts a step, until the step has ``tasks_per_step`` tasks
that teach something. Departure from DAPO: the filter is per task over every agent's groups, since
one task's trace holds several agents' calls.
"""

from __future__ import annotations

import random

from masrl.data.tasks import Task
from masrl.trace import Trace


def step_tasks(tasks: list[Task], step: int, n: int, seed: int) -> list[Task]:
    """Epochs over a seeded shuffle: step k takes the next n tasks (deterministic, so resume-safe)."""
    order = list(range(len(tasks)))
    epoch = (step * n) // len(tasks)
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    start = (step * n) % len(tasks)
    picked = [order[(start + i) % len(order)] for i in range(min(n, len(tasks)))]
    return [tasks[i] for i in picked]


class TaskStream:
    """The k-th task of the run: the synchronous loop's order, step after step (the async loop
    reads tasks one at a time)."""

    def __init__(self, tasks: list[Task], per_step: int, seed: int):
        self.tasks, self.per_step, self.seed = tasks, per_step, seed
        self._cache: dict[int, list[Task]] = {}

    def __getitem__(self, k: int) -> Task:
        step, i = divmod(k, self.per_step)
        if step not in self._cache:
            self._cache = {step: step_tasks(self.tasks, step, self.per_step, self.seed)}
        return self._cache[step][i % len(self._cache[step])]


def group_of(trace: Trace, call, key: list[str]) -> tuple:
    fields = {"task_id": trace.task_id, "sample_idx": trace.sample_idx, "agent": call.agent, "turn": call.turn,
              "policy": call.policy, "state": call.state}
    return tuple(fields[k] for k in key)


def flat_tasks(traces: list[Trace], key: list[str]) -> set[str]:
    """Tasks all of whose rewarded calls sit in groups of equal rewards (failed traces ignored)."""
    groups: dict[tuple, list[float]] = {}
    for t in traces:
        for c in t.calls:
            if not t.failed and c.reward is not None:
                groups.setdefault(group_of(t, c, key), []).append(c.reward)
    varied = {g for g, rs in groups.items() if max(rs) - min(rs) > 1e-9}
    teaching = {t.task_id for t in traces if not t.failed
                for c in t.calls if c.reward is not None and group_of(t, c, key) in varied}
    return {t.task_id for t in traces if not t.failed} - teaching


def fresh_tasks(pool: list[Task], used: set[str], n: int, seed: int) -> list[Task]:
    """``n`` tasks of ``pool`` not in ``used``, in a seeded order (the same for the same seed)."""
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    return [pool[i] for i in order if pool[i].id not in used][:n]

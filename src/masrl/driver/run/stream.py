"""The run's task stream: which training tasks each step takes, the same after a resume."""

from __future__ import annotations

import random

from masrl.data.tasks import Task


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

"""``train.time_limit_s``: end the training steps before a wall-clock budget runs out.

A run that an outside limit kills (a job scheduler, ``timeout``) loses everything since its last
checkpoint and never scores the held-out set. With a budget the run stops itself after the step
whose successor would end past it (predicted from the mean step so far), and then ends as a finished
run does: a checkpoint, the held-out evaluation, the best-by-validation weights scored.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TimeBudget:
    def __init__(self, limit_s: float | None, clock: Callable[[], float] = time.monotonic):
        self.limit_s = limit_s
        self.clock = clock
        self.start = self.steps_start = clock()  # the run's start: the evaluation before training counts
        self.steps = 0

    def steps_begin(self) -> None:
        """The first step starts now: the mean step is measured from here."""
        self.steps_start = self.clock()

    def over(self, step: int, last: int) -> str | None:
        """After a step: why the run stops here, or None (no budget, the last step, or time for one more)."""
        self.steps += 1
        if self.limit_s is None or step >= last:
            return None
        now = self.clock()
        mean = (now - self.steps_start) / self.steps
        if now - self.start + mean <= self.limit_s:
            return None
        return (f"train.time_limit_s={self.limit_s:g}: stopped after step {step} of {last} ({now - self.start:.0f} s "
                f"spent, {mean:.0f} s a step); the checkpoint and the held-out evaluation follow")

"""Reward allocators that misbehave, for the tests of user code under a time limit (``type: "bad_rewards:Hang"``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from masrl.trace import RewardAssignment


class _Base:
    def __init__(self, weight: float = 1.0, **options):
        self.weight, self.options = weight, options


class Hang(_Base):
    """Sleeps past any limit (a stuck judge): on every trace with ``every: true``, else on even samples."""
    name = "hang"

    def allocate(self, trace, task):
        if self.options.get("every", False) or trace.sample_idx % 2 == 0:
            time.sleep(3600)
        return [RewardAssignment(c.call_id, 1.0, self.name) for c in trace.calls]


class NotANumber(_Base):
    name = "nan"

    def allocate(self, trace, task):
        return [RewardAssignment(c.call_id, float("nan"), self.name) for c in trace.calls]


class Raises(_Base):
    name = "raises"

    def allocate(self, trace, task):
        raise KeyError("a bug in the user's reward")


def _first_sample(trace) -> bool:
    return trace.sample_idx == 0


class Backtrack(_Base):
    """A regex that backtracks for minutes inside C, holding the GIL (no thread can even time it out)."""
    name = "backtrack"

    def allocate(self, trace, task):
        import re

        if _first_sample(trace):
            re.match(r"(a+)+$", "a" * 40 + "b")
        return [RewardAssignment(c.call_id, 1.0, self.name) for c in trace.calls]


class BusyLoop(_Base):
    name = "busy"

    def allocate(self, trace, task):
        while _first_sample(trace):
            pass
        return [RewardAssignment(c.call_id, 1.0, self.name) for c in trace.calls]


class Endless(_Base):
    """Allocates without end (an endless generator collected into a list)."""
    name = "endless"

    def allocate(self, trace, task):
        if _first_sample(trace):
            grow = []
            while True:
                grow.append(bytearray(2**20))
        return [RewardAssignment(c.call_id, 1.0, self.name) for c in trace.calls]


class Huge(_Base):
    """An int too big for a float."""
    name = "huge"

    def allocate(self, trace, task):
        return [RewardAssignment(c.call_id, 10**400 if _first_sample(trace) else 1, self.name) for c in trace.calls]


class NumpyScalars(_Base):
    name = "numpy"

    def allocate(self, trace, task):
        import numpy as np

        kinds = (np.float32(0.5), np.int64(1), np.float64(0.25))
        return [RewardAssignment(c.call_id, kinds[i % 3], self.name) for i, c in enumerate(trace.calls)]


@dataclass
class DataclassRaises:
    """The shipped example's form: a dataclass (unhashable: eq without frozen) whose allocate raises."""
    weight: float = 1.0
    name: str = "dc_raises"

    def allocate(self, trace, task):
        raise ValueError("a bug in a dataclass reward")

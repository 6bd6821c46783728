"""Reward allocators that misbehave, for the tests of user code under a time limit (``type: "bad_rewards:Hang"``)."""

from __future__ import annotations

import time

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

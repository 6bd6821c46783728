"""Counterfactual reward: each call's outcome minus the mean outcome with that call resampled
(``call.counterfactual``, set by ``driver.counterfactual`` when ``rollout.counterfactual`` is on)."""

from __future__ import annotations

from dataclasses import dataclass

from masrl.data.tasks import Task
from masrl.trace import RewardAssignment, Trace


@dataclass
class CounterfactualReward:
    weight: float = 1.0
    name: str = "counterfactual"

    def allocate(self, trace: Trace, task: Task) -> list[RewardAssignment]:
        return [RewardAssignment(c.call_id, self.weight * c.counterfactual, self.name)
                for c in trace.calls if c.counterfactual is not None]

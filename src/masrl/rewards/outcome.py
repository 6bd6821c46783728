"""Outcome reward: the trace's final score, shared by every call in it."""

from __future__ import annotations

from dataclasses import dataclass

from masrl.data.tasks import Task
from masrl.trace import RewardAssignment, Trace


@dataclass
class OutcomeReward:
    weight: float = 1.0
    metric: str = "outcome"  # key in trace.metrics set by the workflow's scorer
    name: str = "outcome"

    def allocate(self, trace: Trace, task: Task) -> list[RewardAssignment]:
        value = float(trace.metrics.get(self.metric, 0.0))
        return [RewardAssignment(c.call_id, self.weight * value, self.name) for c in trace.calls]

"""Outcome reward: the trace's final score, given in full to every call in it, or (``split``)
divided evenly among them, so a trace's calls earn the outcome once between them."""

from __future__ import annotations

from dataclasses import dataclass

from masrl.data.tasks import Task
from masrl.trace import RewardAssignment, Trace


@dataclass
class OutcomeReward:
    weight: float = 1.0
    metric: str = "outcome"  # key in trace.metrics set by the workflow's scorer
    name: str = "outcome"
    split: bool = False

    def allocate(self, trace: Trace, task: Task) -> list[RewardAssignment]:
        if self.metric not in trace.metrics:
            raise KeyError(f"the outcome reward reads trace.metrics['{self.metric}'], but the workflow's score() "
                           f"returned {sorted(trace.metrics) or 'nothing'} for task {trace.task_id}; return "
                           f"{{'{self.metric}': ...}} from score() (or set the reward's options.metric)")
        value = float(trace.metrics[self.metric])
        if self.split and trace.calls:
            value /= len(trace.calls)
        return [RewardAssignment(c.call_id, self.weight * value, self.name) for c in trace.calls]

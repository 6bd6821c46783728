"""Credit reward: what the workflow itself says each call earned (``call.credit``).

For credit that only the workflow can work out: the change in a program's pass rate that a
coder's turn made, or that a reflection made in the next turn; the F1 gain of an answer after a
searcher's query. Calls the workflow left without credit get nothing from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from masrl.data.tasks import Task
from masrl.trace import RewardAssignment, Trace


@dataclass
class CreditReward:
    weight: float = 1.0
    name: str = "credit"

    def allocate(self, trace: Trace, task: Task) -> list[RewardAssignment]:
        return [RewardAssignment(c.call_id, self.weight * float(c.credit), self.name)
                for c in trace.calls if c.credit is not None]

"""Format reward: each call's own parser score (partial credit in [0, 1]), weighted per agent.

An output with no usable tag at all (score 0) additionally loses ``penalty``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from masrl.data.tasks import Task
from masrl.trace import RewardAssignment, Trace


@dataclass
class FormatReward:
    weight: float = 0.5
    per_agent: dict[str, float] = field(default_factory=dict)
    penalty: float = 0.0
    name: str = "format"

    def allocate(self, trace: Trace, task: Task) -> list[RewardAssignment]:
        out = []
        for c in trace.calls:
            w = self.per_agent.get(c.agent, self.weight)
            r = w * c.format_score - (self.penalty if c.format_score <= 0 else 0.0)
            out.append(RewardAssignment(c.call_id, r, self.name))
        return out

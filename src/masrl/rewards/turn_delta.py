"""Per-turn delta reward: a call earns how much it improved the trace's running score.

A workflow marks a call's quality with ``call.turn_score`` (e.g. whether the answer stated at
that turn is correct). Each scored call gets ``weight * (score_t - score_prev)``, where prev is
the last scored call before it in the trace (0 for the first). Unscored calls get nothing.
Works for any workflow that sets turn scores.
"""

from __future__ import annotations

from dataclasses import dataclass

from masrl.data.tasks import Task
from masrl.trace import RewardAssignment, Trace


def turn_deltas(scores: list[float], baseline: float = 0.0) -> list[float]:
    out, prev = [], baseline
    for s in scores:
        out.append(s - prev)
        prev = s
    return out


@dataclass
class TurnDeltaReward:
    weight: float = 1.0
    baseline: float = 0.0
    name: str = "turn_delta"

    def allocate(self, trace: Trace, task: Task) -> list[RewardAssignment]:
        scored = [c for c in trace.calls if c.turn_score is not None]
        deltas = turn_deltas([float(c.turn_score) for c in scored], self.baseline)
        return [RewardAssignment(c.call_id, self.weight * d, self.name) for c, d in zip(scored, deltas)]

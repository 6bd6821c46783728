"""A reward written outside masrl: pay short answers a little.

Use it from a config (with this folder on PYTHONPATH):

  rewards:
    - {type: outcome}
    - {type: "custom_reward:BrevityReward", weight: 0.1, options: {budget: 32}}

An allocator is any object with ``allocate(trace, task) -> list[RewardAssignment]``; the factory
named in ``type`` is called with ``weight=`` and the ``options``.
"""

from __future__ import annotations

from dataclasses import dataclass

from masrl.trace import RewardAssignment


@dataclass
class BrevityReward:
    weight: float = 0.1
    budget: int = 32  # completions at or under this many tokens get the full reward
    name: str = "brevity"

    def allocate(self, trace, task):
        out = []
        for call in trace.calls:
            over = max(0, call.n_completion_tokens - self.budget)
            out.append(RewardAssignment(call.call_id, self.weight * max(0.0, 1.0 - over / self.budget), self.name))
        return out

"""A reward both sides of bench_verl.py compute alike when the model has random weights (row 1: the step's cost,
not its learning): 1 or 0 by a hash of the reply's text, so about half of each group earns 1 and every group has a
non-zero advantage (an all-zero reward would let either side skip its update). verl reads ``compute_score``
(``custom_reward_function.path`` this file); masrl ``CoinReward`` (``rewards=[{type: "verl_coin:CoinReward"}]``,
with benchmarks/ on the path).
"""

from __future__ import annotations

import hashlib
from typing import Any


def coin(text: str) -> float:
    return float(hashlib.sha256(text.encode("utf-8", "replace")).digest()[0] & 1)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **_: Any) -> float:
    return coin(solution_str)


class CoinReward:  # no dataclass: verl loads this file by path, outside sys.modules, where dataclasses fail
    name = "coin"

    def __init__(self, weight: float = 1.0):
        self.weight = weight

    def allocate(self, trace, task) -> list:
        from masrl.trace import RewardAssignment

        return [RewardAssignment(c.call_id, self.weight * coin(c.completion), self.name) for c in trace.calls]

"""RewardAllocator protocol and the reward combination step."""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from masrl.data.tasks import Task
from masrl.trace import RewardAssignment, Trace


class RewardAllocator(Protocol):
    name: str

    def allocate(self, trace: Trace, task: Task) -> list[RewardAssignment]: ...


def combine(trace: Trace, task: Task, allocators: list[RewardAllocator]) -> dict[str, float]:
    """Run every allocator, sum per call, and write ``reward`` / ``reward_parts`` onto the calls.

    Returns ``{call_id: total reward}`` for the trainable calls of the trace.
    """
    parts: dict[str, dict[str, float]] = defaultdict(dict)
    known = {c.call_id for c in trace.calls}
    for alloc in allocators:
        for a in alloc.allocate(trace, task):
            if a.call_id not in known:
                raise ValueError(f"reward allocator '{alloc.name}' assigned to unknown call {a.call_id}")
            parts[a.call_id][a.source] = parts[a.call_id].get(a.source, 0.0) + float(a.reward)
    totals = {}
    for call in trace.calls:
        call.reward_parts = dict(parts.get(call.call_id, {}))
        call.reward = sum(call.reward_parts.values())
        if call.trainable:
            totals[call.call_id] = call.reward
    return totals

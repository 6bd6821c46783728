"""Collapse alarms: an agent whose outputs stop varying, a policy whose entropy collapses, groups
that stop teaching anything. Pure functions over a step's record and the run's first step.

A 135M team trained on the H200 lost its verifier (it learned to approve), its finalizer's
outputs collapsed and 40-87% of its sequences had zero advantage, and nothing said so. These
rules say so, on the step line, in ``metrics.jsonl`` (``alarms``) and in the report:

- ``distinct_2`` of an agent's completions below ``DIVERSITY_DROP`` of its first step's value;
- a policy's token entropy below ``ENTROPY_DROP`` of its first update's (and under ``ENTROPY_FLOOR``
  in absolute terms, so a policy that starts near-deterministic is not flagged for staying so);
- ``ZERO_VARIANCE`` or more of an agent's groups with equal rewards (no advantage, no gradient).
"""

from __future__ import annotations

DIVERSITY_DROP = 0.3
ENTROPY_DROP = 0.2
ENTROPY_FLOOR = 0.1
ZERO_VARIANCE = 0.8


def collapse_alarms(rec: dict, first: dict | None) -> list[str]:
    """The alarms of step record ``rec`` against ``first`` (the run's first step record; None: this
    is it). Each alarm is one line naming the agent or policy, the figure and its first value."""
    first = first or rec
    out = []
    agents, first_agents = rec.get("rollout", {}).get("agents", {}), first.get("rollout", {}).get("agents", {})
    for name, a in agents.items():
        was = first_agents.get(name, {}).get("distinct_2")
        if was and a.get("distinct_2", 1.0) < DIVERSITY_DROP * was:
            out.append(f"{name}: distinct-2 {a['distinct_2']:.2f} (was {was:.2f} at step {first['step']})")
        if a.get("zero_var_groups", 0.0) >= ZERO_VARIANCE:
            out.append(f"{name}: {a['zero_var_groups']:.0%} of its groups have equal rewards (no advantage)")
    first_policies = first.get("policies", {})
    for name, p in rec.get("policies", {}).items():
        was = first_policies.get(name, {}).get("entropy")
        now = p.get("entropy")
        if was and now is not None and now < ENTROPY_DROP * was and now < ENTROPY_FLOOR:
            out.append(f"[{name}] entropy {now:.3f} (was {was:.3f} at step {first['step']})")
    return out

"""Collapse alarms: an agent whose outputs stop varying, a policy whose entropy collapses, groups
that stop teaching anything. Pure functions over a step's record and the run's first step.

A 135M team trained on the H200 lost its verifier (it learned to approve), its finalizer's
outputs collapsed and 40-87% of its sequences had zero advantage, and nothing said so. These
rules say so, on the step line, in ``metrics.jsonl`` (``alarms``) and in the report:

- ``distinct_2`` of an agent's completions below ``DIVERSITY_DROP`` of its first step's value;
- a policy's token entropy below ``ENTROPY_DROP`` of its first update's (and under ``ENTROPY_FLOOR``
  in absolute terms, so a policy that starts near-deterministic is not flagged for staying so);
- ``ZERO_VARIANCE`` or more of an agent's groups with equal rewards (no advantage, no gradient).

``stuck`` says when a run should end instead of alarming for ever: a reading team on the H200
collapsed at step 8 (every reader wrote "nothing useful", training outcome 0.000) and its alarms
went on for 90 more steps of updates that had nothing to learn from (``train.stop_when_stuck``);
a TicTacToe self-play seed became one deterministic player at step 25 and ran 175 more steps whose
updates trained no token at all, its outcome above the first step's all along.
"""

from __future__ import annotations

from statistics import mean

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
        if not p.get("trained_tokens", 1.0):  # an update that trained no token measured no entropy
            continue
        was = first_policies.get(name, {}).get("entropy")
        now = p.get("entropy")
        if was and now is not None and now < ENTROPY_DROP * was and now < ENTROPY_FLOOR:
            out.append(f"[{name}] entropy {now:.3f} (was {was:.3f} at step {first['step']})")
    return out


def untrained(window: list[dict]) -> str | None:
    """Why no update of the window taught anything, or None: every step's updates (those of the policies that
    updated; a step with none is no evidence) trained no token at all, whatever the outcome did."""
    if not window:
        return None
    entropies = []
    for r in window:
        updated = {n: p for n, p in r.get("policies", {}).items() if "trained_tokens" in p}
        if not updated or any(p["trained_tokens"] > 0 for p in updated.values()):
            return None
        entropies += [p["entropy"] for p in updated.values() if "entropy" in p]
    start, now = window[0].get("rollout", {}).get("outcome"), window[-1].get("rollout", {}).get("outcome")
    moved = (f" (training outcome {start:.3f} at step {window[0].get('step')}, {now:.3f} now)"
             if start is not None and now is not None else "")
    ent = f"; policy entropy at most {max(entropies):.3f}" if entropies else ""
    return (f"nothing trained: for the last {len(window)} steps every update trained no token{moved}: every group's "
            f"samples were rewarded alike{ent}, so more steps would change nothing. If the entropy is near 0 the "
            f"policy has collapsed onto one answer per task (in self-play, one game): in a game, moves it would not "
            f"make (the split's explore_moves or opening_moves, or the random player as an opponent); else a higher "
            f"temperature, algorithm.entropy_coef or harder tasks; if it solves every "
            f"task, evaluate it or move to harder ones; train.stop_when_stuck=0 runs on regardless")


def _taught_share(window: list[dict]) -> float | None:
    """The share of the window's updated sequences whose advantage was not zero (None: no update recorded it)."""
    seqs = zero = 0.0
    for r in window:
        for p in r.get("policies", {}).values():
            if "zero_adv_seqs" in p and p.get("n_seqs"):
                seqs, zero = seqs + p["n_seqs"], zero + p["zero_adv_seqs"]
    return (seqs - zero) / seqs if seqs else None


def stuck(window: list[dict], first: dict) -> str | None:
    """Why a run has stopped learning, or None. ``window``: its last step records (the caller keeps
    ``train.stop_when_stuck`` of them). Stuck: the training outcome never rose above the first step's
    in the window and on average over it every agent had ``ZERO_VARIANCE`` or more of its groups flat, and
    the updates agree (at most ``1 - ZERO_VARIANCE`` of their sequences had a non-zero advantage, where they
    record it: a running baseline gives advantages to flat groups, and a self-play game's outcome is not a
    measure of progress, so an RAE run is not stopped on its groups alone); or, whatever the outcome did, no
    update of the window trained a token (``untrained``). A run whose outcome climbed, or saturated above where
    it began, is otherwise left to train on the groups that still differ."""
    start = first.get("rollout", {}).get("outcome")
    outcomes = [r.get("rollout", {}).get("outcome") for r in window]
    if not window or start is None or any(o is None or o > start for o in outcomes):
        return untrained(window)
    agents = sorted({a for r in window for a in r.get("rollout", {}).get("agents", {})})
    flat = {a: mean(r["rollout"].get("agents", {}).get(a, {}).get("zero_var_groups", 0.0) for r in window)
            for a in agents}
    if not flat or min(flat.values()) < ZERO_VARIANCE:
        return untrained(window)
    taught = _taught_share(window)
    if taught is not None and taught > 1 - ZERO_VARIANCE:  # flat groups, but the estimator still gives advantages
        return untrained(window)  # (a running baseline such as RAE's does not need a group to differ)
    shares = ", ".join(f"{a} {v:.0%}" for a, v in flat.items())
    return (f"stuck: for the last {len(window)} steps the training outcome stayed at or below step {first['step']}'s "
            f"({start:.3f}; {outcomes[-1]:.3f} now) and most groups had equal rewards ({shares}), so the updates had "
            f"almost nothing to learn from. The step lines' ALARMs say where it began. Try a smaller format reward "
            f"weight (a format-only reward is the easiest to earn), rollout.dynamic_sampling, a higher temperature "
            f"or algorithm.entropy_coef, or easier tasks; train.stop_when_stuck=0 runs on regardless")


class StuckWatch:
    """``train.stop_when_stuck``: the last ``n`` step records (0: never stuck), and why they say the run has stopped
    learning (``stuck``) once there are ``n`` of them."""

    def __init__(self, n: int):
        self.n, self.window = n, []

    def see(self, rec: dict, first: dict) -> str | None:
        if not self.n:
            return None
        self.window = [*self.window, rec][-self.n:]
        return stuck(self.window, first) if len(self.window) == self.n else None

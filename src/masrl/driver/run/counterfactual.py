"""Counterfactual credit per call: what did this call change about the outcome?

For every call of the agents chosen (``rollout.counterfactual``), the trace is re-run from that call
``k`` times: the calls before it are replayed from the record (the seeded per-call sampling would
give the same tokens; replaying them costs nothing), the call itself is sampled again with another
seed, and the rest of the workflow runs on from there. The call's credit is the trace's outcome
minus the mean outcome of those alternatives: a verifier whose verdict made no difference earns 0;
a refiner whose fix turned a wrong answer right, where its alternatives did not, earns up to 1.
The ``counterfactual`` reward pays it. The branches never train, and their cost (calls sampled) is
reported per step, next to the rollout's own calls.
"""

from __future__ import annotations

import asyncio

from masrl.data.tasks import Task
from masrl.trace import Trace


def branch_points(traces: list[Trace], agents: list[str] | None, k: int) -> list[tuple[Trace, int, int]]:
    """``(trace, call index, alternative)`` for every call to credit: calls of ``agents`` (None: all)
    in traces that did not fail and have an outcome."""
    return [(tr, j, a) for tr in traces if not tr.failed and "outcome" in tr.metrics
            for j, c in enumerate(tr.calls) if agents is None or c.agent in agents for a in range(k)]


def credit_from_branches(points: list[tuple[Trace, int, int]], branches: list[Trace]) -> dict[str, float]:
    """Set ``call.counterfactual`` on every credited call; returns the step's cost and spread."""
    alts: dict[tuple[str, int], list[float]] = {}
    calls = failed = 0
    for (tr, j, _), br in zip(points, branches):
        calls += max(0, len(br.calls) - j)  # what the branch sampled: the branched call and what followed
        if br.failed or "outcome" not in br.metrics:
            failed += 1
            continue
        alts.setdefault((tr.trace_id, j), []).append(float(br.metrics["outcome"]))
    credited = []
    for tr, j, a in points:
        got = alts.get((tr.trace_id, j))
        if a == 0 and got:
            c = tr.calls[j]
            c.counterfactual = float(tr.metrics["outcome"]) - sum(got) / len(got)
            credited.append(c.counterfactual)
    return {"branches": float(len(points)), "failed_branches": float(failed), "calls": float(calls),
            "credited_calls": float(len(credited)),
            "mean_abs_credit": sum(map(abs, credited)) / len(credited) if credited else 0.0,
            "nonzero_credit": sum(1 for x in credited if abs(x) > 1e-9) / len(credited) if credited else 0.0}


async def counterfactual_credit(controller, traces: list[Trace], tasks: dict[str, Task], *, k: int,
                                agents: list[str] | None, seed: int | None, max_in_flight: int) -> dict[str, float]:
    points = branch_points(traces, agents, k)
    sem = asyncio.Semaphore(max_in_flight)
    branches = await asyncio.gather(*[controller.run_branch(tasks[tr.task_id], tr, j, a, sem, seed)
                                      for tr, j, a in points])
    stats = credit_from_branches(points, list(branches))
    stats["rollout_calls"] = float(sum(len(t.calls) for t in traces))
    return stats

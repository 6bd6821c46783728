"""One synchronous training step: roll out the step's tasks, pay counterfactual credit
(``rollout.counterfactual``), assign rewards, replace the tasks that teach nothing
(``rollout.dynamic_sampling``), then update every policy. The asynchronous loop's steps are
``async_loop.py``; the run around both (evaluations, checkpoints, keep-best) is ``loop.py``.

Counterfactual credit per call, what did this call change about the outcome? For every call of the
agents chosen (``rollout.counterfactual``), the trace is re-run from that call
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
import time

from masrl.data.tasks import Task
from masrl.driver import faults
from masrl.driver.observe.metrics import summarize_traces
from masrl.driver.run.stream import flat_tasks, fresh_tasks, step_tasks
from masrl.seeding import stable_seed
from masrl.trace import Trace


# -- counterfactual credit ---------------------------------------------------------------------------
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


class SyncStep:
    """The synchronous steps of ``t`` (a ``loop.Trainer``, not imported here: that would import in a circle)."""

    def __init__(self, t):
        self.t = t

    async def run(self) -> dict:
        """Step ``t.step + 1``: its record (timings, rollout summary, policy metrics)."""
        t = self.t
        assert t.rt is not None
        cfg, r = t.cfg, t.cfg.rollout
        tasks = step_tasks(t.train_tasks, t.step, r.tasks_per_step, cfg.seed)
        t._take_transfer()  # an evaluation's or a checkpoint's calls are not this step's
        t0 = time.perf_counter()
        traces = await t._rollout(tasks, r.samples_per_task, train=True, temperature=None,
                                  seed=stable_seed(cfg.seed, "train", t.step), label=f"step {t.step + 1} rollout")
        extra = {}
        cf = await self._counterfactual(traces, tasks)
        if cf is not None:
            extra["counterfactual"] = cf
        await t.rt.controller.assign_rewards(traces, {x.id: x for x in tasks})
        if r.dynamic_sampling:
            traces, extra["dynamic_sampling"] = await self._refill(tasks, traces)
        t1 = time.perf_counter()
        kl = t.rt.controller.policy_kl(cfg.train.policy_kl) if cfg.train.policy_kl else None
        faults.point(f"update:{t.step + 1}")
        with t.console.status(f"  step {t.step + 1} update"):
            policies = t.rt.controller.update(traces)
        t2 = time.perf_counter()
        t.step += 1
        rec = {"step": t.step, "rollout_s": t1 - t0, "update_s": t2 - t1, "rollout": summarize_traces(traces),
               "policies": policies}
        if kl is not None:
            rec["policy_kl"] = kl
        rec.update(extra)
        rec.update(t._take_memory())
        moved = t._take_transfer()
        if moved is not None:  # runtime.placement ray: what crossed between the driver and the actors this step
            rec["transfer"] = moved
        t.last_traces = traces
        return rec


    async def _counterfactual(self, traces: list, tasks: list[Task], refill: int = 0) -> dict | None:
        """``rollout.counterfactual``: each credited call's outcome minus its alternatives' mean, on the calls;
        the step's cost and spread (None when the option is off). ``refill``: the dynamic-sampling round the
        traces came from (their sampling seed)."""
        t = self.t
        cf = t.cfg.rollout.counterfactual
        if cf is None:
            return None
        seed = stable_seed(t.cfg.seed, "train", t.step) if not refill else \
            stable_seed(t.cfg.seed, "train", t.step, "refill", refill)  # the seed the traces were sampled with
        points = branch_points(traces, cf.agents, cf.k)
        sem, by_id = asyncio.Semaphore(t.cfg.rollout.max_in_flight), {x.id: x for x in tasks}
        branches = await asyncio.gather(*[t.rt.controller.run_branch(by_id[tr.task_id], tr, j, a, sem, seed)
                                          for tr, j, a in points])
        stats = credit_from_branches(points, list(branches))
        stats["rollout_calls"] = float(sum(len(x.calls) for x in traces))
        return stats


    async def _refill(self, tasks: list[Task], traces: list) -> tuple[list, dict]:
        """``rollout.dynamic_sampling``: drop flat tasks' calls (``stream.flat_tasks``), roll out fresh tasks
        in their place, up to that many extra rounds; the traces to train on and what was done."""
        t = self.t
        r, key = t.cfg.rollout, t.cfg.algorithm.group_key
        used = {x.id for x in tasks}
        flat = flat_tasks(traces, key)
        dropped, rounds, extra = len(flat), 0, 0
        t.rt.controller.drop_traces([x for x in traces if x.task_id in flat])
        kept = len(used) - len(flat)
        while kept < r.tasks_per_step and rounds < r.dynamic_sampling:
            rounds += 1
            more = fresh_tasks(t.train_tasks, used, r.tasks_per_step - kept, stable_seed(t.cfg.seed, "refill", t.step, rounds))
            if not more:
                break
            used |= {x.id for x in more}
            extra += len(more)
            new = await t._rollout(more, r.samples_per_task, train=True, temperature=None,
                                   seed=stable_seed(t.cfg.seed, "train", t.step, "refill", rounds),
                                   label=f"step {t.step + 1} refill {rounds}")
            await self._counterfactual(new, more, rounds)
            await t.rt.controller.assign_rewards(new, {x.id: x for x in more})
            flat = flat_tasks(new, key)
            t.rt.controller.drop_traces([x for x in new if x.task_id in flat])
            dropped += len(flat)
            kept += len(more) - len(flat)
            traces = traces + new
        return traces, {"flat_tasks_dropped": dropped, "refill_rounds": rounds, "extra_tasks": extra,
                        "teaching_tasks": kept}

"""One synchronous training step: roll out the step's tasks, pay counterfactual credit
(``rollout.counterfactual``), assign rewards, replace the tasks that teach nothing
(``rollout.dynamic_sampling``), then update every policy. The asynchronous loop's steps are
``async_loop.py``; the run around both (evaluations, checkpoints, keep-best) is ``loop.py``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from masrl.data.tasks import Task
from masrl.driver import faults
from masrl.driver.observe.metrics import summarize_traces
from masrl.driver.run.counterfactual import counterfactual_credit
from masrl.driver.run.stream import flat_tasks, fresh_tasks, step_tasks
from masrl.seeding import stable_seed

if TYPE_CHECKING:
    from masrl.driver.run.loop import Trainer


async def sync_step(t: Trainer) -> dict:
    """Step ``t.step + 1`` of trainer ``t``; its record (timings, rollout summary, policy metrics)."""
    assert t.rt is not None
    cfg, r = t.cfg, t.cfg.rollout
    tasks = step_tasks(t.train_tasks, t.step, r.tasks_per_step, cfg.seed)
    t._take_transfer()  # an evaluation's or a checkpoint's calls are not this step's
    t0 = time.perf_counter()
    traces = await t._rollout(tasks, r.samples_per_task, train=True, temperature=None,
                              seed=stable_seed(cfg.seed, "train", t.step), label=f"step {t.step + 1} rollout")
    extra = {}
    cf = await step_counterfactual(t, traces, tasks)
    if cf is not None:
        extra["counterfactual"] = cf
    t.rt.controller.assign_rewards(traces, {x.id: x for x in tasks})
    if r.dynamic_sampling:
        traces, extra["dynamic_sampling"] = await refill_flat_tasks(t, tasks, traces)
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


async def step_counterfactual(t: Trainer, traces: list, tasks: list[Task], refill: int = 0) -> dict | None:
    """``rollout.counterfactual``: each credited call's outcome minus its alternatives' mean, on the calls;
    the step's cost and spread (None when the option is off). ``refill``: the dynamic-sampling round the
    traces came from (their sampling seed)."""
    cf = t.cfg.rollout.counterfactual
    if cf is None:
        return None
    seed = stable_seed(t.cfg.seed, "train", t.step) if not refill else \
        stable_seed(t.cfg.seed, "train", t.step, "refill", refill)  # the seed the traces were sampled with
    return await counterfactual_credit(t.rt.controller, traces, {x.id: x for x in tasks}, k=cf.k,
                                       agents=cf.agents, seed=seed, max_in_flight=t.cfg.rollout.max_in_flight)


async def refill_flat_tasks(t: Trainer, tasks: list[Task], traces: list) -> tuple[list, dict]:
    """``rollout.dynamic_sampling``: drop flat tasks' calls (``stream.flat_tasks``), roll out fresh tasks
    in their place, up to that many extra rounds; the traces to train on and what was done."""
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
        await step_counterfactual(t, new, more, rounds)
        t.rt.controller.assign_rewards(new, {x.id: x for x in more})
        flat = flat_tasks(new, key)
        t.rt.controller.drop_traces([x for x in new if x.task_id in flat])
        dropped += len(flat)
        kept += len(more) - len(flat)
        traces = traces + new
    return traces, {"flat_tasks_dropped": dropped, "refill_rounds": rounds, "extra_tasks": extra,
                    "teaching_tasks": kept}

"""One policy's update on a worker: which buffered calls are fresh enough, and the update itself with
its learning rate by schedule, its optimizer state in and out of CPU memory, its memory figures and its
EMA. ``PolicyWorker.train_step`` calls these for each policy due this step.
"""

from __future__ import annotations

import contextlib
import time

import torch

from masrl.algorithms.normalize import RunningMoments
from masrl.algorithms.schedules import lr_factor
from masrl.errors import MasrlError
from masrl.worker.model import memory
from masrl.worker.updater.training import Sample, train_policy


def fresh_samples(samples: list[Sample], version: int, max_staleness: int | None
                  ) -> tuple[list[Sample], dict[str, float]]:
    """The samples within ``max_staleness`` versions of ``version`` (the weights about to update;
    None: all), and the staleness figures: mean, max, how many were dropped, and a count by age."""
    ages = [version - s.version for s in samples]
    keep = [s for s, a in zip(samples, ages) if max_staleness is None or a <= max_staleness]
    stats = {"staleness_mean": sum(ages) / len(ages) if ages else 0.0, "staleness_max": float(max(ages, default=0)),
             "stale_dropped": float(len(samples) - len(keep))}
    for a in sorted(set(ages)):
        stats[f"staleness_{a}"] = float(ages.count(a))
    return keep, stats


def update_policy(w, name: str, samples: list[Sample], n_shared: int) -> dict[str, float]:
    """One update of policy ``name`` on ``w`` (a ``PolicyWorker``, not imported here: that would import
    in a circle); its metrics: ``update_s``, ``lr``, offload and GPU memory figures besides the loss
    terms ``train_policy`` returns."""
    spec, opt = w.host.policies[name], w.optimizers[name]
    sched = spec.schedule
    lr = spec.optim.lr * lr_factor(w.updates[name], warmup=sched.warmup_updates, total=sched.total_updates,
                                   decay=sched.decay, min_ratio=sched.min_lr_ratio)
    for g in opt.param_groups:
        g["lr"] = lr
    t_in = time.perf_counter()
    ref_moved = w.host.ref_stash.moved_s
    moved = opt.reload() if spec.offload_optimizer else 0
    held_before = memory.reset_peak(w.device) if w.device.startswith("cuda") else 0
    t0 = time.perf_counter()
    try:
        m = train_policy(w.host, name, samples, opt, w.algo, spec.optim.grad_clip, w.pad_id,
                         seed=w.seed + w.step, reward_stats=w.reward_stats.setdefault(name, RunningMoments()),
                         critic=w.critics.get(name), dp=w.dp,
                         estimator_state=w.estimator_state.setdefault(name, {}))
    except RuntimeError as e:  # torch's OutOfMemoryError, or cuBLAS and cuDNN running out in their own words
        free, total = _device_memory(w)
        if not isinstance(e, torch.OutOfMemoryError) and not memory.memory_failure(str(e), free, total):
            raise
        raise MasrlError(memory.update_oom_message(name, w.algo, device=w.device, held=held_before, free=free,
                                                   total=total, earlier_extra_gib=w.update_extra.get(name),
                                                   detail=str(e))) from e
    m["update_s"] = time.perf_counter() - t0
    m["shared_calls"] = float(n_shared)
    if w.host.ref_stash.moved_s > ref_moved:
        m["reference_offload_s"] = w.host.ref_stash.moved_s - ref_moved
    if spec.offload_optimizer:
        t1 = time.perf_counter()
        moved += opt.offload()
        m["offload_s"] = (t0 - t_in) + (time.perf_counter() - t1)
        m["offload_gb"] = moved / 2**30
    m["lr"] = lr
    m["optimizer_state_gb"] = opt.moment_bytes() / 2**30  # this process's AdamW moments (its share)
    if w.device.startswith("cuda"):  # this update's peak, and what it added to what was held before
        peak = torch.cuda.max_memory_allocated(w.device)
        m["gpu_peak_gb"] = peak / 2**30
        m["update_extra_gib"] = (peak - held_before) / 2**30
        w.update_extra[name] = max(w.update_extra.get(name, 0.0), m["update_extra_gib"])
    w.updates[name] += 1
    if name in w.emas:
        w.emas[name].update()
    return m


def _device_memory(w) -> tuple[int, int]:
    """(free, total) bytes of the worker's GPU; (0, 0) on a CPU or a device past answering."""
    if w.device.startswith("cuda"):
        with contextlib.suppress(Exception):
            return torch.cuda.mem_get_info(w.device)
    return 0, 0


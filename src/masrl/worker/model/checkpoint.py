"""A worker's whole state in a checkpoint folder, and back.

``state.py`` writes one policy (weights or adapter, value head, optimizer); this module decides
what a worker writes around it: which rank writes what under data parallelism, a sharded (fsdp)
policy's shards beside its gathered weights, EMA weights, critics, and the worker's counters (step,
reward statistics, updates per policy). The functions take the ``PolicyWorker``; its ``save`` and
``load`` methods (the ones a driver or a Ray actor calls) call them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from masrl.algorithms.normalize import RunningMoments
from masrl.errors import MasrlError
from masrl.worker.model import state


def _distinct_critics(worker) -> list:
    """Each critic once (policies of one worker may share one)."""
    return list({id(c): c for c in worker.critics.values()}.values())


def _counters_file(worker, d: Path) -> Path:
    return d / f"worker_{'_'.join(worker.policy_names)}.json"


def save_worker(worker, d: Path, *, weights_only: bool = False) -> None:
    """Every trainable policy's state (a frozen policy never changes: nothing to save);
    ``weights_only``: without the policies' optimizer state (with AdamW's fp32 masters and moments,
    most of a full checkpoint; ``load`` then keeps the optimizer it has). Critics are written whole."""
    if worker.host.sharded is not None:
        _save_sharded(worker, d, weights_only)
        return
    if worker.dp is not None and worker.dp.rank > 0:  # rank 0 writes the state all ranks share
        if weights_only:
            return
        for name, opt in worker.optimizers.items():
            if opt.shard_of is not None:  # its own share of the optimizer state
                (d / name).mkdir(parents=True, exist_ok=True)
                torch.save(opt.state_dict(), d / name / opt.file_name)
        return
    for name in worker.trainable_names:
        state.save_policy(worker.host, name, None if weights_only else worker.optimizers.get(name), d / name)
    for name in _snapshot_names(worker):  # frozen, but not fixed: an opponent pool's member
        state.save_policy(worker.host, name, None, d / name)
    for name, ema in worker.emas.items():
        torch.save(ema.state_dict(), d / name / "ema.pt")
    for critic in _distinct_critics(worker):  # a shared one is written by each holder
        (d / "critics").mkdir(parents=True, exist_ok=True)
        torch.save(critic.state_dict(), d / "critics" / f"{critic.name}.pt")
    _save_counters(worker, d)


def load_weights_into(worker, policy: str, d: Path) -> None:
    """``policy``'s weights from a folder another policy's save wrote (``d`` holds its ``model.safetensors``),
    then handed to the engine. Full models only (a snapshot of a LoRA adapter is not built)."""
    if policy not in worker.host.policies:
        raise MasrlError(f"this host holds no policy '{policy}' (it holds {', '.join(worker.host.policies)})")
    if worker.host.is_lora or worker.host.sharded is not None:
        raise MasrlError(f"policy '{policy}': weights can be copied into a full, unsharded model only")
    with torch.no_grad():
        state._load_weights(worker.host, policy, d)
    worker._publish([policy])


def _snapshot_names(worker) -> list[str]:
    """Frozen policies that hold snapshots of another (an opponent pool): saved with the checkpoint, as their
    weights change during the run."""
    return [p.name for p in worker.specs.values() if getattr(p, "snapshot_of", None)]


def _save_sharded(worker, d: Path, weights_only: bool = False) -> None:
    """fsdp: every rank writes its shards (``NAME/fsdp/``, torch.distributed.checkpoint; not with
    ``weights_only``); rank 0 also writes the full weights from the engine's gathered copy
    (``NAME/model.safetensors``, what ``serve`` and ``eval --checkpoint`` load) and the worker's counters."""
    for name in worker.trainable_names:
        if not weights_only:
            worker.host.sharded.save(worker.optimizers[name].opt, d / name / "fsdp")
        if worker.dp.rank == 0:
            state.save_policy(worker.host, name, None, d / name, weights=worker.copy.model)
    if worker.dp.rank == 0:
        _save_counters(worker, d)


def _save_counters(worker, d: Path) -> None:
    _counters_file(worker, d).write_text(json.dumps(
        {"step": worker.step, "reward_stats": {k: v.state_dict() for k, v in worker.reward_stats.items()},
         "estimator_state": worker.estimator_state, "updates": worker.updates}))


def _load_sharded(worker, name: str, d: Path, with_optimizer: bool) -> None:
    """fsdp: the shards from ``NAME/fsdp/`` (fp32, with the AdamW moments), or, where only full
    weights were saved, those split over the ranks."""
    shards = d / name / "fsdp"
    if (shards / ".metadata").is_file():
        worker.host.sharded.load(worker.optimizers[name].opt, shards, with_optimizer)
        return
    from safetensors.torch import load_file

    path = d / name / "model.safetensors"
    if not path.is_file():
        raise MasrlError(f"{path} is missing: policy '{name}' is a full model in this config but not in the "
                         f"checkpoint")
    worker.host.sharded.load_full(load_file(str(path)))


def load_worker(worker, d: Path, *, with_optimizer: bool = True) -> None:
    """What ``save_worker`` wrote; the engine gets the loaded weights before this returns."""
    for name in worker.trainable_names:
        if worker.host.sharded is not None:
            _load_sharded(worker, name, d, with_optimizer)
            continue
        state.load_policy(worker.host, name, worker.optimizers.get(name), d / name, with_optimizer=with_optimizer)
    for name in _snapshot_names(worker):
        if (d / name / "model.safetensors").is_file():
            with torch.no_grad():
                state._load_weights(worker.host, name, d / name)
    for critic in _distinct_critics(worker):
        f = d / "critics" / f"{critic.name}.pt"
        if f.is_file():
            critic.load_state_dict(torch.load(f, weights_only=True), with_optimizer=with_optimizer)
    meta = _counters_file(worker, d)
    if meta.is_file():
        counters = json.loads(meta.read_text())
        worker.step = counters["step"]
        worker.reward_stats = {k: RunningMoments.from_state(v) for k, v in counters.get("reward_stats", {}).items()}
        worker.estimator_state = counters.get("estimator_state", {})
        worker.updates.update(counters.get("updates", {}))
    worker._publish()
    for name, ema in worker.emas.items():
        if (d / name / "ema.pt").is_file():
            ema.load_state_dict(torch.load(d / name / "ema.pt", weights_only=True))

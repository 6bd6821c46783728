"""PolicyWorker: the ``PolicyHost`` over one model in memory, in four wings it delegates to.

``held`` (``model.held.HeldModel``: a full model with its policy, or a frozen base with one LoRA adapter
per policy) and the engine's weight ``copy``; ``sampler`` (the engine, prompts, the buffer of served
calls); ``updater`` (optimizers, advantages, losses, critics, EMA); ``parallel`` ranks (data parallel,
FSDP), joined after it is built. Every method takes and returns plain picklable data, so the same class
runs in-process or as a Ray actor.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from masrl.algorithms.estimators import needs_critic, needs_reference
from masrl.config import AlgorithmConfig
from masrl.engines.base import make_engine
from masrl.models import stop_token_ids
from masrl.policies import PolicySpec
from masrl.worker.interface import PolicyHost
from masrl.worker.model import memory
from masrl.worker.model.checkpoint import Checkpoint
from masrl.worker.model.held import HeldModel
from masrl.worker.model.offload import Parking
from masrl.worker.model.precision import param_dtype
from masrl.worker.parallel.data_parallel import free_port, init_ranks
from masrl.worker.sampler.sampler import Sampler
from masrl.worker.updater.updater import Updater


class PolicyWorker(PolicyHost):
    def __init__(self, model_name: str, policies: list[PolicySpec], algo: AlgorithmConfig | None = None, *,
                 device: str = "cpu", precision: str = "auto", seed: int = 0, engine: str = "auto",
                 engine_options: dict | None = None, threads: int | None = None, name: str | None = None,
                 overlap_update: bool = False, rollout_device: str | None = None):
        if threads:  # in a process of its own (a Ray actor): the run's thread count applies here too
            torch.set_num_threads(threads)
        self.name = name or "worker-" + "-".join(p.name for p in policies)
        self.device, algo = device, algo or AlgorithmConfig()
        self.fsdp = any(p.fsdp for p in policies)  # the held weights are fp32: the shards become the masters
        compute = param_dtype(precision, device)
        self.held = HeldModel(model_name, policies, device=device, dtype=torch.float32 if self.fsdp else compute,
                              seed=seed, need_reference=needs_reference(algo), need_critic=needs_critic(algo))
        self.updater = Updater(self.held, algo, device=device, seed=seed, pad_id=self.held.tokenizer.pad_token_id)
        rollout_device = rollout_device if rollout_device and rollout_device != device else None
        copy = self.held.engine_copy(list(self.updater.optimizers), compute, fsdp=self.fsdp,
                                     overlap_update=overlap_update, device=rollout_device)
        self.overlaps_update = overlap_update and copy is not None  # the engine samples while an update runs
        tok = self.held.tokenizer
        eng = make_engine(engine, copy.model if copy else self.held.model, tok, stop_token_ids(tok, self.held.core),
                          device=rollout_device or device, seed=seed, **(engine_options or {}))
        self.sampler = Sampler(self.held, eng, copy, overlaps_update=self.overlaps_update, fsdp=self.fsdp,
                               versions=self.updater.updates)
        self.checkpoint = Checkpoint(self.held, self.updater, self.sampler)
        memory.enroll({device, str(eng.device)}, self)
        self.parking = Parking(self.held, eng, self.updater.ema_tensors, any(p.offload_weights for p in policies))

    policy_names = property(lambda self: list(self.held.policies))
    specs = property(lambda self: dict(self.held.policies))
    trainable_names = property(lambda self: self.held.trainable)
    joins_batches = property(lambda self: self.sampler.joins_batches)

    def get_tokenizer(self):
        return self.held.tokenizer

    def attach_critic(self, policy: str, critic) -> None:
        self.updater.attach_critic(policy, critic)

    def build_critic(self, policy: str, name: str, model: str, optim, seed: int) -> None:
        self.updater.build_critic(policy, name, model, optim, seed)

    free_port = staticmethod(free_port)  # (rank 0's rendezvous)

    def join_ranks(self, init_method: str, rank: int, world: int, backend: str = "gloo") -> None:
        """Become rank ``rank`` of ``world`` copies of this worker's policy (data parallel; fsdp: sharded)."""
        dp = init_ranks(init_method, rank, world, backend)
        if self.fsdp:
            from masrl.worker.parallel.sharding import ShardedPolicy

            ShardedPolicy.over(self.held, self.sampler.copy, world, self.name)
        self.updater.join(dp)

    def where(self) -> list[dict]:
        """This process: its name, pid and device; inside a Ray actor also the node id and its GPUs."""
        at, ray = {"name": self.name, "pid": os.getpid(), "device": self.device}, sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            at.update(node_id=ray.get_runtime_context().get_node_id(), gpus=[str(g) for g in ray.get_gpu_ids()])
        return [at]

    def take_memory(self) -> list[dict]:
        copy, eng = self.sampler.copy, self.sampler.engine
        return memory.device_rows({self.device, str(eng.device)}, weights=self.held.tensors(), engine=eng,
                                  copy=list(copy.model.parameters()) if copy is not None else [],
                                  optimizers=list(self.updater.optimizers.values()), owner=self)

    def get_step(self) -> int:
        return self.updater.step

    def take_traffic(self) -> dict[str, list[float]]:
        return {}  # nothing crosses a process to reach this object; a RemoteHost counts what reaches an actor

    def close(self) -> None:
        """The engine's KV pool, graphs and buffers go now, not when this worker is collected."""
        memory.unclaim(self)  # the next run's host in this process reports the device's peak
        try:
            self.sampler.engine.release()
        except RuntimeError:  # calls still running (a cancelled episode's batch): they keep what they use
            pass

    def park(self) -> None:
        self.parking.park()

    def generate(self, calls, on_result=None):
        self.parking.resident()
        return self.sampler.generate(calls, on_result)

    def commit_rewards(self, rewards: dict[str, float]) -> int:
        return self.sampler.commit_rewards(rewards)

    def drop(self, call_ids: list[str]) -> int:
        return self.sampler.drop(call_ids)

    def rewarded(self, policies: list[str]):
        return self.sampler.rewarded(policies)

    def advantages(self) -> dict[str, float]:
        return dict(self.updater.last_advantages)

    def score(self, policy: str, samples):
        self.parking.resident()
        return self.updater.score(policy, samples)

    def train_step(self, shared=None, keep_pending: bool = False) -> dict[str, dict[str, float]]:
        memory.give_back_freed()  # what the rollout freed (its KV caches) before the update allocates
        self.parking.resident()
        metrics = self.updater.train_step(self.sampler, shared, keep_pending)
        self.parking.after_update(metrics)
        memory.give_back_freed()
        return metrics

    def save(self, directory: str, *, weights_only: bool = False) -> None:
        self.checkpoint.save(Path(directory), weights_only=weights_only)

    def load(self, directory: str, *, with_optimizer: bool = True) -> None:
        self.checkpoint.load(Path(directory), with_optimizer=with_optimizer)

    def load_weights(self, policy: str, directory: str) -> None:
        self.checkpoint.load_weights(policy, Path(directory))

    def begin_eval(self) -> None:
        """``evaluating`` in two calls (what a remote caller can make): the EMA weights in, if any."""
        self.updater.ema_in(self.sampler)

    def end_eval(self) -> None:
        self.updater.ema_out(self.sampler)
        memory.give_back_freed()  # what the evaluation's batches freed

    def fingerprint(self, policy: str) -> list[float]:
        return self.held.fingerprint(policy, self.sampler.copy)

"""The updating wing of a worker: one optimizer per trainable policy, and everything an update reads
and keeps across updates (the estimator's state, running reward moments, critics, EMA weights, the
number of updates per policy).

``train_step`` updates each policy due this step on its rewarded buffered calls (plus calls shared into
it), publishes the new weights to the sampler's engine and clears what it trained on. One policy's update
(``update``) sets its learning rate by schedule, moves its optimizer state in and out of CPU memory,
reports its memory figures and steps its EMA; the loss itself is ``training.Learner``'s.
"""

from __future__ import annotations

import contextlib
import time
from contextlib import ExitStack

import torch

from masrl.algorithms.normalize import RunningMoments
from masrl.algorithms.schedules import WeightEMA, lr_factor
from masrl.config import AlgorithmConfig
from masrl.errors import ConfigError, MasrlError
from masrl.worker.model import memory
from masrl.worker.model.held import HeldModel
from masrl.worker.model.precision import MasterWeightsAdamW
from masrl.worker.updater.training import Learner, Sample


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


def _adamw(params, optim) -> MasterWeightsAdamW:
    return MasterWeightsAdamW(params, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay)


class Updater:
    def __init__(self, held: HeldModel, algo: AlgorithmConfig, *, device: str, seed: int, pad_id: int):
        self.held, self.algo, self.device, self.seed, self.pad_id = held, algo, device, seed, pad_id
        self.learner = Learner(held, algo, pad_id)
        self.optimizers: dict[str, MasterWeightsAdamW] = {}
        for name, spec in held.policies.items():
            if spec.trainable:
                self.optimizers[name] = _adamw(held.policy_parameters(name), spec.optim)
                if spec.offload_optimizer:
                    self.optimizers[name].offload()
        self.estimator_state: dict[str, dict] = {}  # per policy: the estimator's own across updates (RAE's baselines)
        self.reward_stats: dict[str, RunningMoments] = {}  # per policy, for algorithm.reward_norm: running
        self.critics: dict = {}  # policy -> Critic (a separate value model; set by the builder)
        self.updates: dict[str, int] = {n: 0 for n in self.optimizers}  # updates done per policy (LR schedule)
        self.update_extra: dict[str, float] = {}  # GiB the largest update so far added to what was held (CUDA)
        self.emas = {n: WeightEMA(held.policy_parameters(n), spec.schedule.ema)
                     for n, spec in held.policies.items() if n in self.optimizers and spec.schedule.ema}
        self.last_advantages: dict[str, float] = {}
        self.step = 0
        self.dp = None  # DataParallel: this worker is one rank of a data-parallel policy

    def join(self, dp) -> None:
        """This worker became one rank of ``dp``: optimizers that shard their state take their share;
        a sharded (fsdp) model's optimizers are built again over its shards, their own fp32 masters."""
        self.dp = dp
        for name, opt in self.optimizers.items():
            if self.held.sharded is not None:
                self.optimizers[name] = _adamw(self.held.policy_parameters(name), self.held.policies[name].optim)
            elif self.held.policies[name].shard_optimizer:
                opt.shard(dp.rank, dp.world)

    def ema_tensors(self) -> list[torch.Tensor]:
        return [t for e in self.emas.values() for t in e.shadow]

    def ema_in(self, sampler) -> None:
        """The EMA weights (``schedule.ema``) in place of the live ones, and in the engine, until ``ema_out``."""
        if self.emas:
            self._eval_stack = ExitStack()
            for ema in self.emas.values():
                self._eval_stack.enter_context(ema.swapped_in())
            sampler.publish(list(self.emas), self.updates)

    def ema_out(self, sampler) -> None:
        stack = self.__dict__.pop("_eval_stack", None)
        if stack is not None:
            stack.close()
            sampler.publish(list(self.emas), self.updates)

    # -- critics -------------------------------------------------------------------------------
    def attach_critic(self, policy: str, critic) -> None:
        """``policy``'s separate value model (``Critic``), which other policies may share; it scores
        this worker's token ids, so it must have this worker's tokenizer."""
        if critic.tokenizer.get_vocab() != self.held.tokenizer.get_vocab():
            raise ConfigError(f"critics.{critic.name}: its model '{critic.model_name}' has another tokenizer than "
                              f"policy '{policy}'; the critic scores the policy's token ids, so give it a model on "
                              f"the same tokenizer")
        self.critics[policy] = critic

    def build_critic(self, policy: str, name: str, model: str, optim, seed: int) -> None:
        """Build critic ``name`` here (once; a second policy of this worker shares it) for ``policy``."""
        from masrl.worker.updater.critic import Critic

        built = {c.name: c for c in self.critics.values()}
        self.attach_critic(policy, built.get(name) or Critic(name, model, optim, device=self.device, seed=seed))

    # -- scoring -------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, policy: str, samples: list[Sample]) -> list[list[float]]:
        """``policy``'s logprobs of each sample's completion tokens (at the sample's temperature)."""
        from masrl.worker.updater.batching import make_batch

        layout = self.learner.layout()
        if layout == "prefix":
            layout = "padded"
        out = []
        for i in range(0, len(samples), self.algo.micro_batch_size):
            mb = samples[i:i + self.algo.micro_batch_size]
            batch = make_batch(mb, self.pad_id, layout=layout, device=self.held.device)
            with self.held.active(policy):
                lp, _, _ = self.learner.completion_forward(self.held.core, batch)
            out += [lp[j, : len(s.completion_ids)].tolist() for j, s in enumerate(mb)]
        return out

    # -- updates -------------------------------------------------------------------------------
    def train_step(self, sampler, shared: dict[str, list[Sample]] | None = None,
                   keep_pending: bool = False) -> dict[str, dict[str, float]]:
        """Update every trainable policy due this step on ``sampler``'s rewarded calls (plus calls
        ``shared`` into it from other policies), publish the new weights, then clear the buffer
        (``keep_pending``: but for calls not rewarded yet). Calls the engine buffers during the update
        (``overlap_update``) are not part of it and stay."""
        metrics: dict[str, dict[str, float]] = {}
        waiting: set[str] = set()  # policies not due this step: their calls wait for their next update
        view = sampler.view()
        with sampler.copy.updating() if sampler.copy else contextlib.nullcontext():
            for name in self.optimizers:
                if (self.step + 1) % self.held.policies[name].schedule.update_every:
                    waiting.add(name)
                    continue
                extra = (shared or {}).get(name, [])
                samples = [s for s in view.values() if s.policy == name and s.reward is not None] + extra
                samples, stale = fresh_samples(samples, self.updates[name], self.held.policies[name].max_staleness)
                # data parallel: the ranks update together or not at all (a rank whose share of the
                # calls is empty, as async rollouts can leave it, still joins the others' collectives)
                if (self.dp.sum(float(len(samples))) if self.dp is not None else samples):
                    metrics[name] = self.update(name, samples, len(extra))
                    metrics[name].update(stale)
                elif stale["stale_dropped"]:  # every call was too stale: no update, but say what was dropped
                    metrics[name] = stale
        updated = [n for n, m in metrics.items() if "loss" in m]
        if updated:
            sampler.publish(updated, self.updates)
            if self.held.sharded is not None:  # fsdp: gathering the full weights into the engine's copy
                for n in updated:
                    metrics[n].update(weight_sync_s=sampler.copy.gathered[0],
                                      weight_sync_gb=sampler.copy.gathered[1] / 2**30)
        self.last_advantages = {
            s.call_id: (sum(s.token_adv) / len(s.token_adv) if s.token_adv else s.advantage)
            for s in view.values() if s.reward is not None and s.policy in updated}
        unrewarded = sum(1 for s in view.values() if s.reward is None)  # pending, under keep_pending
        for m in metrics.values():
            m["unrewarded_calls"] = float(unrewarded)
        sampler.forget([k for k, s in view.items() if not ((s.policy in waiting and s.reward is not None)
                                                             or (keep_pending and s.reward is None))])
        self.step += 1
        return metrics

    def update(self, name: str, samples: list[Sample], n_shared: int) -> dict[str, float]:
        """One update of policy ``name``; its metrics: ``update_s``, ``lr``, offload and GPU memory figures
        besides the loss terms ``Learner.train`` returns."""
        spec, opt = self.held.policies[name], self.optimizers[name]
        sched = spec.schedule
        lr = spec.optim.lr * lr_factor(self.updates[name], warmup=sched.warmup_updates, total=sched.total_updates,
                                       decay=sched.decay, min_ratio=sched.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        t_in = time.perf_counter()
        ref_moved = self.held.ref_stash.moved_s
        moved = opt.reload() if spec.offload_optimizer else 0
        held_before = memory.reset_peak(self.device) if self.device.startswith("cuda") else 0
        t0 = time.perf_counter()
        try:
            m = self.learner.train(name, samples, opt, spec.optim.grad_clip, seed=self.seed + self.step,
                                   reward_stats=self.reward_stats.setdefault(name, RunningMoments()),
                                   critic=self.critics.get(name), dp=self.dp,
                                   estimator_state=self.estimator_state.setdefault(name, {}))
        except RuntimeError as e:  # torch's OutOfMemoryError, or cuBLAS and cuDNN running out in their own words
            free, total = self._device_memory()
            if not isinstance(e, torch.OutOfMemoryError) and not memory.memory_failure(str(e), free, total):
                raise
            raise MasrlError(memory.update_oom_message(name, self.algo, device=self.device, held=held_before,
                                                       free=free, total=total,
                                                       earlier_extra_gib=self.update_extra.get(name),
                                                       detail=str(e))) from e
        m["update_s"] = time.perf_counter() - t0
        m["shared_calls"] = float(n_shared)
        if self.held.ref_stash.moved_s > ref_moved:
            m["reference_offload_s"] = self.held.ref_stash.moved_s - ref_moved
        if spec.offload_optimizer:
            t1 = time.perf_counter()
            moved += opt.offload()
            m["offload_s"] = (t0 - t_in) + (time.perf_counter() - t1)
            m["offload_gb"] = moved / 2**30
        m["lr"] = lr
        m["optimizer_state_gb"] = opt.moment_bytes() / 2**30  # this process's AdamW moments (its share)
        if self.device.startswith("cuda"):  # this update's peak, and what it added to what was held before
            peak = torch.cuda.max_memory_allocated(self.device)
            m["gpu_peak_gb"] = peak / 2**30
            m["update_extra_gib"] = (peak - held_before) / 2**30
            self.update_extra[name] = max(self.update_extra.get(name, 0.0), m["update_extra_gib"])
        self.updates[name] += 1
        if name in self.emas:
            self.emas[name].update()
        return m

    def _device_memory(self) -> tuple[int, int]:
        """(free, total) bytes of the worker's GPU; (0, 0) on a CPU or a device past answering."""
        if self.device.startswith("cuda"):
            with contextlib.suppress(Exception):
                return torch.cuda.mem_get_info(self.device)
        return 0, 0

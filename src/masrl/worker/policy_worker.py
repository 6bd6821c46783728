"""PolicyWorker: owns the weights of one model in memory and the policies on it.

A worker holds one HeldModel (a full model with its policy, or a frozen base with one LoRA
adapter per policy), its engine, one optimizer per trainable policy, and the buffer of the
calls it served (exact token ids and sampling logprobs, keyed by ``call_id``). Every method
takes and returns plain picklable data, so the same class runs in-process or as a Ray actor.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

import torch

from masrl.algorithms.estimators import needs_critic, needs_reference
from masrl.algorithms.normalize import RunningMoments
from masrl.algorithms.schedules import WeightEMA
from masrl.config import AlgorithmConfig
from masrl.engines.base import Engine, make_engine
from masrl.messages import GenCall, GenResult
from masrl.models import stop_token_ids
from masrl.policies import PolicySpec
from masrl.worker.interface import PolicyHost
from masrl.worker.model import checkpoint as saving
from masrl.worker.model import memory
from masrl.worker.model.held import HeldModel
from masrl.worker.model.offload import PinnedStash
from masrl.worker.model.precision import MasterWeightsAdamW, param_dtype
from masrl.worker.model.weight_copy import WeightCopy
from masrl.worker.sampler import sampler as generating
from masrl.worker.sampler.prompts import PromptRenderer
from masrl.worker.updater import updater as updating
from masrl.worker.updater.training import Sample


class PolicyWorker(PolicyHost):
    def __init__(self, model_name: str, policies: list[PolicySpec], algo: AlgorithmConfig | None = None, *,
                 device: str = "cpu", precision: str = "auto", seed: int = 0, engine: str = "auto",
                 engine_options: dict | None = None, threads: int | None = None, name: str | None = None,
                 overlap_update: bool = False, rollout_device: str | None = None):
        if threads:  # in a process of its own (a Ray actor): the run's thread count applies here too
            torch.set_num_threads(threads)
        self.name = name or "worker-" + "-".join(p.name for p in policies)
        self.algo = algo or AlgorithmConfig()
        self.seed = seed
        self.device = device
        # fsdp: the host keeps fp32 weights (the shards become the masters); compute runs in `compute`
        self.fsdp = any(p.fsdp for p in policies)
        compute = param_dtype(precision, device)
        self.host = HeldModel(model_name, policies, device=device, dtype=torch.float32 if self.fsdp else compute,
                              seed=seed, need_reference=needs_reference(self.algo), need_critic=needs_critic(self.algo))
        tok = self.host.tokenizer
        self.pad_id = tok.pad_token_id
        self.prompts = PromptRenderer(tok)  # remembers recent turns, to continue a conversation exactly
        self.optimizers: dict[str, MasterWeightsAdamW] = {}
        for spec in policies:
            if spec.trainable:
                o = spec.optim
                self.optimizers[spec.name] = MasterWeightsAdamW(
                    self.host.policy_parameters(spec.name), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
                )
                if spec.offload_optimizer:
                    self.optimizers[spec.name].offload()
        # overlap_update: the engine samples from its own copy of the trainable weights (WeightCopy),
        # so an update can run while it generates; the buffer then takes calls during an update.
        # rollout_device: that copy (whole) lives on another device, and the engine samples there
        self.rollout_device = rollout_device if rollout_device and rollout_device != device else None
        self.copy = None
        if self.fsdp:  # the engine samples from a full copy, gathered from the shards after each update
            from masrl.worker.parallel.sharding import EngineWeights

            self.copy = EngineWeights(self.host.model, compute)
        elif (overlap_update and self.optimizers) or self.rollout_device:
            self.copy = WeightCopy(self.host.model, {n: self.host.policy_parameters(n) for n in self.optimizers},
                                   device=self.rollout_device)
        self.overlaps_update = overlap_update and self.copy is not None
        self._engine_lock = self.copy.lock if self.copy else contextlib.nullcontext()  # a batch, or a publish
        self.engine: Engine = make_engine(engine, self.copy.model if self.copy else self.host.model, tok,
                                          stop_token_ids(tok, self.host.core), device=self.rollout_device or device,
                                          seed=seed, **(engine_options or {}))
        # a paged engine under overlap_update takes new weights between two steps, mid-call (at_boundary):
        # its batches then hold no lock, and a publish never waits for the longest running call
        self.swaps_mid_call = self.overlaps_update and not self.fsdp and self.engine.swaps_between_steps
        self.joins_batches = self.engine.joins_running_decode
        memory.enroll(self, {device, self.engine_device})
        self._buffer_lock = threading.Lock()
        self.buffer: dict[str, Sample] = {}
        self.estimator_state: dict[str, dict] = {}  # per policy: the estimator's own across updates (RAE's baselines)
        self.reward_stats: dict[str, RunningMoments] = {}  # per policy, for algorithm.reward_norm: running
        self.critics: dict = {}  # policy -> Critic (a separate value model; set by the builder)
        self.updates: dict[str, int] = {n: 0 for n in self.optimizers}  # updates done per policy (LR schedule)
        self.published = dict(self.updates)  # the version of the weights the engine samples from, per policy
        self.update_extra: dict[str, float] = {}  # GiB the largest update so far added to what was held (CUDA)
        self.emas = {n: WeightEMA(self.host.policy_parameters(n), spec.schedule.ema)
                     for n, spec in self.host.policies.items() if n in self.optimizers and spec.schedule.ema}
        self.last_advantages: dict[str, float] = {}
        self.step = 0
        # offload_weights: between this worker's generating and its update, its weights (and
        # EMA copies) wait in pinned CPU memory; the engine drops its device buffers meanwhile
        self.offload_weights = any(p.offload_weights for p in policies)
        self.dp = None  # DataParallel: this worker is one rank of a data-parallel policy
        self._ema_stash = PinnedStash()
        self._weights_moved = (0.0, 0)  # (seconds, bytes) already reported in update metrics

    @property
    def policy_names(self) -> list[str]:
        return list(self.host.policies)

    @property
    def specs(self) -> dict[str, PolicySpec]:
        return dict(self.host.policies)

    @property
    def tokenizer(self):
        return self.host.tokenizer

    def attach_critic(self, policy: str, critic) -> None:
        """``policy``'s separate value model (``Critic``), which other policies may share; it scores
        this worker's token ids, so it must have this worker's tokenizer."""
        if critic.tokenizer.get_vocab() != self.host.tokenizer.get_vocab():
            from masrl.errors import ConfigError

            raise ConfigError(f"critics.{critic.name}: its model '{critic.model_name}' has another tokenizer than "
                              f"policy '{policy}'; the critic scores the policy's token ids, so give it a model on "
                              f"the same tokenizer")
        self.critics[policy] = critic

    def build_critic(self, policy: str, name: str, model: str, optim, seed: int) -> None:
        """Build critic ``name`` here (once; a second policy of this worker shares it) for ``policy``:
        what a remote worker does instead of receiving a model."""
        from masrl.worker.updater.critic import Critic

        built = {c.name: c for c in self.critics.values()}
        self.attach_critic(policy, built.get(name) or Critic(name, model, optim, device=self.device, seed=seed))

    @staticmethod
    def free_port() -> int:
        """A TCP port free on this worker's host (rank 0's rendezvous)."""
        import socket

        with socket.socket() as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]

    def join_ranks(self, init_method: str, rank: int, world: int, backend: str = "gloo") -> None:
        """Become rank ``rank`` of ``world`` copies of this worker's policy (data parallel)."""
        from masrl.worker.parallel.data_parallel import init_ranks

        self.dp = init_ranks(init_method, rank, world, backend)
        for name, opt in self.optimizers.items():
            if self.host.policies[name].shard_optimizer:
                opt.shard(rank, world)
        if self.fsdp:
            from masrl.worker.parallel.sharding import shard_worker

            shard_worker(self, world)

    def get_tokenizer(self):
        return self.host.tokenizer

    def where(self) -> list[dict]:
        """This process: its name, pid and device; inside a Ray actor also the node id and the GPUs
        Ray gave it (it sees them as cuda:0, cuda:1, ...)."""
        import os

        at = {"name": self.name, "pid": os.getpid(), "device": self.device}
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            at.update(node_id=ray.get_runtime_context().get_node_id(), gpus=[str(g) for g in ray.get_gpu_ids()])
        return [at]

    def take_memory(self) -> list[dict]:
        return memory.host_rows(self)

    @property
    def engine_device(self) -> str:
        return str(self.engine.device)

    def get_step(self) -> int:
        return self.step

    def take_traffic(self) -> dict[str, list[float]]:
        return {}  # nothing crosses a process to reach this object; a RemoteHost counts what reaches an actor

    def close(self) -> None:
        """The run is over: its engine's KV pool, graphs and buffers go now, not whenever this worker
        is collected (a paged engine's pool is a fixed share of the device: a second run built in
        this process would otherwise find it taken)."""
        memory.unclaim(self)  # the next run's host in this process reports the device's peak
        try:
            self.engine.release()
        except RuntimeError:  # calls still running (a cancelled episode's batch): they keep what they use
            pass

    @property
    def trainable_names(self) -> list[str]:
        return [n for n, p in self.host.policies.items() if p.trainable]

    # -- rollout -------------------------------------------------------------------------------
    def render(self, messages: list[dict], template_kwargs: dict | None = None, tools: list[dict] | None = None,
               extends: str | None = None, call_id: str | None = None) -> list[int]:
        """Prompt token ids (``worker.prompts``); ``extends``: the call these messages continue;
        ``call_id``: the call this prompt is for (remembered once its completion is known)."""
        text, ids = self.prompts.render(messages, template_kwargs, tools, extends)
        if call_id is not None:
            self.prompts.pending[call_id] = text
        return ids

    def park(self) -> None:
        """With ``offload_weights``: this worker's weights to CPU memory until it next generates,
        scores or updates. The controller parks every such worker before the updates."""
        if not self.offload_weights or self.host.parked:
            return
        self.engine.release()
        self.host.park()
        self._ema_stash.out([t for e in self.emas.values() for t in e.shadow])

    def _resident(self) -> None:
        if self.host.parked:
            self.host.unpark()
            self._ema_stash.back([t for e in self.emas.values() for t in e.shadow])

    def generate(self, calls: list[GenCall], on_result=None) -> list[GenResult | Exception]:
        """Each call checked, rendered and tokenised on its own, then one engine batch
        (``worker.generating``)."""
        return generating.generate(self, calls, on_result)

    def context_limit(self) -> int:
        """The most tokens a prompt and its completion may hold (the model's position limit)."""
        return int(getattr(self.host.core.config, "max_position_embeddings", None) or 1 << 30)

    # -- rewards and updates -------------------------------------------------------------------
    def commit_rewards(self, rewards: dict[str, float]) -> int:
        """Attach rewards to buffered calls; returns how many matched."""
        n = 0
        for call_id, r in rewards.items():
            s = self.buffer.get(call_id)
            if s is not None:
                s.reward = float(r)
                n += 1
        return n

    def advantages(self) -> dict[str, float]:
        """``{call_id: advantage}`` the last update used (plain data, for traces and the report)."""
        return dict(self.last_advantages)

    def drop(self, call_ids: list[str]) -> int:
        with self._buffer_lock:
            return sum(self.buffer.pop(c, None) is not None for c in call_ids)

    @torch.no_grad()
    def score(self, policy: str, samples: list[Sample]) -> list[list[float]]:
        """``policy``'s logprobs of each sample's completion tokens (at the sample's temperature)."""
        from masrl.worker.updater.batching import make_batch
        from masrl.worker.updater.training import choose_layout, completion_forward

        self._resident()
        layout = choose_layout(self.host, self.algo)
        if layout == "prefix":
            layout = "padded"
        out = []
        for i in range(0, len(samples), self.algo.micro_batch_size):
            mb = samples[i:i + self.algo.micro_batch_size]
            batch = make_batch(mb, self.pad_id, layout=layout, device=self.host.device)
            with self.host.active(policy):
                lp, _, _ = completion_forward(self.host, self.host.core, batch)
            out += [lp[j, : len(s.completion_ids)].tolist() for j, s in enumerate(mb)]
        return out

    def rewarded(self, policies: list[str]) -> list[Sample]:
        """This worker's rewarded calls of ``policies`` (for other policies' ``share_from``)."""
        return [s for s in self.buffer.values() if s.policy in policies and s.reward is not None]

    def train_step(self, shared: dict[str, list[Sample]] | None = None,
                   keep_pending: bool = False) -> dict[str, dict[str, float]]:
        """Update every trainable policy on its rewarded calls (plus calls ``shared`` into it from
        other policies), then clear the buffer (``keep_pending``: but for calls not rewarded yet).
        With ``overlap_update`` the engine keeps generating meanwhile: calls it buffers during the
        update are not part of it and stay."""
        metrics: dict[str, dict[str, float]] = {}
        waiting: set[str] = set()  # policies not due this step: their calls wait for their next update
        memory.give_back_freed()  # what the rollout freed (its KV caches) before the update allocates
        self._resident()
        with self._buffer_lock:
            view = dict(self.buffer)
        with self.copy.updating() if self.copy else contextlib.nullcontext():
            for name in self.optimizers:
                if (self.step + 1) % self.host.policies[name].schedule.update_every:
                    waiting.add(name)
                    continue
                extra = (shared or {}).get(name, [])
                samples = [s for s in view.values() if s.policy == name and s.reward is not None] + extra
                samples, stale = updating.fresh_samples(samples, self.updates[name],
                                                        self.host.policies[name].max_staleness)
                # data parallel: the ranks update together or not at all (a rank whose share of the
                # calls is empty, as async rollouts can leave it, still joins the others' collectives)
                if (self.dp.sum(float(len(samples))) if self.dp is not None else samples):
                    metrics[name] = self._update(name, samples, len(extra))
                    metrics[name].update(stale)
                elif stale["stale_dropped"]:  # every call was too stale: no update, but say what was dropped
                    metrics[name] = stale
        updated = [n for n, m in metrics.items() if "loss" in m]
        if updated:
            self._publish(updated)
            self._sync_metrics(metrics, updated)
        self.last_advantages = {
            s.call_id: (sum(s.token_adv) / len(s.token_adv) if s.token_adv else s.advantage)
            for s in view.values() if s.reward is not None and s.policy in updated}
        unrewarded = sum(1 for s in view.values() if s.reward is None)  # pending, under keep_pending
        for m in metrics.values():
            m["unrewarded_calls"] = float(unrewarded)
        gone = [k for k, s in view.items()
                if not ((s.policy in waiting and s.reward is not None) or (keep_pending and s.reward is None))]
        with self._buffer_lock:
            for k in gone:
                self.buffer.pop(k, None)
        self.step += 1
        if self.offload_weights:
            self._park_after_update(metrics)
        memory.give_back_freed()
        return metrics

    def _sync_metrics(self, metrics: dict[str, dict[str, float]], updated: list[str]) -> None:
        """fsdp: the seconds and bytes of gathering the full weights into the engine's copy."""
        if self.host.sharded is not None:
            for n in updated:
                metrics[n].update(weight_sync_s=self.copy.gathered[0], weight_sync_gb=self.copy.gathered[1] / 2**30)

    def _publish(self, policies: list[str] | None = None) -> None:
        """The engine samples the live weights of ``policies`` (default: all) from its next batch on
        (``swaps_mid_call``: from its next step on, running calls included)."""
        def swap():
            with self._engine_lock:
                if self.copy:
                    self.copy.publish(policies)
                self.engine.weights_updated(policies)
                stale = self.engine.stale_weights()
                if stale:  # it would go on sampling the old policy under the new version's name
                    raise RuntimeError(f"the rollout engine did not take the new weights of "
                                       f"{', '.join(policies or list(self.updates))} (still the old: "
                                       f"{', '.join(stale[:4])}{' ...' if len(stale) > 4 else ''}); stopping "
                                       f"rather than training on calls sampled from the old policy")
                for p in policies if policies is not None else list(self.updates):
                    if p in self.updates:
                        self.published[p] = self.updates[p]

        if self.swaps_mid_call:
            self.engine.at_boundary(swap)
        else:
            swap()

    def _update(self, name: str, samples: list[Sample], n_shared: int) -> dict[str, float]:
        """One update of policy ``name`` (``updating.update_policy``); its metrics."""
        return updating.update_policy(self, name, samples, n_shared)

    def _park_after_update(self, metrics: dict[str, dict[str, float]]) -> None:
        self.park()
        moved_s = self.host.stash.moved_s + self._ema_stash.moved_s
        moved_b = self.host.stash.moved_bytes + self._ema_stash.moved_bytes
        for m in metrics.values():  # every trip since the last update: in for the rollout, out, in, out
            m["weights_offload_s"] = moved_s - self._weights_moved[0]
            m["weights_offload_gb"] = (moved_b - self._weights_moved[1]) / 2**30
        self._weights_moved = (moved_s, moved_b)

    # -- state ---------------------------------------------------------------------------------
    def save(self, directory: str, *, weights_only: bool = False) -> None:
        """Every trainable policy's state (a frozen policy never changes: nothing to save)."""
        saving.save_worker(self, Path(directory), weights_only=weights_only)

    def load(self, directory: str, *, with_optimizer: bool = True) -> None:
        saving.load_worker(self, Path(directory), with_optimizer=with_optimizer)

    def begin_eval(self) -> None:
        """``evaluating`` in two calls (what a remote caller can make)."""
        if not self.emas:
            return
        self._eval_stack = ExitStack()
        for ema in self.emas.values():
            self._eval_stack.enter_context(ema.swapped_in())
        self._publish(list(self.emas))

    def end_eval(self) -> None:
        stack = self.__dict__.pop("_eval_stack", None)
        if stack is not None:
            stack.close()
            self._publish(list(self.emas))
        memory.give_back_freed()  # what the evaluation's batches freed

    def load_weights(self, policy: str, directory: str) -> None:
        saving.load_weights_into(self, policy, Path(directory))

    def fingerprint(self, policy: str) -> list[float]:
        """A cheap summary of a policy's weights (sum and sum of squares), to tell if they changed;
        summed on the CPU, so that equal weights give equal numbers wherever they are kept. Sharded
        (fsdp): the engine's full copy, gathered at the last update."""
        with torch.no_grad():
            live = list(self.copy.model.parameters()) if self.host.sharded is not None else \
                self.host.policy_parameters(policy)
            params = [p.detach().to("cpu", torch.float64) for p in live]
            return [float(sum(p.sum() for p in params)), float(sum((p ** 2).sum() for p in params))]

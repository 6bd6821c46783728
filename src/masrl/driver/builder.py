"""Construct a run from its checked plan: hosts of policies (in this process or Ray actors),
one batcher per host, the workflow's tools, critics and the controller.

Every check of the config happened before, in ``driver.checks.check_run``; the only ones left
here need loaded models (policies that share calls need one tokenizer).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from masrl.agents import AgentSpec
from masrl.config import RunConfig
from masrl.driver.checks import RunPlan, check_run
from masrl.driver.rollout.batcher import Batcher
from masrl.driver.rollout.controller import Controller
from masrl.driver.rollout.services import Services
from masrl.driver.rollout.shared_lock import SharedLock
from masrl.engines.base import auto_kind
from masrl.errors import ConfigError
from masrl.policies import PolicySpec
from masrl.worker.interface import PolicyHost


def group_hosts(policies: list[PolicySpec]) -> list[tuple[str, list[PolicySpec]]]:
    """LoRA policies on the same base share a host (and its device); so does a frozen full-model
    policy on that same model (served by the base with adapters off, not a second copy). Every
    other full-model policy gets its own host."""
    groups: list[tuple[str, list[PolicySpec]]] = []
    lora_groups: dict[tuple[str, str], list[PolicySpec]] = {}
    for p in policies:
        if p.is_lora:
            key = (p.model, p.device)
            if key not in lora_groups:
                lora_groups[key] = []
                groups.append((p.model, lora_groups[key]))
            lora_groups[key].append(p)
    for p in policies:
        if p.is_lora:
            continue
        shared = lora_groups.get((p.model, p.device))
        if shared is not None and not p.trainable:
            shared.append(p)
        else:
            groups.append((p.model, [p]))
    return groups


def _check_sharing(policies: list[PolicySpec], workers: list[PolicyHost]) -> None:
    """Shared calls are reused as tokens: a policy learns from another's calls only on one tokenizer."""
    worker_of = {p: w for w in workers for p in w.policy_names}
    for spec in policies:
        for src in spec.share_from:
            a, b = worker_of[spec.name].get_tokenizer(), worker_of[src].get_tokenizer()
            if a is not b and a.get_vocab() != b.get_vocab():
                raise ConfigError(f"policies.{spec.name}.share_from: '{src}' uses another tokenizer "
                                  f"({len(b)} tokens vs {len(a)}); shared calls are reused as token ids, so both "
                                  f"policies need the same tokenizer")


def engine_options(r, device: str) -> dict:
    """The rollout settings the engine a worker on ``device`` gets takes (``auto`` as ``auto_kind`` resolves
    it; a model the lean forward cannot run falls back to the eager engine, which takes none of them)."""
    kind = auto_kind(device) if r.engine == "auto" else r.engine
    if kind == "paged":
        return {"cuda_graphs": r.cuda_graphs, "max_batch_size": r.max_batch_size, "sync_every": r.sync_every,
                "gpu_memory_utilization": r.gpu_memory_utilization, "block_size": r.kv_block_size,
                "graph_prefill": r.graph_prefill, "overlap_chunks": r.overlap_chunks}
    if kind == "vllm":
        return {"cuda_graphs": r.cuda_graphs, "max_batch_size": r.max_batch_size,
                "gpu_memory_utilization": r.gpu_memory_utilization}
    return {}


@dataclass
class Runtime:
    workflow: object
    agents: dict[str, AgentSpec]
    workers: list[PolicyHost]
    controller: Controller
    critics: dict = field(default_factory=dict)
    placement: object | None = None  # RayPlacement with runtime.placement ray

    def close(self) -> None:
        """Stop what this runtime started (Ray actors, their placement group, a local Ray cluster)."""
        if self.placement is not None:
            self.placement.close()
            self.placement = None
        for w in self.workers:
            w.close()


def build_runtime(cfg: RunConfig, *, log=print, plan: RunPlan | None = None) -> Runtime:
    """Check the config (unless ``plan`` is its checked plan already), then build the run."""
    plan = plan or check_run(cfg)
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    workers, placement = build_hosts(cfg, plan.policies, log)
    batchers = _batchers(cfg, workers, placement is not None)
    workflow = plan.workflow
    make_tools = plan.hooks.tools
    tools = make_tools(Services(cfg.sandbox, cfg.retriever, cfg.data.world)) if make_tools else {}
    _check_sharing(plan.policies, workers)
    critics = build_critics(cfg, plan.policies, workers, log)
    controller = Controller(workflow, plan.agents, workers, batchers, plan.allocators, cfg.rollout, tools=tools,
                            hooks=plan.hooks)
    return Runtime(workflow, plan.agents, workers, controller, critics, placement)


def build_hosts(cfg: RunConfig, policies: list[PolicySpec], log=print) -> tuple[list[PolicyHost], object | None]:
    """One host per model in memory (in this process, or a Ray actor per host or rank), then one per
    policy served by an endpoint; and the Ray placement when there is one."""
    r = cfg.rollout
    hosts = group_hosts([p for p in policies if p.engine is None])
    kwargs = [dict(algo=cfg.algorithm, device=specs[0].device, precision=cfg.precision, seed=cfg.seed + i,
                   engine=r.engine, rollout_device=specs[0].rollout_device,
                   engine_options=engine_options(r, sampling_device(specs[0])))
              for i, (_, specs) in enumerate(hosts)]
    if cfg.runtime.placement != "ray":  # a Ray actor runs one call at a time: it cannot generate while it updates
        for k, (_, specs) in zip(kwargs, hosts):
            k["overlap_update"] = overlaps_update(r, specs)
    for (model, specs) in hosts:
        kind = "LoRA adapters " + ", ".join(s.name for s in specs) if specs[0].is_lora else f"full model for {specs[0].name}"
        log(f"[masrl] loading {model} ({kind}) on {specs[0].device}"
            + (" in a Ray actor" if cfg.runtime.placement == "ray" else ""))
    placement = None
    if cfg.runtime.placement == "ray":
        from masrl.driver.placement.ray_placement import RayPlacement

        for k in kwargs:
            k["threads"] = cfg.threads
        placement = RayPlacement(hosts, kwargs, strategy=cfg.runtime.strategy, address=cfg.runtime.address, log=log)
        workers: list[PolicyHost] = list(placement.workers)
    else:
        from masrl.worker.policy_worker import PolicyWorker  # torch: only when the driver hosts policies itself

        workers = [PolicyWorker(model, specs, name=f"masrl-worker{i}-{'-'.join(s.name for s in specs)}", **k)
                   for i, ((model, specs), k) in enumerate(zip(hosts, kwargs))]
    served = [p for p in policies if p.engine is not None]
    if served:
        from masrl.worker.endpoint import EndpointHost

        for p in served:
            log(f"[masrl] policy {p.name}: served by {p.engine.base_url} (model {p.engine.model})")
        workers += [EndpointHost(p, p.engine) for p in served]
    return workers, placement


def overlaps_update(r, specs: list[PolicySpec]) -> bool:
    """``rollout.overlap_update`` resolved for one host of ``specs``."""
    if r.mode != "async" or r.overlap_update is False or any(s.offload_weights for s in specs):
        return False
    return r.overlap_update is True or (sampling_device(specs[0]).startswith("cuda")
                                         and r.engine in ("auto", "hf", "paged"))


def sampling_device(spec: PolicySpec) -> str:
    """Where a policy's engine samples: its ``rollout_device``, else where it trains."""
    return spec.rollout_device or spec.device


PAGED_BATCHES = 64  # batches in flight at once per paged host (each waits in a thread of its batcher's own)
JOIN_WAIT_MS = 1.0  # the longest a paged host's batcher waits to fill a batch: a call joins the running decode


def _batchers(cfg: RunConfig, workers: list[PolicyHost], on_ray: bool) -> list[Batcher]:
    """One batcher per host. Hosts in this process on one device take turns (a compute lock): one
    engine batch at a time. A paged host's batches run at once (their calls join one decode) under a
    ``SharedLock`` of its own, which its update takes alone (unless its engine samples a copy)."""
    locks: dict[str, threading.Lock] = {}
    out = []
    for i, w in enumerate(workers):
        spec = w.specs[w.policy_names[0]]
        elsewhere = on_ray or spec.engine is not None  # not on this process's cores
        # the paged engine takes a new batch's calls into its running decode: batches overlap, no lock
        joins = w.joins_batches and not elsewhere
        lock = None if elsewhere else SharedLock() if joins else locks.setdefault(sampling_device(spec), threading.Lock())
        wait = min(cfg.rollout.max_wait_ms, JOIN_WAIT_MS) if joins else cfg.rollout.max_wait_ms
        out.append(Batcher(w.generate, max_batch_size=cfg.rollout.max_batch_size, max_wait_ms=wait,
                           compute_lock=lock, name=f"worker{i}", concurrent=PAGED_BATCHES if joins else 1,
                           streams=joins,  # its calls come back one by one as each finishes
                           # a call whose episode was cancelled mid-batch was sampled and kept: forget it
                           on_orphan=lambda gen, w=w: w.drop([gen.call_id])))
    return out


def build_critics(cfg: RunConfig, policies: list[PolicySpec], workers: list[PolicyHost], log=print) -> dict:
    """One ``Critic`` per entry of ``critics``, handed to the workers of the policies it serves."""
    from masrl.worker.updater.critic import Critic

    host_of = {p: w for w in workers for p in w.policy_names}
    out = {}
    for i, (name, c) in enumerate(cfg.critics.items()):
        served = [s for s in policies if s.critic == name]
        model = c.model or served[0].model
        if cfg.runtime.placement == "ray":  # built inside the actor of the policies it serves
            actors = {id(host_of[s.name]) for s in served}
            if len(actors) > 1:
                raise ConfigError(f"critics.{name}: with runtime.placement ray a critic lives in one actor, but "
                                  f"{', '.join(s.name for s in served)} are on different ones; give each its own critic "
                                  f"or use runtime.placement local")
            log(f"[masrl] loading critic {name} ({model}) in the actor of {', '.join(s.name for s in served)}")
            for s in served:
                host_of[s.name].build_critic(s.name, name, model, c.optim, cfg.seed + 1000 + i)
            out[name] = f"remote:{name}"
            continue
        log(f"[masrl] loading critic {name} ({model}) on {served[0].device} for {', '.join(s.name for s in served)}")
        critic = Critic(name, model, c.optim, device=served[0].device, seed=cfg.seed + 1000 + i)
        for s in served:
            host_of[s.name].attach_critic(s.name, critic)
        out[name] = critic
    return out

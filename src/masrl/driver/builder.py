"""Turn a RunConfig into plain objects: agents, policies, workers, batchers, controller, tasks.

All validation that needs the workflow (agent names) or the disk (models, dataset files)
happens here, before any model is loaded, so a bad config fails in a second with one message.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from masrl.agents import AgentSpec
from masrl.algorithms.estimators import check_estimator, needs_critic, needs_reference
from masrl.config import RunConfig
from masrl.driver.batcher import Batcher
from masrl.driver.controller import Controller
from masrl.driver.services import Services
from masrl.driver.tasks import build_tasks, load_tasks  # noqa: F401 - re-exported: the builder builds tasks too
from masrl.errors import ConfigError, ModelError
from masrl.loading import load_object
from masrl.models import resolve_model
from masrl.policies import PolicySpec
from masrl.rewards import REGISTRY as REWARDS
from masrl.worker.interface import PolicyHost
from masrl.workflows import build_workflow


def build_agents(cfg: RunConfig, workflow) -> dict[str, AgentSpec]:
    roles = workflow.roles()
    for name in cfg.agents:
        if name not in roles:
            raise ConfigError(f"agents.{name}: workflow '{cfg.workflow.name}' has no agent '{name}' "
                              f"(its agents: {', '.join(roles)}); remove or rename it")
    missing = [r for r in roles if r not in cfg.agents]
    if missing:
        raise ConfigError(f"agents: workflow '{cfg.workflow.name}' needs agent(s) {', '.join(missing)}; "
                          f"add agents.{missing[0]}.policy")
    agents = {}
    for name, role in roles.items():
        a = cfg.agents[name]
        sampling = a.sampling().resolved(role.default_max_new_tokens, role.default_stop)
        template_kwargs = {**cfg.policies[a.policy].chat_template_kwargs, **a.chat_template_kwargs}
        agents[name] = AgentSpec(name, a.policy, role.parser, sampling, cfg.agent_trainable(name), template_kwargs)
    return agents


def build_policies(cfg: RunConfig) -> list[PolicySpec]:
    specs = [_policy_spec(cfg, name, p) for name, p in cfg.policies.items()]
    shared: dict[str, set[str]] = {}
    for s in specs:
        if s.is_lora:
            shared.setdefault(s.model, set()).add(s.device + (f" (rollout on {s.rollout_device})" if s.rollout_device else ""))
    for model, devices in shared.items():
        if len(devices) > 1:
            raise ConfigError(f"LoRA policies on base '{model}' share one copy of it, so they need one device; "
                              f"they ask for {', '.join(sorted(devices))}: set the same policies.<name>.device "
                              f"(and rollout_device)")
    return specs


def _policy_spec(cfg: RunConfig, name: str, p) -> PolicySpec:
    trainable = not p.frozen and any(cfg.agent_trainable(a) for a, ac in cfg.agents.items() if ac.policy == name)
    if p.engine is not None:  # served over HTTP: nothing to load, nothing to train
        if trainable:
            raise ConfigError(f"policies.{name}.engine: an OpenAI-compatible endpoint only generates; set "
                              f"policies.{name}.frozen: true (or agents.<agent>.trainable: false for its agents)")
        return PolicySpec(name, p.engine.model, trainable=False, engine=p.engine)
    try:
        resolve_model(cfg.policy_model(name), key=f"policies.{name}.model" if p.model else "model")
    except ModelError as exc:
        raise ConfigError(str(exc)) from None
    device = _policy_device(cfg, name, p)
    _check_memory_options(cfg, name, p, device)
    if p.data_parallel > 1:
        _check_data_parallel(cfg, name, p)
    sched = p.schedule
    if sched.total_updates is None:
        sched = sched.model_copy(update={"total_updates": max(1, cfg.train.steps // sched.update_every)})
    return PolicySpec(name, cfg.policy_model(name), p.lora, p.optim, trainable, device, schedule=sched,
                      offload_optimizer=p.offload_optimizer, offload_reference=p.offload_reference,
                      offload_weights=p.offload_weights, share_from=dict(p.share_from), share_is_cap=p.share_is_cap,
                      critic=p.critic, num_cpus=p.num_cpus, num_gpus=p.num_gpus, data_parallel=p.data_parallel,
                      shard_optimizer=p.shard_optimizer, max_staleness=p.max_staleness,
                      rollout_device=_rollout_device(cfg, name, p, device))


def _rollout_device(cfg: RunConfig, name: str, p, device: str) -> str | None:
    """``policies.X.rollout_device`` resolved; None when it is the training device (or unset)."""
    if p.rollout_device is None:
        return None
    key = f"policies.{name}.rollout_device"
    for bad, why in ((cfg.runtime.placement == "ray", "runtime.placement ray (an actor sees one GPU)"),
                     (p.data_parallel > 1, "data_parallel"), (p.offload_weights, "offload_weights")):
        if bad:
            raise ConfigError(f"{key}: not with {why} yet; remove one of them")
    try:
        where = resolve_device(p.rollout_device)
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return None if where == device else where


def _policy_device(cfg: RunConfig, name: str, p) -> str:
    if cfg.runtime.placement == "ray":  # its actor sees the GPU Ray gave it as cuda:0; the driver may have none
        raw = cfg.policy_device(name)
        return "cuda:0" if raw.startswith("cuda") or (raw == "auto" and (p.num_gpus or 0) > 0) else "cpu"
    try:
        return resolve_device(cfg.policy_device(name))
    except ConfigError as exc:
        raise ConfigError(f"{f'policies.{name}.device' if p.device else 'device'}: {exc}") from None


def resolve_device(name: str) -> str:
    """``auto`` | ``cpu`` | ``cuda[:i]`` -> a device this machine has (imports torch: only asked when
    the driver hosts policies itself)."""
    from masrl.worker.precision import resolve_device as resolve

    return resolve(name)


def _check_memory_options(cfg: RunConfig, name: str, p, device: str) -> None:
    """Offload and sharding options that cannot apply to this policy, by key."""
    for key in ("offload_optimizer", "offload_reference", "offload_weights"):
        if getattr(p, key) and not device.startswith("cuda"):
            raise ConfigError(f"policies.{name}.{key}: offloading moves state off a GPU, but this policy runs on "
                              f"{device}; remove it or set device: cuda")
    if p.offload_reference and (p.lora is not None or not needs_reference(cfg.algorithm)):
        raise ConfigError(f"policies.{name}.offload_reference: only a full policy with algorithm.kl_coef > 0 keeps "
                          f"a reference model (a LoRA policy's reference is its base with adapters off)")
    if p.shard_optimizer and p.data_parallel < 2:
        raise ConfigError(f"policies.{name}.shard_optimizer: shards the optimizer state over data-parallel ranks; "
                          f"set policies.{name}.data_parallel to 2 or more (and runtime.placement: ray)")
    if p.shard_optimizer and p.offload_optimizer:
        raise ConfigError(f"policies.{name}: shard_optimizer and offload_optimizer both shrink the optimizer's "
                          f"GPU memory; choose one")


def _check_data_parallel(cfg: RunConfig, name: str, p) -> None:
    key = f"policies.{name}.data_parallel"
    if cfg.runtime.placement != "ray":
        raise ConfigError(f"{key}: ranks run as Ray actors; set runtime.placement: ray (a local cluster starts on "
                          f"127.0.0.1 when there is none)")
    if needs_critic(cfg.algorithm):
        raise ConfigError(f"{key}: not with an estimator that needs a critic (algorithm.advantage "
                          f"'{cfg.algorithm.advantage}') yet: values and critics are per rank; use grpo, rloo or "
                          f"reinforce_pp")
    sharing = [n for n, q in cfg.policies.items() if name in q.share_from] + ([name] if p.share_from else [])
    if sharing or cfg.train.policy_kl:
        raise ConfigError(f"{key}: not with share_from or train.policy_kl (they read calls across workers, and a "
                          f"data-parallel policy's calls are spread over its ranks)")
    if any(q.lora is not None and q.model == p.model for q in cfg.policies.values()) and p.lora is not None:
        others = [n for n, q in cfg.policies.items() if q.lora is not None and q.model == p.model and n != name]
        if any(cfg.policies[n].data_parallel != p.data_parallel for n in others):
            raise ConfigError(f"{key}: LoRA policies on one base share its ranks; give {', '.join(others)} the same "
                              f"data_parallel")


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


def build_allocators(cfg: RunConfig) -> list:
    out = []
    for i, r in enumerate(cfg.rewards):
        if r.type == "format":
            out.append(REWARDS["format"](weight=r.weight, per_agent=dict(r.per_agent), penalty=r.penalty))
        elif r.type in ("outcome", "turn_delta", "credit", "judge", "counterfactual"):
            try:
                out.append(REWARDS[r.type](weight=r.weight, **r.options))
            except TypeError as exc:
                raise ConfigError(f"rewards.{i}: {r.type} takes no option(s) {', '.join(r.options)} ({exc})") from None
        else:
            factory = load_object(r.type, f"rewards.{i}.type")
            try:
                out.append(factory(weight=r.weight, **r.options))
            except TypeError as exc:
                raise ConfigError(f"rewards.{i}: cannot build '{r.type}' with weight and options {r.options}: {exc}") from None
    for a in out:
        if not hasattr(a, "allocate"):
            raise ConfigError(f"reward {a!r} has no allocate(trace, task) method")
    return out


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


def uses_static_engine(engine: str, device: str) -> bool:
    """Whether a worker on ``device`` may get the static engine (its options apply only then)."""
    return engine == "static" or (engine == "auto" and device.startswith("cuda"))


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


def _check_critics(cfg: RunConfig) -> None:
    """A critic serves an estimator that reads values (a 'module:function' one is known only once imported)."""
    if needs_critic(cfg.algorithm):
        return
    for name, p in cfg.policies.items():
        if p.critic is not None:
            raise ConfigError(f"policies.{name}.critic is set but algorithm.advantage '{cfg.algorithm.advantage}' "
                              f"reads no values; a critic serves gae only, or a 'module:function' estimator marked "
                              f"needs_critic (@estimator(needs_critic=True))")


def build_runtime(cfg: RunConfig, *, log=print) -> Runtime:
    workflow = build_workflow(cfg.workflow.name, cfg.workflow.options)
    check_estimator(cfg.algorithm)
    _check_critics(cfg)
    agents = build_agents(cfg, workflow)
    policies = build_policies(cfg)
    allocators = build_allocators(cfg)
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    workers, placement = build_hosts(cfg, policies, log)
    batchers = _batchers(cfg, workers, placement is not None)
    tools = workflow.tools(Services(cfg.sandbox, cfg.retriever, cfg.data.world)) if hasattr(workflow, "tools") else {}
    _check_sharing(policies, workers)
    critics = build_critics(cfg, policies, workers, log)
    controller = Controller(workflow, agents, workers, batchers, allocators, cfg.rollout, tools=tools)
    return Runtime(workflow, agents, workers, controller, critics, placement)


def build_hosts(cfg: RunConfig, policies: list[PolicySpec], log=print) -> tuple[list[PolicyHost], object | None]:
    """One host per model in memory (in this process, or a Ray actor per host or rank), then one per
    policy served by an endpoint; and the Ray placement when there is one."""
    r = cfg.rollout
    engine_options = {}
    if r.engine != "hf":
        engine_options = {"cuda_graphs": r.cuda_graphs, "sync_every": r.sync_every, "max_batch_size": r.max_batch_size}
    hosts = group_hosts([p for p in policies if p.engine is None])
    kwargs = [dict(algo=cfg.algorithm, device=specs[0].device, precision=cfg.precision, seed=cfg.seed + i,
                   engine=r.engine, rollout_device=specs[0].rollout_device,
                   engine_options=engine_options if uses_static_engine(r.engine, sampling_device(specs[0])) else {})
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
        from masrl.driver.ray_placement import RayPlacement

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
    return r.overlap_update is True or (sampling_device(specs[0]).startswith("cuda") and r.engine in ("auto", "hf", "static"))


def sampling_device(spec: PolicySpec) -> str:
    """Where a policy's engine samples: its ``rollout_device``, else where it trains."""
    return spec.rollout_device or spec.device


def _batchers(cfg: RunConfig, workers: list[PolicyHost], on_ray: bool) -> list[Batcher]:
    """One batcher per host. Hosts in this process on one device take turns (a compute lock): one
    engine batch at a time."""
    locks: dict[str, threading.Lock] = {}
    out = []
    for i, w in enumerate(workers):
        spec = w.specs[w.policy_names[0]]
        elsewhere = on_ray or spec.engine is not None  # not on this process's cores
        lock = None if elsewhere else locks.setdefault(sampling_device(spec), threading.Lock())
        out.append(Batcher(w.generate, max_batch_size=cfg.rollout.max_batch_size, max_wait_ms=cfg.rollout.max_wait_ms,
                           compute_lock=lock, name=f"worker{i}",
                           # a call whose episode was cancelled mid-batch was sampled and kept: forget it
                           on_orphan=lambda gen, w=w: w.drop([gen.call_id])))
    return out


def build_critics(cfg: RunConfig, policies: list[PolicySpec], workers: list[PolicyHost], log=print) -> dict:
    """One ``Critic`` per entry of ``critics``, handed to the workers of the policies it serves."""
    from masrl.worker.critic import Critic

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

"""Turn a RunConfig into plain objects: agents, policies, workers, batchers, controller, tasks.

All validation that needs the workflow (agent names) or the disk (models, dataset files)
happens here, before any model is loaded, so a bad config fails in a second with one message.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from masrl.agents import AgentSpec
from masrl.algorithms.estimators import check_estimator, needs_critic
from masrl.config import DataSourceConfig, RunConfig, WorldConfig
from masrl.data import arithmetic, code_gen
from masrl.data.loader import load_math_tasks
from masrl.data.tasks import Task
from masrl.engines.batcher import Batcher
from masrl.errors import ConfigError, ModelError
from masrl.models import resolve_model
from masrl.policies import PolicySpec
from masrl.rewards import REGISTRY as REWARDS
from masrl.runtime.controller import Controller
from masrl.runtime.precision import resolve_device
from masrl.runtime.services import Services
from masrl.runtime.worker import PolicyWorker
from masrl.loading import load_object
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
    specs = []
    for name, p in cfg.policies.items():
        trainable = not p.frozen and any(cfg.agent_trainable(a) for a, ac in cfg.agents.items() if ac.policy == name)
        if p.engine is not None:  # served over HTTP: nothing to load, nothing to train
            if trainable:
                raise ConfigError(f"policies.{name}.engine: an OpenAI-compatible endpoint only generates; set "
                                  f"policies.{name}.frozen: true (or agents.<agent>.trainable: false for its agents)")
            specs.append(PolicySpec(name, p.engine.model, trainable=False, engine=p.engine))
            continue
        key = f"policies.{name}.model" if p.model else "model"
        try:
            resolve_model(cfg.policy_model(name), key=key)
        except ModelError as exc:
            raise ConfigError(str(exc)) from None
        key = f"policies.{name}.device" if p.device else "device"
        if cfg.runtime.placement == "ray":  # its actor sees the GPU Ray gave it as cuda:0; the driver may have none
            raw = cfg.policy_device(name)
            device = "cuda:0" if raw.startswith("cuda") or (raw == "auto" and (p.num_gpus or 0) > 0) else "cpu"
        else:
            try:
                device = resolve_device(cfg.policy_device(name))
            except ConfigError as exc:
                raise ConfigError(f"{key}: {exc}") from None
        sched = p.schedule
        if sched.total_updates is None:
            sched = sched.model_copy(update={"total_updates": max(1, cfg.train.steps // sched.update_every)})
        for key in ("offload_optimizer", "offload_reference", "offload_weights"):
            if getattr(p, key) and not device.startswith("cuda"):
                raise ConfigError(f"policies.{name}.{key}: offloading moves state off a GPU, but this policy runs on "
                                  f"{device}; remove it or set device: cuda")
        if p.offload_reference and (p.lora is not None or cfg.algorithm.kl_coef == 0):
            raise ConfigError(f"policies.{name}.offload_reference: only a full policy with algorithm.kl_coef > 0 keeps "
                              f"a reference model (a LoRA policy's reference is its base with adapters off)")
        specs.append(PolicySpec(name, cfg.policy_model(name), p.lora, p.optim, trainable, device, schedule=sched,
                                offload_optimizer=p.offload_optimizer, offload_reference=p.offload_reference,
                                offload_weights=p.offload_weights,
                                share_from=dict(p.share_from),
                                share_is_cap=p.share_is_cap, critic=p.critic, num_cpus=p.num_cpus,
                                num_gpus=p.num_gpus, data_parallel=p.data_parallel,
                                shard_optimizer=p.shard_optimizer))
        if p.shard_optimizer and p.data_parallel < 2:
            raise ConfigError(f"policies.{name}.shard_optimizer: shards the optimizer state over data-parallel ranks; "
                              f"set policies.{name}.data_parallel to 2 or more (and runtime.placement: ray)")
        if p.shard_optimizer and p.offload_optimizer:
            raise ConfigError(f"policies.{name}: shard_optimizer and offload_optimizer both shrink the optimizer's "
                              f"GPU memory; choose one")
        if p.data_parallel > 1:
            _check_data_parallel(cfg, name, p)
    shared: dict[str, set[str]] = {}
    for s in specs:
        if s.is_lora:
            shared.setdefault(s.model, set()).add(s.device)
    for model, devices in shared.items():
        if len(devices) > 1:
            raise ConfigError(f"LoRA policies on base '{model}' share one copy of it, so they need one device; "
                              f"they ask for {', '.join(sorted(devices))}: set the same policies.<name>.device")
    return specs


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
        elif r.type in ("outcome", "turn_delta", "credit", "judge"):
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


def load_tasks(src: DataSourceConfig, *, exclude: set[str] | None = None, world: WorldConfig | None = None) -> list[Task]:
    if src.source == "qa_world":
        from masrl.data.qa_tasks import world_tasks

        world = world or WorldConfig()
        return world_tasks(src.n or 1000, seed=src.seed, world_docs=world.docs, world_seed=world.seed,
                           levels=src.levels, exclude=exclude)
    if src.source == "episodes":
        import random

        rng = random.Random(f"episodes-{src.seed}")
        seeds = [rng.getrandbits(48) for _ in range(src.n or 1000)]
        return [Task(f"ep-{src.seed}-{i}", f"episode {s}", None, {"seed": s}) for i, s in enumerate(seeds)
                if not exclude or f"episode {s}" not in exclude]
    if src.source == "arithmetic":
        return arithmetic.generate(src.n or 1000, seed=src.seed, levels=src.levels, exclude=exclude)
    if src.source == "code_gen":
        return code_gen.generate(src.n or 1000, seed=src.seed, levels=src.levels, exclude=exclude)
    if src.source == "humaneval":
        from masrl.data.code_tasks import load_humaneval

        tasks = load_humaneval()[: src.n]
    elif src.kind == "qa":
        from masrl.data.qa_tasks import load_qa_tasks

        tasks = load_qa_tasks(src.path, n=src.n)  # type: ignore[arg-type]
    elif src.kind == "code":
        from masrl.data.code_tasks import load_code_tasks

        tasks = load_code_tasks(src.path, n=src.n)  # type: ignore[arg-type]
    else:
        tasks = load_math_tasks(src.path, n=src.n)  # type: ignore[arg-type]
    if exclude:
        tasks = [t for t in tasks if t.question not in exclude]
    return tasks


def build_tasks(cfg: RunConfig) -> tuple[list[Task], list[Task]]:
    """Train and held-out tasks; generated train tasks never repeat an eval question."""
    eval_tasks = load_tasks(cfg.data.eval, world=cfg.data.world)
    train_tasks = load_tasks(cfg.data.train, exclude={t.question for t in eval_tasks}, world=cfg.data.world)
    if not train_tasks and cfg.train.steps > 0:
        raise ConfigError("data.train: no training tasks are left once the questions of data.eval are removed (every "
                          "train question is also a held-out one); point data.train and data.eval at different files "
                          "or splits")
    return train_tasks, eval_tasks


def _check_sharing(policies: list[PolicySpec], workers: list[PolicyWorker]) -> None:
    """Shared calls are reused as tokens: a policy learns from another's calls only on one tokenizer."""
    worker_of = {p: w for w in workers for p in w.policy_names}
    for spec in policies:
        for src in spec.share_from:
            a, b = worker_of[spec.name].tokenizer, worker_of[src].tokenizer
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
    workers: list[PolicyWorker]
    controller: Controller
    critics: dict = field(default_factory=dict)
    placement: object | None = None  # RayPlacement with runtime.placement ray

    def close(self) -> None:
        """Stop what this runtime started (Ray actors, their placement group, a local Ray cluster)."""
        if self.placement is not None:
            self.placement.close()
            self.placement = None
        for w in self.workers:
            if hasattr(w, "close"):
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
    workers, batchers = [], []
    locks: dict[str, threading.Lock] = {}  # workers on one device take turns: one engine batch at a time
    r = cfg.rollout
    engine_options = {}
    if r.engine != "hf":
        engine_options = {"cuda_graphs": r.cuda_graphs, "sync_every": r.sync_every, "max_batch_size": r.max_batch_size}
    served = [p for p in policies if p.engine is not None]
    hosts = group_hosts([p for p in policies if p.engine is None])
    kwargs = [dict(algo=cfg.algorithm, device=specs[0].device, precision=cfg.precision, seed=cfg.seed + i,
                   engine=r.engine, engine_options=engine_options if uses_static_engine(r.engine, specs[0].device) else {})
              for i, (_, specs) in enumerate(hosts)]
    for (model, specs) in hosts:
        kind = "LoRA adapters " + ", ".join(s.name for s in specs) if specs[0].is_lora else f"full model for {specs[0].name}"
        log(f"[masrl] loading {model} ({kind}) on {specs[0].device}"
            + (" in a Ray actor" if cfg.runtime.placement == "ray" else ""))
    placement = None
    if cfg.runtime.placement == "ray":
        from masrl.runtime.placement import RayPlacement

        for k in kwargs:
            k["threads"] = cfg.threads
        placement = RayPlacement(hosts, kwargs, strategy=cfg.runtime.strategy, address=cfg.runtime.address, log=log)
        workers = placement.workers
    else:
        workers = [PolicyWorker(model, specs, **k) for (model, specs), k in zip(hosts, kwargs)]
    if served:
        from masrl.engines.openai_api import OpenAIWorker

        for p in served:
            log(f"[masrl] policy {p.name}: served by {p.engine.base_url} (model {p.engine.model})")
        workers = list(workers) + [OpenAIWorker(p, p.engine) for p in served]
    for i, w in enumerate(workers):
        spec = w.specs[w.policy_names[0]]
        elsewhere = placement is not None or spec.engine is not None  # not on this process's cores
        lock = None if elsewhere else locks.setdefault(spec.device, threading.Lock())
        batchers.append(Batcher(w.generate, max_batch_size=r.max_batch_size, max_wait_ms=r.max_wait_ms,
                                compute_lock=lock, name=f"worker{i}"))
    tools = workflow.tools(Services(cfg.sandbox, cfg.retriever, cfg.data.world)) if hasattr(workflow, "tools") else {}
    _check_sharing(policies, workers)
    critics = build_critics(cfg, policies, workers, log)
    controller = Controller(workflow, agents, workers, batchers, allocators, cfg.rollout, tools=tools)
    return Runtime(workflow, agents, workers, controller, critics, placement)


def build_critics(cfg: RunConfig, policies: list[PolicySpec], workers: list[PolicyWorker], log=print) -> dict:
    """One ``Critic`` per entry of ``critics``, handed to the workers of the policies it serves."""
    from masrl.runtime.critic import Critic

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

"""One validation step: everything a config refers to outside itself, checked before anything loads.

``config/`` checks a config's shape (types, bounds, unknown keys, how its sections refer to each
other). What its names mean is checked here, in one pass and in this order: the data sources, the
workflow and its agents, the estimator and critics, every policy (its model on disk, its device,
its memory and placement options) and the rewards. The result is a ``RunPlan``: the plain objects
the builder then constructs from, with no check left to make but those that need a loaded model
(tokenizers shared between policies, a critic's tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass

from masrl.agents import AgentSpec
from masrl.algorithms.estimators import check_estimator, needs_critic, needs_reference
from masrl.config import RunConfig
from masrl.config.loading import build_object, load_object
from masrl.errors import ConfigError, ModelError
from masrl.families import WORKFLOWS, build_workflow, check_source
from masrl.models import resolve_model
from masrl.policies import PolicySpec
from masrl.rewards import REGISTRY as REWARDS
from masrl.workflows.base import Hooks, Workflow, hooks_of


@dataclass
class RunPlan:
    """A checked config, resolved: what the builder constructs hosts, batchers and the controller from."""

    cfg: RunConfig
    workflow: Workflow
    agents: dict[str, AgentSpec]
    policies: list[PolicySpec]
    allocators: list
    hooks: Hooks  # the workflow's optional parts, found once here


def check_run(cfg: RunConfig) -> RunPlan:
    """Every check that needs more than the config itself; the first failure is a ``ConfigError``
    naming the key and the fix."""
    for split in ("train", "eval"):
        check_source(getattr(cfg.data, split), f"data.{split}")
    workflow = build_workflow(cfg.workflow.name, cfg.workflow.options)
    hooks = hooks_of(workflow)
    check_split = hooks.check_split
    for split in ("train", "eval"):  # a split's options that the workflow reads (a game's seating)
        src = getattr(cfg.data, split)
        if check_split is not None:
            check_split(src, f"data.{split}")
        elif src.source == "episodes" and src.options:
            readers = sorted(n for n, c in WORKFLOWS.items() if hooks_of(c).check_split is not None)
            raise ConfigError(f"data.{split}.options: the seating of source 'episodes' is read by the workflows that "
                              f"seat players ({', '.join(readers)}), not '{cfg.workflow.name}'; remove them")
    agents = check_agents(cfg, workflow)
    check_estimator(cfg.algorithm)
    check_critics(cfg)
    policies = check_policies(cfg)
    allocators = check_rewards(cfg)
    return RunPlan(cfg, workflow, agents, policies, allocators, hooks)


def check_agents(cfg: RunConfig, workflow) -> dict[str, AgentSpec]:
    """The config's agents are exactly the workflow's; each resolved with its role's defaults."""
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


def check_critics(cfg: RunConfig) -> None:
    """A critic serves an estimator that reads values (a 'module:function' one is known only once imported)."""
    if needs_critic(cfg.algorithm):
        return
    for name, p in cfg.policies.items():
        if p.critic is not None:
            raise ConfigError(f"policies.{name}.critic is set but algorithm.advantage '{cfg.algorithm.advantage}' "
                              f"reads no values; a critic serves gae only, or a 'module:function' estimator marked "
                              f"needs_critic (@estimator(needs_critic=True))")


def check_policies(cfg: RunConfig) -> list[PolicySpec]:
    """Every policy resolved to a ``PolicySpec``; LoRA policies on one base share its device."""
    specs = [_policy_spec(cfg, name, p) for name, p in cfg.policies.items()]
    _check_snapshots(cfg, {s.name: s for s in specs})
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
                      shard_optimizer=p.shard_optimizer, fsdp=p.fsdp, max_staleness=p.max_staleness,
                      rollout_device=_rollout_device(cfg, name, p, device), snapshot_of=p.snapshot_of,
                      snapshot_every=p.snapshot_every)


def _check_snapshots(cfg: RunConfig, specs: dict[str, PolicySpec]) -> None:
    """An opponent pool's members: frozen full models of the policy they trail, in this process."""
    for name, s in specs.items():
        src = s.snapshot_of
        if src is None:
            continue
        key = f"policies.{name}.snapshot_of"
        if src not in specs:
            raise ConfigError(f"{key}: no policy '{src}' (policies: {', '.join(specs)})")
        if not cfg.policies[name].frozen:
            raise ConfigError(f"{key}: a pool member takes its weights from '{src}' and is never trained itself; set "
                              f"policies.{name}.frozen: true")
        if not specs[src].trainable:
            raise ConfigError(f"{key}: '{src}' is not trained, so its snapshots would never change")
        if s.is_lora or specs[src].is_lora or s.model != specs[src].model:
            raise ConfigError(f"{key}: a snapshot is a full model of the same model as '{src}' ({specs[src].model}, "
                              f"no LoRA on either)")
        if cfg.runtime.placement != "local" or specs[src].data_parallel > 1 or specs[src].fsdp:
            raise ConfigError(f"{key}: opponent pools run with runtime.placement local and an unsharded, single-rank "
                              f"'{src}'")


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
    from masrl.worker.model.precision import resolve_device as resolve

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
    if p.fsdp:
        _check_fsdp(cfg, name, p)
    if p.shard_optimizer and p.offload_optimizer:
        raise ConfigError(f"policies.{name}: shard_optimizer and offload_optimizer both shrink the optimizer's "
                          f"GPU memory; choose one")


def _check_fsdp(cfg: RunConfig, name: str, p) -> None:
    """What ``policies.X.fsdp`` cannot be combined with yet, by key."""
    key = f"policies.{name}.fsdp"
    if p.data_parallel < 2:
        raise ConfigError(f"{key}: shards the policy over its data-parallel ranks; set policies.{name}.data_parallel "
                          f"to 2 or more (and runtime.placement: ray)")
    clashes = [(p.lora is not None, f"policies.{name}.lora (a LoRA team's base is frozen and its adapters small: "
                                    f"train it without fsdp)"),
               (p.shard_optimizer, f"policies.{name}.shard_optimizer (fsdp shards the optimizer state already)"),
               (p.offload_optimizer or p.offload_weights or p.offload_reference, "offloading"),
               (bool(p.schedule.ema), f"policies.{name}.schedule.ema"),
               (p.rollout_device is not None, f"policies.{name}.rollout_device")]
    for bad, what in clashes:
        if bad:
            raise ConfigError(f"{key}: not with {what} yet; remove one of them")


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


def _isolated(cfg: RunConfig, r, built):
    """A plugin reward (built here once, so that a bad option fails before any model loads) served from worker
    processes the run stops at ``rollout.reward_timeout_s`` (``rewards/isolated.py``)."""
    from masrl.rewards.isolated import IsolatedAllocator

    ro = cfg.rollout
    return IsolatedAllocator(r.type, weight=r.weight, options=dict(r.options),
                             name=getattr(built, "name", type(built).__name__), timeout_s=ro.reward_timeout_s,
                             memory_mb=ro.reward_memory_mb, workers=ro.reward_workers)


def check_rewards(cfg: RunConfig) -> list:
    """The reward allocators, built (cheap: no model) so that a bad type or option fails here."""
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
            built = build_object(factory, f"rewards.{i} ('{r.type}')", weight=r.weight, **r.options)
            out.append(_isolated(cfg, r, built) if cfg.rollout.reward_isolation == "process" else built)
    for a in out:
        if not hasattr(a, "allocate"):
            raise ConfigError(f"reward {a!r} has no allocate(trace, task) method")
    return out

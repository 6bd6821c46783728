"""The run's configuration: ``RunConfig`` (the sections and how they refer to each other), read
from YAML plus dotted ``key.sub=value`` overrides and validated by pydantic.

Every model forbids unknown keys, so a typo is an error that names the key (and a close match).
What a name refers to outside the config (a workflow's agents, an estimator, a data source, a
model on disk) is checked once, before anything is built, by ``driver.checks``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from masrl.config.explain import format_validation_error
from masrl.config.loading import MAX_YAML_NODES, expanded_size, read_yaml
from masrl.config.policy import DEVICE, CriticConfig, PolicyConfig, RuntimeConfig, Strict
from masrl.config.sections import (
    AgentConfig,
    AlgorithmConfig,
    DataConfig,
    EvalConfig,
    RetrieverConfig,
    RewardConfig,
    RolloutConfig,
    SandboxConfig,
    TrainConfig,
    WorkflowConfig,
)
from masrl.errors import ConfigError


class RunConfig(Strict):
    name: str = Field("run", description="the run's name: one path component (letters, digits, '.', '_', '+', '-'); its "
                                  "folder is runs/<name> unless output_dir says otherwise")
    output_dir: str | None = Field(None, min_length=1, description="default: runs/<name>")
    seed: int = 0
    model: str = Field("smollm2-135m-instruct", description="default model of every policy")
    device: str = Field("auto", pattern=DEVICE, description="auto (the GPU when there is one) | cpu | cuda | cuda:N")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="bf16: bf16 weights and compute, fp32 master weights and optimizer state; "
                            "auto: bf16 on CUDA, fp32 on CPU")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: all cores)")
    policies: dict[str, PolicyConfig]
    agents: dict[str, AgentConfig]
    workflow: WorkflowConfig
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    retriever: RetrieverConfig = Field(default_factory=RetrieverConfig)
    critics: dict[str, CriticConfig] = Field(default_factory=dict)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    rewards: list[RewardConfig] = Field(
        default_factory=lambda: [RewardConfig(type="outcome"), RewardConfig(type="format", weight=0.5)]
    )
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @field_validator("name")
    @classmethod
    def _one_component(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,119}", v):
            raise ValueError(f"name {v!r} must be one path component of 1-120 letters, digits, '.', '_', '+' or '-' "
                             f"(not starting with '.'); to write the run elsewhere, set output_dir")
        return v

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "dtype" in data:
            raise ValueError("`dtype` was replaced by `precision` (auto | fp32 | bf16); bf16 keeps fp32 master weights")
        return data

    @model_validator(mode="after")
    def _check_mapping(self) -> "RunConfig":
        if not self.policies:
            raise ValueError("`policies` is empty: define at least one policy")
        unused = set(self.critics) - {p.critic for p in self.policies.values()}
        if unused:
            raise ValueError(f"critics {', '.join(sorted(unused))}: no policy uses it; set policies.<name>.critic "
                             f"or remove it")
        for name, p in self.policies.items():
            self._check_policy_links(name, p)
        self._check_agents()
        self._check_counterfactual()
        self._check_async()
        return self

    def _check_async(self) -> None:
        """Options that live in the synchronous step are refused with the async mode, by name."""
        if self.rollout.mode != "async":
            if self.rollout.overlap_update is True:
                raise ValueError("rollout.overlap_update: true needs rollout.mode: async (a synchronous step never "
                                 "generates during an update); set rollout.mode: async or remove overlap_update")
            return
        offloaded = [n for n, p in self.policies.items() if p.offload_weights]
        if self.rollout.overlap_update is True and offloaded:
            raise ValueError(f"rollout.overlap_update: true keeps the weights on the device while they update, but "
                             f"policies.{offloaded[0]}.offload_weights moves them out; set one of them off")
        refused = [k for k, on in (("rollout.counterfactual", self.rollout.counterfactual is not None),
                                   ("rollout.dynamic_sampling", self.rollout.dynamic_sampling > 0),
                                   ("train.policy_kl", bool(self.train.policy_kl))) if on]
        if refused:
            raise ValueError(f"rollout.mode: async does not run {', '.join(refused)} yet; use rollout.mode: sync "
                             f"with {'them' if len(refused) > 1 else 'it'}")

    def _check_counterfactual(self) -> None:
        """The counterfactual reward and rollout.counterfactual come together; its agents exist."""
        cf = self.rollout.counterfactual
        paid = any(r.type == "counterfactual" for r in self.rewards)
        if paid and cf is None:
            raise ValueError("rewards: the counterfactual reward pays credit that rollout.counterfactual computes; set "
                             "rollout.counterfactual: {k: 2} (or remove the reward)")
        if cf is not None and not paid:
            raise ValueError("rollout.counterfactual computes credit no reward pays (each credited call costs k re-runs "
                             "of its trace); add {type: counterfactual} to rewards, or remove it")
        unknown = [a for a in (cf.agents or []) if a not in self.agents] if cf is not None else []
        if unknown:
            raise ValueError(f"rollout.counterfactual.agents: {', '.join(unknown)} not under `agents` "
                             f"(agents: {', '.join(self.agents)})")

    def _check_agents(self) -> None:
        """Every agent maps to a policy that can play it, and every policy plays some agent."""
        if not self.agents:
            raise ValueError("`agents` is empty: map at least one agent to a policy")
        for name, agent in self.agents.items():
            if agent.policy not in self.policies:
                raise ValueError(
                    f"agents.{name}.policy: '{agent.policy}' is not a policy; define it under `policies` "
                    f"or use one of: {', '.join(self.policies)}"
                )
        for name, agent in self.agents.items():
            if agent.trainable and self.policies[agent.policy].frozen:
                raise ValueError(f"agents.{name}.trainable is true but its policy '{agent.policy}' is frozen; "
                                 f"drop one of the two")
        used = {a.policy for a in self.agents.values()}
        for name in self.policies:
            if name not in used:
                raise ValueError(f"policies.{name} is not used by any agent; map an agent to it or remove it")

    def _check_policy_links(self, name: str, p: PolicyConfig) -> None:
        """A policy's critic and ``share_from`` sources exist and fit."""
        if p.critic is not None and p.critic not in self.critics:
            raise ValueError(f"policies.{name}.critic: '{p.critic}' is not defined under `critics` "
                             f"(critics: {', '.join(self.critics) or 'none'})")
        for src, share in p.share_from.items():
            if src not in self.policies or src == name:
                raise ValueError(f"policies.{name}.share_from: '{src}' is not another policy (policies: "
                                 f"{', '.join(n for n in self.policies if n != name)})")
            if not 0 < share <= 1:
                raise ValueError(f"policies.{name}.share_from.{src}: {share} must be in (0, 1], the share of "
                                 f"{src}'s calls to learn from")

    def policy_model(self, policy: str) -> str:
        return self.policies[policy].model or self.model

    def agent_trainable(self, agent: str) -> bool:
        a = self.agents[agent]
        return (not self.policies[a.policy].frozen) if a.trainable is None else a.trainable

    def policy_device(self, policy: str) -> str:
        return self.policies[policy].device or self.device

    def run_dir(self) -> Path:
        return Path(self.output_dir or f"runs/{self.name}")


# -- loading -------------------------------------------------------------------------------------

def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key.sub=value (for example train.steps=5)")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}': the key '{key}' is malformed")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override '{text}': cannot read value {raw!r}: {exc}") from None
    return key.split("."), value


def apply_override(data: dict, path: list[str], value: Any) -> None:
    node: Any = data
    dotted = ".".join(path)
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"override {dotted}: '{part}' is not an index of a list of {len(node)}")
            if last:
                node[int(part)] = value
                return
            node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
                return
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
        else:
            raise ConfigError(f"override {dotted}: '{'.'.join(path[:i])}' is a value, not a section")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, data: dict | None = None) -> RunConfig:
    """Read a YAML file (or ``data``), apply overrides, validate. Raises ConfigError with the fix."""
    source = str(path) if path is not None else "(inline)"
    if data is None:
        p = Path(path)  # type: ignore[arg-type]
        if not p.is_file():
            raise ConfigError(f"config file '{path}' does not exist")
        data = read_yaml(p.read_text(), f"config file '{path}'") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping at the top level")
    for text in overrides or []:
        key, value = parse_override(text)
        apply_override(data, key, value)
    if expanded_size(data, MAX_YAML_NODES) > MAX_YAML_NODES:  # an override's aliases count too
        raise ConfigError(f"config {source}: with its overrides it stands for more than {MAX_YAML_NODES:,} values "
                          f"once YAML aliases are expanded; write the values out")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, RunConfig)) from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

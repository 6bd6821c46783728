"""The run's configuration: typed sections that reject unknown keys (``sections``, ``policy``),
the whole run (``run``: ``RunConfig``, ``load_config``, ``dump_config``), error messages that
name the key and the fix (``explain``), and ``'module:attr'`` objects named in a config
(``loading``). Nothing here imports torch or any other part of masrl but ``errors``."""

from masrl.config.policy import (
    DEVICE,
    CriticConfig,
    EngineConfig,
    LoraConfig,
    OptimConfig,
    PolicyConfig,
    RuntimeConfig,
    ScheduleConfig,
    Strict,
)
from masrl.config.run import RunConfig, apply_override, dump_config, load_config, parse_override
from masrl.config.sections import (
    REWARD_TYPES,
    AgentConfig,
    AlgorithmConfig,
    CounterfactualConfig,
    DataConfig,
    DataSourceConfig,
    EvalConfig,
    KeepBestConfig,
    RetrieverConfig,
    RewardConfig,
    RolloutConfig,
    SamplingParams,
    SandboxConfig,
    TrainConfig,
    WorkflowConfig,
    WorldConfig,
)

__all__ = ["DEVICE", "REWARD_TYPES", "AgentConfig", "AlgorithmConfig", "CounterfactualConfig", "CriticConfig",
           "DataConfig", "DataSourceConfig", "EngineConfig", "EvalConfig", "KeepBestConfig", "LoraConfig", "OptimConfig",
           "PolicyConfig",
           "RetrieverConfig", "RewardConfig", "RolloutConfig", "RunConfig", "RuntimeConfig", "SamplingParams",
           "SandboxConfig", "ScheduleConfig", "Strict", "TrainConfig", "WorkflowConfig", "WorldConfig",
           "apply_override", "dump_config", "load_config", "parse_override"]

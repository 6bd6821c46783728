"""PolicySpec: a trainable unit, a full model or a LoRA adapter on a base shared with others."""

from __future__ import annotations

from dataclasses import dataclass, field

from masrl.config import LoraConfig, OptimConfig, ScheduleConfig


@dataclass(frozen=True)
class PolicySpec:
    """``lora`` set: an adapter on the frozen base ``model``; policies with LoRA on the same base
    share one copy of it in memory (one PolicyWorker hosts them all). ``lora`` unset: a full model
    of its own. ``lora`` and ``optim`` are the config's own (validated) settings."""

    name: str
    model: str
    lora: LoraConfig | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainable: bool = True  # false when no trainable agent maps to it: no optimizer, no reference
    device: str = "cpu"  # resolved: cpu | cuda:N
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)  # total_updates resolved
    offload_optimizer: bool = False
    offload_reference: bool = False
    offload_weights: bool = False
    share_from: dict = field(default_factory=dict)  # {source policy: share of its calls}
    critic: str | None = None  # a separate value model (GAE) instead of a value head
    share_is_cap: float = 2.0
    num_cpus: float = 1.0  # runtime.placement ray: what its actor reserves
    num_gpus: float | None = None
    data_parallel: int = 1  # ranks (runtime.placement ray)
    shard_optimizer: bool = False  # ZeRO-1 over the ranks
    fsdp: bool = False  # weights, gradients and optimizer state sharded over the ranks (FSDP2)
    max_staleness: int | None = None  # calls sampled more than this many versions ago are dropped
    rollout_device: str | None = None  # resolved: where its engine samples, when not ``device``
    engine: object | None = None  # EngineConfig: served by an OpenAI-compatible endpoint
    snapshot_of: str | None = None  # frozen, and given this policy's weights every ``snapshot_every`` steps (a pool)
    snapshot_every: int = 10

    @property
    def is_lora(self) -> bool:
        return self.lora is not None

"""PolicySpec: a trainable unit, a full model or a LoRA adapter on a base shared with others."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoraSpec:
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class OptimSpec:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float = 1.0


@dataclass(frozen=True)
class PolicySpec:
    """``lora`` set: an adapter on the frozen base ``model``; policies with LoRA on the same base
    share one copy of it in memory (one PolicyWorker hosts them all). ``lora`` unset: a full model
    of its own."""

    name: str
    model: str
    lora: LoraSpec | None = None
    optim: OptimSpec = field(default_factory=OptimSpec)
    trainable: bool = True  # false when no trainable agent maps to it: no optimizer, no reference

    @property
    def is_lora(self) -> bool:
        return self.lora is not None

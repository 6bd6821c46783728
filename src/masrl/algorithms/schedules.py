"""Per-policy schedules: learning-rate warm-up and decay, and a weight EMA for evaluation.

``lr_factor(update, warmup, total, decay, min_ratio)`` multiplies a policy's base learning rate at
its ``update``-th update (0-based): linear warm-up over ``warmup`` updates (from 1/warmup to 1),
then ``constant``, ``linear`` or ``cosine`` decay that would reach ``min_ratio`` at update ``total``,
one past the last (as Hugging Face's schedulers do), so the last update still moves the weights.

``WeightEMA`` keeps fp32 shadows of a policy's trainable parameters, ``shadow = d * shadow + (1 -
d) * param`` after every update; ``swapped_in`` puts the shadows into the model for evaluation
and restores the trained weights after.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch


def lr_factor(update: int, *, warmup: int = 0, total: int | None = None, decay: str = "constant",
              min_ratio: float = 0.0) -> float:
    if warmup > 0 and update < warmup:
        return (update + 1) / warmup
    if decay == "constant" or not total:
        return 1.0
    span = max(1, total - warmup)
    t = min(1.0, max(0.0, (update - warmup) / span))
    if decay == "linear":
        shape = 1.0 - t
    elif decay == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * t))
    else:
        raise ValueError(f"unknown lr decay {decay!r}: use constant, linear or cosine")
    return min_ratio + (1.0 - min_ratio) * shape


class WeightEMA:
    def __init__(self, params: list[torch.nn.Parameter], decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError("ema decay must be between 0 and 1")
        self.params = list(params)
        self.decay = decay
        self.shadow = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        for s, p in zip(self.shadow, self.params):
            s.mul_(self.decay).add_(p.detach().float(), alpha=1.0 - self.decay)

    @contextmanager
    def swapped_in(self):
        saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for s, p in zip(self.shadow, self.params):
                p.copy_(s.to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for v, p in zip(saved, self.params):
                    p.copy_(v)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": [s.cpu() for s in self.shadow]}

    def load_state_dict(self, state: dict) -> None:
        for s, v in zip(self.shadow, state["shadow"]):
            s.copy_(v.to(s.device))

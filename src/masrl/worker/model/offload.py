"""Offload: move a fixed set of tensors between a GPU and pinned CPU memory, in place.

The tensors keep their identity (their ``.data`` is swapped), so everything that holds them, an
optimizer, a module, gradient hooks, an engine that reads a module's parameters, keeps working
after they come back. Each tensor gets one pinned CPU buffer, made on its first trip and reused
after, so a trip is one asynchronous copy per tensor and one synchronisation.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch


class PinnedStash:
    def __init__(self) -> None:
        self._buffers: dict[int, torch.Tensor] = {}
        self.home: torch.device | None = None  # the device the tensors came from
        self.moved_s = 0.0  # seconds spent moving, both ways, since creation
        self.moved_bytes = 0

    @torch.no_grad()
    def out(self, tensors: Iterable[torch.Tensor]) -> int:
        """Move every tensor not already in CPU memory into its pinned buffer; returns bytes moved."""
        t0 = time.perf_counter()
        moved = 0
        for t in tensors:
            if t.device.type == "cpu":
                continue
            self.home = t.device
            buf = self._buffers.get(id(t))
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = self._buffers[id(t)] = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            buf.copy_(t, non_blocking=True)
            moved += t.numel() * t.element_size()
            t.data = buf
        if moved:
            torch.cuda.synchronize(self.home)
        self._count(moved, t0)
        return moved

    @torch.no_grad()
    def back(self, tensors: Iterable[torch.Tensor]) -> int:
        """Bring every tensor that ``out`` moved back to its device; returns bytes moved."""
        if self.home is None:
            return 0
        t0 = time.perf_counter()
        moved = 0
        for t in tensors:
            if t.device.type == "cpu" and id(t) in self._buffers:
                t.data = t.data.to(self.home, non_blocking=True)
                moved += t.numel() * t.element_size()
        if moved:
            torch.cuda.synchronize(self.home)
        self._count(moved, t0)
        return moved

    def _count(self, moved: int, t0: float) -> None:
        if moved:
            self.moved_bytes += moved
            self.moved_s += time.perf_counter() - t0


def module_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers (each once: tied weights are one tensor)."""
    return list(module.parameters()) + list(module.buffers())


class Parking:
    """``offload_weights``: between a worker's generating and its update, its weights (and EMA copies,
    ``extra()``) wait in pinned CPU memory and the engine drops its device buffers; ``resident`` brings them
    back before the next generate, score or update. Off (``on`` false), every call does nothing."""

    def __init__(self, held, engine, extra, on: bool):
        self.held, self.engine, self.extra, self.on = held, engine, extra, on
        self._reported = (0.0, 0)  # (seconds, bytes) of trips already in an update's metrics

    def park(self) -> None:
        if self.on and not self.held.parked:
            self.engine.release()
            self.held.park(self.extra())

    def resident(self) -> None:
        if self.held.parked:
            self.held.unpark(self.extra())

    def after_update(self, metrics: dict[str, dict[str, float]]) -> None:
        """Park, and add every trip since the last update (in for the rollout, out, in, out) to its metrics."""
        if not self.on:
            return
        self.park()
        s, b = self.held.stash.moved_s, self.held.stash.moved_bytes
        for m in metrics.values():
            m.update(weights_offload_s=s - self._reported[0], weights_offload_gb=(b - self._reported[1]) / 2**30)
        self._reported = (s, b)

"""Host-to-device copies that do not stall the engine's thread.

A copy from pageable host memory may wait for the GPU's stream before it starts, so every small
``torch.tensor(..., device="cuda")`` in an engine step is a point where the host stops queueing
kernels (on the H200 the synchronous long-tail step's 1,832 such copies averaged 160 us each,
docs/benchmarks.md). On CUDA these go through pinned memory, asynchronously: torch's caching host
allocator keeps a pinned block until the copy that reads it has run, so the host may move on at once.
Several index arrays of one step travel as one copy (``to_device_many``).
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``t`` (on the host) on ``dev``; on CUDA without waiting for the stream."""
    if dev.type != "cuda":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for a host ``src``; on CUDA without waiting for the stream."""
    if dst.device.type != "cuda":
        dst.copy_(src)
    else:
        dst.copy_(src.pin_memory(), non_blocking=True)


def to_device_many(dev: torch.device, *arrays: np.ndarray) -> list[torch.Tensor]:
    """Integer arrays on ``dev`` as int64, in one copy: views of one device buffer, each its array's shape."""
    flat = [np.asarray(a, dtype=np.int64).ravel() for a in arrays]
    host = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64))
    buf = to_device(host, dev)
    out, at = [], 0
    for a, f in zip(arrays, flat):
        out.append(buf[at:at + f.size].view(np.shape(a)))
        at += f.size
    return out

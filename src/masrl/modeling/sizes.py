"""Bytes that tensors hold on a device, each storage counted once (views and shared tensors too)."""

from __future__ import annotations


def tensor_bytes(tensors, device: str | None = None, seen: set[int] | None = None) -> int:
    """Bytes of ``tensors`` (on ``device`` when given), each storage counted once."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None or (device is not None and str(t.device) != device):
            continue
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total

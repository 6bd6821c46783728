"""GPU memory a host holds, by what holds it, and the peak of each step.

torch keeps one peak counter per device and process, so hosts that share a process and a device
share it. Whoever resets it (an update measuring its own peak, or the step's reading) first folds
the peak so far into ``_CARRY``; ``step_peak`` reads the step's peak as the larger of the two and
starts the next step from zero. One host of a process answers for a device's peak: the newest on
that device (``enroll``), until it closes; every host reports the parts it holds itself.
"""

from __future__ import annotations

import os
import threading
import weakref

import torch

from masrl.modeling.sizes import tensor_bytes

GIB = 2**30
_CARRY: dict[str, tuple[int, int]] = {}  # device -> (allocated, reserved) peaks before its last reset, this step
_OWNERS: dict[str, weakref.ref] = {}  # device -> the host that reports its peak (while it lives)
_LOCK = threading.Lock()


def claim(device: str, host) -> bool:
    """Whether ``host`` reports ``device``'s peak in this process: the enrolled host, or (none living)
    the first to ask."""
    with _LOCK:
        owner = _OWNERS.get(device)
        if owner is None or owner() is None:
            _OWNERS[device] = weakref.ref(host)
            return True
        return owner() is host


def enroll(devices, host) -> None:
    """A new host on ``devices``: it reports their peaks from now on (the newest host of a process
    does, so a finished run's host that something still references never silences the next run's)."""
    with _LOCK:
        for d in devices:
            if str(d).startswith("cuda"):
                _OWNERS[str(d)] = weakref.ref(host)


def unclaim(owner) -> None:
    """``owner`` (a host) is closing: it no longer reports any device's peak (a host still referenced somewhere
    after its run ended would otherwise keep the claim, and the next run in the process report none)."""
    with _LOCK:
        for d in [d for d, ref in _OWNERS.items() if ref() is owner]:
            del _OWNERS[d]


def reset_peak(device: str) -> int:
    """Start measuring a new peak on ``device`` (what an update does to see its own); returns the
    memory allocated now. The peak so far is kept for ``step_peak``."""
    with _LOCK:
        a, r = _CARRY.get(device, (0, 0))
        _CARRY[device] = (max(a, torch.cuda.max_memory_allocated(device)), max(r, torch.cuda.max_memory_reserved(device)))
        torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def step_peak(device: str) -> tuple[int, int]:
    """(peak allocated, peak reserved) on ``device`` since the last call; the counters restart."""
    with _LOCK:
        a, r = _CARRY.pop(device, (0, 0))
        peak = max(a, torch.cuda.max_memory_allocated(device))
        reserved = max(r, torch.cuda.max_memory_reserved(device))
        torch.cuda.reset_peak_memory_stats(device)
    return peak, reserved


def device_rows(devices: set[str], *, weights: list, copy: list, optimizers: list, engine, owner) -> list[dict]:
    """A worker's ``take_memory`` rows: per CUDA device of ``devices``, the GiB its ``weights`` (tensors),
    weight ``copy`` (tensors), ``optimizers`` and ``engine`` hold, each storage counted once, and the step's
    peak where ``owner`` answers for the device."""
    rows, engine_device = [], str(engine.device)
    for d in sorted(d for d in devices if d.startswith("cuda")):
        seen: set[int] = set()
        held = tensor_bytes(weights, d, seen)
        copied = tensor_bytes(copy, d, seen)
        opt = sum(o.state_bytes(d, seen) for o in optimizers)
        kept = engine.memory() if engine_device == d else {}
        row = {"device": d, "process": os.getpid(), "weights": held / GIB, "weight_copy": copied / GIB,
               "optimizer": opt / GIB, **{f"engine_{k}": kept.get(k, 0) / GIB for k in ("kv", "weights", "buffers")}}
        if engine_device == d:  # a paged engine: its pool's use and pre-emptions
            row.update({f"engine_{k}": v for k, v in engine.take_counters().items()})
        if claim(d, owner):
            peak, reserved = step_peak(d)
            row.update(peak_gib=peak / GIB, reserved_gib=reserved / GIB)
        rows.append(row)
    return rows


# what torch, cuBLAS and cuDNN say when a device has no memory left for them
OUT_OF_MEMORY = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDA_ERROR_OUT_OF_MEMORY", "CUDNN_STATUS_ALLOC_FAILED")
# what cuDNN says when a kernel it planned cannot run: its workspace not allocated is one cause among others
_CUDNN_FAILED = ("mha_graph.execute", "CUDNN_STATUS_EXECUTION_FAILED", "CUDNN_STATUS_INTERNAL_ERROR")
NEARLY_FULL = 0.05  # a device with less than this share free counts as full


def memory_failure(detail: str, free: int = 0, total: int = 0) -> bool:
    """Whether an error's text ``detail`` is the device running out of memory: torch's, cuBLAS's or cuDNN's
    words for it, or a cuDNN kernel that failed while the device had under ``NEARLY_FULL`` of its ``total``
    bytes ``free`` (cuDNN's attention says only that its graph did not run when its workspace found no memory:
    on the H200, nine runs side by side failed so)."""
    if any(m in detail for m in OUT_OF_MEMORY):
        return True
    return total > 0 and free < NEARLY_FULL * total and any(m in detail for m in _CUDNN_FAILED)


def update_oom_message(policy: str, algo, *, device: str, held: int, free: int, total: int,
                       earlier_extra_gib: float | None, detail: str) -> str:
    """What a user reads when policy ``policy``'s update ran out of GPU memory: what the run held, what
    the device had left, what earlier updates took, and the settings that bound the update's memory."""
    tokens = algo.micro_batch_tokens
    batch = (f"algorithm.micro_batch_tokens={tokens}" if tokens else
             f"algorithm.micro_batch_size={algo.micro_batch_size} (no algorithm.micro_batch_tokens: a micro-batch "
             "is that many rows, however long)")
    earlier = (f"; its earlier updates added up to {earlier_extra_gib:.1f} GiB on top of that"
               if earlier_extra_gib is not None else "; this was its first update")
    smaller = f"e.g. algorithm.micro_batch_tokens={max(256, tokens // 4)}" if tokens else "e.g. algorithm.micro_batch_tokens=4096"
    lines = [
        f"the update of policy '{policy}' ran out of GPU memory on {device}.",
        f"  this process held {held / GIB:.1f} GiB when it started (weights, optimizer, the engine's KV){earlier}; "
        f"the device had {free / GIB:.1f} of {total / GIB:.1f} GiB free when it failed (other processes share it).",
        f"  the update's memory grows with the tokens of one micro-batch: {batch}"
        + ("" if algo.activation_checkpointing else ", activation checkpointing off") + ".",
        "  to fit: lower algorithm.micro_batch_tokens (" + smaller + "; a SmolLM2-135M run peaked at 15.8-16.1 GiB "
        "with 16384 and 9.5-9.9 GiB with 4096, docs/gpu.md)"
        + ("" if algo.activation_checkpointing else ", set algorithm.activation_checkpointing=true")
        + ", lower rollout.gpu_memory_utilization (the paged engine's KV pool), or run fewer runs on this GPU.",
        f"  torch said: {detail.splitlines()[0][:300] if detail else '(nothing)'}",
    ]
    return "\n".join(lines)


def _libc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _libc_trim()


def give_back_freed() -> None:
    """Hand the heap pages freed since the last call back to the system. glibc keeps what a phase freed
    (a rollout's KV caches, an update's activations) in its arenas; on a CPU host the next phase then
    allocates beside it, and a 135M policy's process held 5-6 GB after two steps where 2.6 GB were live.
    Called between a host's rollout and its update, after the update and after an evaluation."""
    if _TRIM is not None:
        _TRIM(0)

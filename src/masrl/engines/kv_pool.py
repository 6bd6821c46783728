"""The paged engine's KV pool: how many blocks a memory budget buys, and the pool's tensors.

A token's keys and values take ``2 x layers x kv_heads x head_dim`` elements of the engine's dtype;
``gpu_memory_utilization`` is the fraction of the device's memory (of the host's on a CPU) the pool
may take, ``kv_blocks`` a block count that overrides it. The pool is allocated once; a device that
cannot hold it is an error that names the setting to lower.
"""

from __future__ import annotations

import os

import torch

from masrl.modeling.lean import core_model


def kv_bytes_per_token(model, dtype: torch.dtype) -> int:
    cfg = core_model(model).config
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * cfg.num_hidden_layers * kv * d * torch.tensor([], dtype=dtype).element_size()


def device_memory(dev: torch.device) -> int:
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def pool_blocks(model, dtype: torch.dtype, dev: torch.device, block_size: int, utilization: float,
                kv_blocks: int | None = None) -> int:
    """The pool's block count: ``kv_blocks`` when given, else what ``utilization`` of the device holds."""
    per_token = kv_bytes_per_token(model, dtype)
    if kv_blocks is None:
        kv_blocks = int(utilization * device_memory(dev)) // (per_token * block_size)
    if kv_blocks < 2:
        raise ValueError(f"the KV budget holds {kv_blocks} blocks of {block_size} tokens ({per_token:,} bytes a "
                         f"token); raise rollout.gpu_memory_utilization")
    return kv_blocks


def allocate(model, layers: int, slots: int, shape: tuple[int, int], dtype: torch.dtype,
             dev: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's key and value pool, ``[slots, kv_heads, head_dim]``; out of memory says what to lower."""
    try:
        return [(torch.zeros((slots, *shape), dtype=dtype, device=dev), torch.zeros((slots, *shape), dtype=dtype,
                                                                                   device=dev)) for _ in range(layers)]
    except torch.OutOfMemoryError as e:
        need = slots * kv_bytes_per_token(model, dtype)
        free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else 0
        raise RuntimeError(f"the paged engine's KV pool ({need / 2**30:.1f} GiB) does not fit on {dev}: "
                           f"{free / 2**30:.1f} GiB free (out of memory); lower rollout.gpu_memory_utilization, or "
                           f"run fewer runs on this GPU") from e

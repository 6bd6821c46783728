"""The paged engine's settings: one typed object, built once, read by the engine, its model runner and its prefill.

``PagedEngine(model, tok, stop_ids, device=..., **options)`` builds it from keyword arguments, and a key it does not
hold is an error that names the key and the ones it takes (never dropped). The driver fills it from the ``rollout``
section (``driver/builder.engine_options``: ``kv_block_size`` -> ``block_size`` and the others by their own names).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class PagedOptions:
    block_size: int = 16  # slots of a KV block
    gpu_memory_utilization: float = 0.04  # the fraction of the device's memory (a CPU: the host's) the KV pool takes
    kv_blocks: int | None = None  # the pool's size in blocks, instead of the fraction
    max_batch_size: int = 256  # calls decoding at once
    prefill_tokens: int = 8192  # new tokens a forward prefill computes at once (longer prompts: in chunks)
    sync_every: int = 8  # decode steps between two reads of the sampled tokens by the host
    cuda_graphs: bool = True  # decode steps replayed as CUDA graphs (a GPU)
    fused_kernels: bool = True  # Triton kernels where they agree with torch at start-up (a GPU)
    # a prefill as token rows through the decode graphs; None: where the decode step replays graphs (eager on a CPU,
    # where rows save no launches)
    graph_prefill: bool | None = None
    # the next decode chunk is queued before the host takes the last one's tokens; None: on a GPU, where the host's
    # bookkeeping then runs while the device decodes
    overlap_chunks: bool | None = None
    prefill_rows: int = 512  # token rows a replay of a prefill as decode rows computes
    prefill_rows_keys: int = 1 << 21  # past this many keys read in all, a prefill takes the lean forward instead
    fused_rope: bool = True  # a short decode step ropes, caches and attends in one kernel
    flash_one_row: bool = True  # a one-row half-precision prefill on a GPU: flash attention without a mask

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def of(cls, options: dict) -> PagedOptions:
        """``options`` as this object; a key it does not hold is a ``TypeError`` naming it and the ones it takes."""
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise TypeError(f"the paged engine takes no option {', '.join(map(repr, unknown))} (it takes: "
                            f"{', '.join(sorted(cls.names()))})")
        return cls(**options)

"""The paged engine's fused Triton kernels: one registry of fused op -> torch reference -> start-up check.

* ``common.py``: ``rms_norm``, ``silu_mul`` and the rope-and-KV-write kernel, which know nothing of pages;
* ``paged.py``: ``rope_and_cache_paged``, ``paged_attention`` (through block tables, split for long rows) and
  ``paged_rope_attention`` (the two as one launch);
* ``sample.py``: the sampler (temperature, Gumbel-max draw and logprob in two reads of the logits).

``check_all`` runs every fused op against its torch reference on random data of the model's shapes when a runner
starts (``{op: None if it agrees, else why not}``); ``op`` picks the fused version where it agreed, the reference
elsewhere and on a CPU. Ops with launch settings of their own (``paged_attention``'s splits, the sampler's
per-call numbers) are called by name where they are used, after the same check.
"""

from __future__ import annotations

from masrl.engines.paged.kernels import common, paged, sample

__all__ = ["OPS", "available", "check_all", "common", "op", "paged", "sample"]

OPS = {  # fused op: (its Triton version, its torch reference)
    "rms_norm": (common.rms_norm, common.rms_norm_ref),
    "silu_mul": (common.silu_mul, common.silu_mul_ref),
    "rope_and_cache_paged": (paged.rope_and_cache_paged, paged.rope_and_cache_paged_ref),
    "paged_attention": (paged.paged_attention, paged.paged_attention_ref),
    "paged_rope_attention": (paged.paged_rope_attention, paged.paged_rope_attention_ref),
}


def available(device) -> bool:
    """Triton is installed and ``device`` is a GPU (a CPU runs the torch references)."""
    return common.available(device)


def op(fused: dict[str, bool], name: str):
    """``name``'s fused version if it agreed with torch at start-up (``fused[name]``), else its torch reference."""
    triton_version, reference = OPS[name]
    return triton_version if fused.get(name) else reference


def check_all(device, dtype, H: int, Hkv: int, D: int, hidden: int, inter: int) -> dict:
    """Every fused op against its torch reference on random data of these shapes: ``{op: None or why not}``."""
    return {**common.check(device, dtype, H, Hkv, D, hidden, inter), **sample.check(device, dtype),
            **paged.check(device, dtype, H, Hkv, D)}

"""KV blocks: a fixed pool of fixed-size blocks, reference counts, and a prefix cache.

The paged engine keeps every sequence's keys and values in blocks of ``block_size`` token slots
taken from one pool, so memory grows with the tokens in use, not with batch x context. A sequence
owns a *block table*: the pool indices of its blocks, in order; token ``t`` lives in slot
``table[t // block_size] * block_size + t % block_size``.

Prefix cache: a block that is full is known by a chained hash of (the hash of the block before it,
its tokens, the key it was computed under: a LoRA adapter's name). Another sequence whose prompt
starts with the same blocks takes them (its reference count goes up) and skips their prefill: the
samples of a GRPO group share their prompt's blocks, and an episode's next turn reuses its earlier
turns'. A block whose count drops to 0 goes back to the free list but keeps its hash until it is
handed out again, so a later prompt can still revive it (least recently freed is reused first).
Block 0 is never handed out: padded rows of a decode step write there. The last section sizes and allocates the
pool's tensors; the rest is plain Python.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch

from masrl.modeling.lean import core_model


def block_hash(prev: bytes, tokens: Sequence[int], key: Hashable = None) -> bytes:
    """The chained hash of one full block: stable across processes (no ``hash()`` salt)."""
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(repr(key).encode())
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return h.digest()


def blocks_for(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


class OutOfBlocks(RuntimeError):
    """The pool has no free block left (the scheduler pre-empts a sequence and retries)."""


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` slots; block 0 is reserved (the scratch block)."""

    def __init__(self, num_blocks: int, block_size: int, stats: dict | None = None):
        if num_blocks < 2:
            raise ValueError(f"a KV block pool needs at least 2 blocks (one is scratch), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # full-block hash -> block
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.stats = {} if stats is None else stats  # the engine's one stats object, when it has one
        self.stats.setdefault("hit_blocks", 0)
        self.stats.setdefault("miss_blocks", 0)

    # -- counts -----------------------------------------------------------------------------------
    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    def free_count(self) -> int:
        return len(self.free)

    def used(self) -> int:
        return self.usable - len(self.free)

    # -- prompts ----------------------------------------------------------------------------------
    def hashes(self, tokens: Sequence[int], key: Hashable = None, limit: int | None = None,
               known: list[bytes] | None = None) -> list[bytes]:
        """The chained hashes of the full blocks among the first ``limit`` tokens (default: all).
        ``known``: the chain of a prefix of these tokens already hashed; it is extended in place."""
        bs = self.block_size
        n = (len(tokens) if limit is None else min(limit, len(tokens))) // bs
        out = known if known is not None else []
        prev = out[-1] if out else b""
        for i in range(len(out), n):
            prev = block_hash(prev, tokens[i * bs : (i + 1) * bs], key)
            out.append(prev)
        return out[:n]

    def cached_prefix(self, hashes: list[bytes]) -> list[int]:
        """The cached blocks that start this chain (stops at the first miss)."""
        blocks = []
        for h in hashes:
            b = self.cached.get(h)
            if b is None:
                break
            blocks.append(b)
        return blocks

    def cost(self, n_tokens: int, hashes: list[bytes]) -> int:
        """Free blocks that allocating ``n_tokens`` slots would take, given the cache (a cached block
        nobody holds is on the free list, so reviving it takes one too)."""
        hit = self.cached_prefix(hashes)
        return blocks_for(n_tokens, self.block_size) - len(hit) + sum(1 for b in hit if self.ref[b] == 0)

    def allocate(self, n_tokens: int, hashes: list[bytes]) -> tuple[list[int], int]:
        """A block table for ``n_tokens`` slots, cached blocks first: ``(table, cached_tokens)``.
        ``hashes`` (from ``hashes``) should stop before the last token, which must be computed."""
        if self.cost(n_tokens, hashes) > len(self.free):
            raise OutOfBlocks(f"{n_tokens} slots need more than the {len(self.free)} free blocks")
        hit = self.cached_prefix(hashes)
        for b in hit:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1
        table = list(hit)
        for _ in range(blocks_for(n_tokens, self.block_size) - len(hit)):
            table.append(self._take())
        self.stats["hit_blocks"] += len(hit)
        self.stats["miss_blocks"] += len(table) - len(hit)
        return table, len(hit) * self.block_size

    def fork(self, table: list[int], n_tokens: int) -> list[int]:
        """A table for a sequence with the same first ``n_tokens`` as ``table``'s: its full blocks
        shared (a reference each), a fresh block for the partial last one, whose slots the engine
        copies (the two sequences will write different tokens there)."""
        full = n_tokens // self.block_size
        need = blocks_for(n_tokens, self.block_size) - full
        if need > len(self.free):
            raise OutOfBlocks(f"forking needs {need} free block(s), {len(self.free)} free")
        for b in table[:full]:
            self.ref[b] += 1
        self.stats["hit_blocks"] += full
        return table[:full] + [self._take() for _ in range(need)]

    def _take(self) -> int:
        if not self.free:
            raise OutOfBlocks("no free KV block")
        b, _ = self.free.popitem(last=False)
        old = self.hash_of[b]
        if old is not None:  # its cached contents are about to be overwritten
            if self.cached.get(old) == b:
                del self.cached[old]
            self.hash_of[b] = None
        self.ref[b] = 1
        return b

    # -- growing and releasing ----------------------------------------------------------------------
    def grow(self, table: list[int], n_tokens: int) -> None:
        """Make ``table`` hold ``n_tokens`` slots (at most one new block per call in decode)."""
        need = blocks_for(n_tokens, self.block_size) - len(table)
        if need > len(self.free):
            raise OutOfBlocks(f"{need} more blocks needed, {len(self.free)} free")
        for _ in range(need):
            table.append(self._take())

    def can_grow(self, table: list[int], n_tokens: int) -> bool:
        return blocks_for(n_tokens, self.block_size) - len(table) <= len(self.free)

    def register(self, table: list[int], hashes: list[bytes]) -> None:
        """Record the first ``len(hashes)`` blocks of ``table`` as full, under those hashes (their
        keys and values are written). A hash another block already holds keeps that block."""
        for b, h in zip(table, hashes):
            if self.hash_of[b] is None and h not in self.cached:
                self.hash_of[b] = h
                self.cached[h] = b

    def release(self, table: list[int]) -> None:
        """Drop one reference to each block; blocks nobody holds go back (last block first, so a
        prompt's first blocks, which others are likeliest to share, are reused last)."""
        for b in reversed(table):
            self.ref[b] -= 1
            if self.ref[b] < 0:
                raise AssertionError(f"KV block {b} released more often than taken")
            if self.ref[b] == 0:
                self.free[b] = None
        table.clear()

    def forget(self) -> None:
        """Drop the prefix cache (the weights changed: cached keys and values are stale)."""
        for b in self.cached.values():
            self.hash_of[b] = None
        self.cached.clear()


# -- the pool's tensors: how many blocks a memory budget buys, and the tensors themselves ---------------
# A token's keys and values take ``2 x layers x kv_heads x head_dim`` elements of the engine's dtype;
# ``gpu_memory_utilization`` is the fraction of the device's memory (of the host's on a CPU) the pool
# may take, ``kv_blocks`` a block count that overrides it. The pool is allocated once; a device that
# cannot hold it is an error that names the setting to lower.

def kv_bytes_per_token(model, dtype) -> int:
    cfg = core_model(model).config
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * cfg.num_hidden_layers * kv * d * torch.tensor([], dtype=dtype).element_size()


def device_memory(dev) -> int:

    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def pool_blocks(model, dtype, dev, block_size: int, utilization: float,
                kv_blocks: int | None = None) -> int:
    """The pool's block count: ``kv_blocks`` when given, else what ``utilization`` of the device holds."""
    per_token = kv_bytes_per_token(model, dtype)
    if kv_blocks is None:
        kv_blocks = int(utilization * device_memory(dev)) // (per_token * block_size)
    if kv_blocks < 2:
        raise ValueError(f"the KV budget holds {kv_blocks} blocks of {block_size} tokens ({per_token:,} bytes a "
                         f"token); raise rollout.gpu_memory_utilization")
    return kv_blocks


def allocate_pool(model, layers: int, slots: int, shape: tuple[int, int], dtype, dev) -> list[tuple]:
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

"""One call in the paged engine: what it carries beside its tokens, its random numbers, the tokens it keeps.

A call runs as a ``Sequence`` (its tokens, KV blocks and finish, what the scheduler reads) whose ``call`` is a
``Call`` (its request, random numbers and caller). Token ``t`` of a call with a seed
uses ``counter_uniforms(seed)[t]`` whatever step, batch or pre-emption it lands in; ``keep_tokens``
cuts a chunk's sampled tokens at the call's first stop (token or string) or its limit and tells the
call's caller as soon as it finishes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
import torch

from masrl.engines.paged.blocks import BlockPool, blocks_for
from masrl.engines.sampling import stop_string_at
from masrl.messages import GenOutput, GenRequest


@dataclass
class Call:
    """What a sequence needs beyond its tokens."""

    request: GenRequest
    uniforms: np.ndarray | None  # [max_new] when the request carries a seed
    index: int = 0  # its place in its ``generate``'s requests
    on_done: Callable[[int, GenOutput], None] | None = None  # told as soon as it finishes
    told: bool = False  # on_done has returned (or there is none): its caller may take the list

    def __post_init__(self):
        self.told = self.on_done is None


@dataclass(eq=False)
class Sequence:
    """One call as the engine runs it."""

    prompt: list[int]
    max_new: int
    key: Hashable = None  # what its keys and values depend on besides the tokens (a LoRA adapter)
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    table: list[int] = field(default_factory=list)  # its KV blocks
    kv_len: int = 0  # tokens whose keys and values are in ``table``
    cached: int = 0  # tokens of the last prefill taken from the prefix cache
    preempted: int = 0
    finish: str | None = None  # "stop" | "length" once done
    error: BaseException | None = None
    call: Call | None = None  # what the engine keeps of the request beside its tokens (sampling, random numbers)
    fork_of: Sequence | None = None  # in a prefill step: the sequence with the same tokens it copies
    epoch: int = 0  # the scheduler's weight epoch when its keys and values started being computed
    _chain: list[bytes] = field(default_factory=list)  # hashes of its full blocks so far (tokens only grow)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.generated)

    @property
    def done(self) -> bool:
        return self.finish is not None or self.error is not None

    def hashes(self, pool: BlockPool, limit: int | None = None) -> list[bytes]:
        """Hashes of its full blocks among its first ``limit`` tokens (default: all but the last, which
        is always computed); each block is hashed once in the sequence's life."""
        n = self.length - 1 if limit is None else limit
        if len(self._chain) < n // pool.block_size:
            pool.hashes(self.tokens, self.key, limit=n, known=self._chain)
        return self._chain[: n // pool.block_size]



def settled(s: Sequence) -> bool:
    """Done, and its ``on_done`` (if any) has run: a caller woken between the two must keep waiting,
    or it would make the call's result a second time."""
    return s.error is not None or (s.finish is not None and s.call.told)


def chunk_uniforms(seqs: list[Sequence], k: int, rng: np.random.Generator, ahead: int = 0) -> np.ndarray:
    """``[rows, k]``: each call's random numbers for its next ``k`` tokens after ``ahead`` tokens not yet
    taken (a chunk still on the device) (by its seed's counter; a call without a seed draws from ``rng``)."""
    U = np.empty((len(seqs), k), dtype=np.float32)
    for b, s in enumerate(seqs):
        u, g = s.call.uniforms, len(s.generated) + ahead
        if u is not None:
            row = u[g : g + k]
            U[b, : len(row)] = row
            U[b, len(row) :] = 0.5  # past its limit: the tokens are dropped
        else:
            U[b] = rng.random(k)
    return U


def keep_tokens(seqs: list[Sequence], sp: list, T: list[list[int]], L: list[list[float]], *, stop_set: set,
                tok, sched, output: Callable[[Sequence], object], decoded: bool = True) -> bool:
    """Each call keeps its new tokens ``T`` (logprobs ``L``) up to its first stop or its limit; returns
    whether one finished. ``decoded``: each kept token's input went through a decode step, so its keys
    and values are in the call's blocks (after a prefill the sampled token's are not yet)."""
    any_done = False
    for s, p, new, new_lp in zip(seqs, sp, T, L):
        new = new[: s.max_new - len(s.generated)]
        n, reason = len(new), None
        if not p.ignore_eos and not stop_set.isdisjoint(new):
            n, reason = next(j for j, t in enumerate(new) if t in stop_set) + 1, "stop"
        if p.stop:
            hit = stop_string_at(tok, s.generated, new[:n], p.stop)
            if hit is not None:
                n, reason = hit, "stop"
        s.generated += new[:n]
        s.logprobs += new_lp[:n]
        if decoded:
            s.kv_len += n
        if reason is not None:
            s.finish = reason
        elif len(s.generated) >= s.max_new:
            s.finish = "length"
        if s.finish is not None:
            sched.finished(s)
            any_done = True
            if s.call.on_done is not None:
                try:
                    s.call.on_done(s.call.index, output(s))
                finally:  # a failing callback fails the engine's calls (raised); none waits forever
                    s.call.told = True
    return any_done


@dataclass
class Chunk:
    """A decode chunk launched on the device whose tokens the host has not taken yet: ``k`` steps of
    ``seqs``; on a GPU its tokens and logprobs come back into pinned host memory behind ``event``."""

    seqs: list[Sequence]
    sp: list
    toks: torch.Tensor  # [k, rows]
    lps: torch.Tensor
    event: object | None = None

    @property
    def k(self) -> int:
        return self.toks.shape[0]

    @classmethod
    def launched(cls, seqs: list[Sequence], sp: list, toks: torch.Tensor, lps: torch.Tensor) -> Chunk:
        """The chunk whose device results are ``toks``/``lps``; on CUDA their copy to the host is queued now
        (the host reads them once ``event`` has passed, while the device runs what was queued after)."""
        if toks.device.type != "cuda":
            return cls(seqs, sp, toks, lps)
        th = torch.empty(toks.shape, dtype=toks.dtype, pin_memory=True)
        lh = torch.empty(lps.shape, dtype=lps.dtype, pin_memory=True)
        th.copy_(toks, non_blocking=True)
        lh.copy_(lps, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(toks.device))
        return cls(seqs, sp, th, lh, event)

    def results(self) -> tuple[list[list[int]], list[list[float]]]:
        """``[rows][k]`` tokens and logprobs (waits for the device's copy)."""
        if self.event is not None:
            self.event.synchronize()
        return self.toks.t().tolist(), self.lps.t().tolist()


def continuation_steps(c: Chunk, running: list[Sequence], pool: BlockPool, sync_every: int) -> int:
    """Steps of the chunk that may follow ``c`` before the host takes ``c``'s tokens (the same calls go on
    from the device's last tokens and positions), or 0 when the host must take them first: the running
    set is not ``c``'s, no call has tokens left after ``c``, or a call's blocks cannot grow without a
    pre-emption. Grows the tables of the calls that need a block for it."""
    if len(running) != len(c.seqs) or any(a is not b for a, b in zip(running, c.seqs)):
        return 0
    left = [s.max_new - len(s.generated) - c.k for s in c.seqs]
    k = min(sync_every, max(left))
    if k <= 0:
        return 0
    for s, n in zip(c.seqs, left):  # blocks grown before a call that cannot grow stay with their calls
        need = s.kv_len + c.k + min(k, max(n, 1))
        if blocks_for(need, pool.block_size) > len(s.table):
            if not pool.can_grow(s.table, need):
                return 0
            pool.grow(s.table, need)
    return k

"""Which sequences run in the next engine step: continuous batching over a KV block pool. Pure Python.

Each step is either a *prefill* (new or re-queued sequences computed up to their last token) or a
*decode* (every running sequence advances one token). Prefill goes first whenever a waiting
sequence fits the pool, so a call that arrives while others decode joins them at the next step
boundary and nobody waits for a batch to end. A finished sequence leaves at once and its blocks
go back to the pool.

When the pool runs dry in decode, the newest running sequence is pre-empted: its blocks are
released (its full blocks keep their hashes, so its recompute can often take them back) and it
goes to the front of the queue with the tokens it has; when re-admitted it is prefilled over its
prompt *and* those tokens, then decodes on. Pre-emption never fails a call; only a call that could
not fit the whole pool alone is refused, when it is added.

Samples of one group arrive together with the same prompt: the first is prefilled and the others
*fork* from it in the same step (its full blocks shared, its partial last block copied, its
last-position logits reused), so a group costs one prefill. A call whose prompt only starts like
one being prefilled (the next turn of a sibling's episode) waits one step and then takes the
shared blocks from the prefix cache.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from masrl.engines.paged.blocks import BlockPool, OutOfBlocks, blocks_for
from masrl.engines.paged.calls import Sequence


@dataclass
class Step:
    kind: str  # "prefill" | "decode"
    seqs: list[Sequence]


class Scheduler:
    def __init__(self, pool: BlockPool, *, max_seqs: int = 256, prefill_tokens: int = 8192, stats: dict | None = None):
        """``stats``: the counters to add to (the engine's one stats object, which outlives a rebuilt scheduler)."""
        self.pool = pool
        self.max_seqs = max_seqs
        self.prefill_tokens = prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.epoch = 0  # weight changes so far: blocks computed before the last one never join the cache
        self.stats = {} if stats is None else stats
        for k in ("preemptions", "prefill_tokens", "cached_tokens", "prefills", "decodes", "forks"):
            self.stats.setdefault(k, 0)

    def fits(self, seq: Sequence) -> bool:
        """Could ``seq`` run to its token limit with the whole pool to itself?"""
        return blocks_for(len(seq.prompt) + seq.max_new, self.pool.block_size) <= self.pool.usable

    def add(self, seq: Sequence) -> None:
        if not self.fits(seq):
            raise ValueError(f"a call of {len(seq.prompt)} prompt tokens and up to {seq.max_new} new ones needs "
                             f"{blocks_for(len(seq.prompt) + seq.max_new, self.pool.block_size)} KV blocks; "
                             f"the pool holds {self.pool.usable}")
        self.waiting.append(seq)

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self, lookahead: int = 1) -> Step | None:
        """The next step; a decode step reserves each sequence's slots for up to ``lookahead`` tokens
        (the engine runs that many decode steps before it reads the tokens back)."""
        admitted = self._admit()
        if admitted:
            self.stats["prefills"] += 1
            return Step("prefill", admitted)
        if not self.running:
            return None
        self._make_room(lookahead)
        self.stats["decodes"] += 1
        return Step("decode", list(self.running))

    def _admit(self) -> list[Sequence]:
        pool, out, budget = self.pool, [], self.prefill_tokens
        computing: set[bytes] = set()  # hashes of the blocks this step's prefills compute
        leaders: dict[tuple, Sequence] = {}  # this step's prefills, by (key, tokens)
        deferred: list[Sequence] = []
        while self.waiting and len(self.running) + len(out) < self.max_seqs:
            seq = self.waiting[0]
            leader = leaders.get((seq.key, tuple(seq.tokens)))
            if leader is not None:
                if not self._fork(seq, leader):
                    break
                out.append(self.waiting.popleft())
                continue
            hashes = seq.hashes(pool)
            n_hit = len(pool.cached_prefix(hashes))
            if n_hit < len(hashes) and hashes[n_hit] in computing:
                deferred.append(self.waiting.popleft())  # a sibling computes these blocks now: take them next step
                continue
            hit = n_hit * pool.block_size
            new = seq.length - hit
            if out and new > budget:
                break
            try:
                seq.table, seq.cached = pool.allocate(seq.length, hashes)
            except OutOfBlocks:
                break
            self.waiting.popleft()
            seq.kv_len = seq.cached
            seq.epoch = self.epoch
            budget -= new
            self.stats["prefill_tokens"] += new
            self.stats["cached_tokens"] += seq.cached
            computing.update(hashes[n_hit:])
            leaders[(seq.key, tuple(seq.tokens))] = seq
            out.append(seq)
        self.waiting.extendleft(reversed(deferred))
        self.running.extend(out)
        return out

    def _fork(self, seq: Sequence, leader: Sequence) -> bool:
        """``seq`` has ``leader``'s tokens: it shares the leader's blocks and result (see the module
        docstring); False when the pool has no block for its copy of the partial last block."""
        try:
            seq.table = self.pool.fork(leader.table, seq.length)
        except OutOfBlocks:
            return False
        seq.kv_len = seq.cached = seq.length
        seq.epoch = leader.epoch
        seq.fork_of = leader
        self.stats["cached_tokens"] += seq.length
        self.stats["forks"] += 1
        return True

    def _make_room(self, lookahead: int) -> None:
        """Every running sequence gets the slots for its next tokens (at most ``lookahead``, at most what
        its limit leaves); pre-empt the newest while one cannot."""
        pool = self.pool
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            need = seq.kv_len + max(1, min(lookahead, seq.max_new - len(seq.generated)))
            if blocks_for(need, pool.block_size) <= len(seq.table):  # its blocks hold the chunk already (most chunks)
                i += 1
                continue
            while not pool.can_grow(seq.table, need):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break
            else:
                pool.grow(seq.table, need)
                i += 1

    def _share(self, seq: Sequence) -> None:
        """Offer ``seq``'s full blocks to the prefix cache, unless the weights changed since they were computed."""
        if seq.epoch == self.epoch:
            self.pool.register(seq.table, seq.hashes(self.pool, limit=seq.kv_len))

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._share(seq)
        self.pool.release(seq.table)
        seq.kv_len = 0
        seq.preempted += 1
        self.stats["preemptions"] += 1
        self.waiting.appendleft(seq)

    def finished(self, seq: Sequence) -> None:
        """``seq`` is done (or failed): its full blocks stay findable for the next turn of its episode."""
        if seq in self.running:
            self.running.remove(seq)
        if seq.table:
            self._share(seq)
            self.pool.release(seq.table)

    def registered(self, seq: Sequence) -> None:
        """After a prefill: ``seq``'s full prompt blocks hold their keys and values; share them."""
        self._share(seq)

    def drop_all(self) -> list[Sequence]:
        """Every sequence, running or waiting, out (the engine failed or is being released)."""
        out = list(self.running) + list(self.waiting)
        for seq in self.running:
            self.pool.release(seq.table)
        self.running.clear()
        self.waiting.clear()
        return out

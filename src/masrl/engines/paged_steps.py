"""The paged engine's device steps: the step buffers, prefills (token rows of the decode graphs or the lean
forward), decode chunks (one in flight while the host takes the last) and the paged attention of a step.

``PagedSteps`` is ``PagedEngine``'s base (engines/paged.py): the engine owns the calls, the threads, the
scheduler and the pool (``self.sched``, ``self.pool``, ``self.kv``, ``self.prefill``, ``self.stats``, set in
its ``__init__``) and runs one of these steps at a time; here is what a step does on the device.
"""

from __future__ import annotations

import numpy as np
import torch

from masrl.engines import paged_calls, paged_kernels
from masrl.engines.decode_weights import batch_bucket, slot_bucket
from masrl.engines.decoder import GraphDecoder
from masrl.engines.paged_prefill import block_tables, rows_bucket, token_rows
from masrl.engines.sampling import BatchFlags
from masrl.engines.scheduler import Sequence

# A prefill whose calls' new tokens read at most ROWS_PREFILL_KEYS keys in all (new tokens x their past, each
# row reading its own) runs as token rows through the decode graphs, ROWS_PREFILL_BATCH rows a replay
ROWS_PREFILL_KEYS = 1 << 21
ROWS_PREFILL_BATCH = 512


class PagedSteps(GraphDecoder):
    """What one step of the paged engine does on the device (its state is set up by ``PagedEngine``)."""

    # -- the step buffers --------------------------------------------------------------------------
    def _ensure(self, rows: int, width: int) -> None:
        if rows <= self.rows_cap and width <= self.width_cap:
            return
        self.rows_cap = max(rows, self.rows_cap)
        self.width_cap = max(-(-width // 64) * 64, self.width_cap)
        R, W, dev = self.rows_cap, self.width_cap, self.dev
        self.graphs.clear()
        self.graph_pool = None
        self.tok_buf = torch.zeros(R, dtype=torch.long, device=dev)
        self.pos_buf = torch.zeros(R, dtype=torch.long, device=dev)
        self.slot_buf = torch.zeros(R, dtype=torch.long, device=dev)
        self.len_buf = torch.ones(R, dtype=torch.int32, device=dev)
        self.bt_buf = torch.zeros((R, W), dtype=torch.int32, device=dev)
        self.row_adapter = torch.full((R,), -1, dtype=torch.long, device=dev)
        self.masks = {cols: torch.zeros((R, len(cols)), dtype=self.dtype, device=dev) for cols in self.w.layouts}
        self.col_index = {cols: torch.tensor(cols, dtype=torch.long, device=dev) for cols in self.w.layouts}
        self.bt_host = np.zeros((R, W), dtype=np.int32)

    # -- prefill: the calls' new tokens into their blocks, the logits after each call's last ----------------
    def _prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Token rows through the decode step's graphs (``_prefill_rows``) when they are on and the rows read
        few keys in all (next turns: a few new tokens over a cached past); else the lean forward
        (``PoolPrefill.run``: long prompts, where its attention reads each key once for all new tokens)."""
        lead = [s for s in seqs if s.fork_of is None]
        n = np.array([s.length - s.cached for s in lead], dtype=np.int64)
        c = np.array([s.cached for s in lead], dtype=np.int64)
        if not self.graph_prefill or int((n * c + n * (n + 1) // 2).sum()) > ROWS_PREFILL_KEYS:
            self.stats["forward_prefills"] += 1
            return self.prefill.run(seqs, self.kv)
        self.stats["row_prefills"] += 1
        return self._prefill_rows(seqs, lead, n, c)

    def _prefill_rows(self, seqs: list[Sequence], lead: list[Sequence], n: np.ndarray, c: np.ndarray) -> torch.Tensor:
        """A prefill as decode steps whose rows are tokens: row ``t`` of call ``s`` is the token at position
        ``cached + t`` over ``s``'s block table. Every layer writes all rows' keys and values into their
        slots before any row attends, so a row sees its call's earlier new tokens as it would its cached
        past: one replay of a captured decode graph computes up to ``ROWS_PREFILL_BATCH`` new tokens of any
        number of calls, where the lean forward pads every call to the longest and launches each kernel
        from Python. The graph stops before the output head (variant "rows"); the head runs on each leader's
        last row; forks copy its logits (``PoolPrefill``)."""
        dev, bs, pk = self.dev, self.block_size, paged_kernels
        logits = torch.empty((len(seqs), self.core.lm_head.weight.shape[0]), dtype=self.dtype, device=dev)
        row_of, pos, last = token_rows(n, c)
        T = len(row_of)
        toks = torch.from_numpy(np.fromiter((t for s in lead for t in s.tokens[s.cached : s.length]), dtype=np.int64,
                                            count=T))
        into = np.array([i for i, s in enumerate(seqs) if s.fork_of is None], dtype=np.int64)
        tables = block_tables(lead)
        width = tables.shape[1]
        keys = [s.key for s in lead]
        self.variant = "rows"
        try:
            for a in range(0, T, ROWS_PREFILL_BATCH):
                b = min(T, a + ROWS_PREFILL_BATCH)
                Bb = rows_bucket(b - a)
                top = int(pos[a:b].max()) + 1
                S = pk.paged_length_class(top) if self.fused.get("paged_attention") else slot_bucket(top)
                self._ensure(Bb, max(width, -(-max(S, 1) // bs)) + 1)
                who = row_of[a:b]
                self._load(Bb, tables[who], pos[a:b], toks[a:b], [keys[j] for j in who])
                h = self._decode(Bb, S, count=False)  # final hidden states of the rows
                done = np.nonzero((last >= a) & (last < b))[0]
                if len(done):
                    logits[torch.from_numpy(into[done]).to(dev)] = self._head(h[torch.from_numpy(last[done] - a).to(dev)])
        finally:
            self.variant = ""
        for s in lead:
            s.kv_len = s.length
        self.prefill.copy_forks(seqs, logits, self.kv)
        return logits

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> bool:
        """Each just-prefilled call's next token, from the prefill's logits."""
        sp, temps, top_ps, flags = self._sampling(seqs)
        u = torch.from_numpy(self._uniforms(seqs, 1)[:, 0]).to(self.dev)
        tokens, lps = self._draw(logits[: len(seqs)], temps, top_ps, flags, u)
        return self._take(seqs, sp, [[t] for t in tokens.tolist()], [[x] for x in lps.tolist()], decoded=False)

    def _sampling(self, seqs: list[Sequence]) -> tuple[list, torch.Tensor, torch.Tensor, BatchFlags]:
        """The calls' sampling settings and their device tensors; the last ones again while the same calls
        decode (most chunks: the running set changes only when a call joins or leaves)."""
        key = tuple(map(id, seqs))
        if self._last_sampling is not None and self._last_sampling[0] == key:
            return self._last_sampling[1]
        sp = [s.payload.request.sampling for s in seqs]
        temps, top_ps = [p.temperature for p in sp], [p.top_p for p in sp]
        out = (sp, torch.tensor(temps, device=self.dev), torch.tensor(top_ps, device=self.dev),
               BatchFlags.of(temps, top_ps))
        self._last_sampling = (key, out, list(seqs))  # the calls kept alive, so their ids are not reused
        return out

    # -- decode: one token for every running call ------------------------------------------------------
    def _decode_chunk(self, seqs: list[Sequence]) -> bool:
        """Up to ``sync_every`` decode steps for every running call, the sampled tokens kept on the
        device and read back once; a call that finishes inside the chunk rides along to its end (its
        extra tokens dropped; writes past its blocks land in the scratch block). With ``overlap_chunks``
        the tokens are taken at the next step, after the chunk that follows is queued. Returns whether a
        call finished."""
        k = max(1, min(self.sync_every, max(s.max_new - len(s.generated) for s in seqs)))
        chunk = self._launch(seqs, k)
        if self.overlap_chunks:
            self._inflight = chunk
            return False
        return self._take(seqs, chunk.sp, *chunk.results())

    def _take_inflight(self, follow: bool = False) -> bool:
        """Take the tokens of the chunk in flight; first, when ``follow`` and its calls can go on
        (``paged_calls.continuation_steps``), queue the chunk that follows it from the device's state, so the
        device decodes while the host keeps tokens and tells callers."""
        c, self._inflight = self._inflight, None
        k = paged_calls.continuation_steps(c, self.sched.running, self.sched.pool, self.sync_every) if follow else 0
        if k:
            self._inflight = self._launch(c.seqs, k, ahead=c.k)
            if self._inflight is not None:
                self.sched.stats["decodes"] += 1
                self.stats["overlapped_chunks"] += 1
        T, L = c.results()
        live = [i for i, s in enumerate(c.seqs) if s.finish is None and s.error is None]
        return self._take([c.seqs[i] for i in live], [c.sp[i] for i in live], [T[i] for i in live],
                          [L[i] for i in live])

    def _launch(self, seqs: list[Sequence], k: int, ahead: int = 0) -> paged_calls.Chunk | None:
        """Queue ``k`` decode steps of ``seqs``: from the host's state (``ahead`` 0), or going on from the
        device's tokens and positions ``ahead`` steps past it (a chunk in flight; only the block tables are
        sent again, from pinned memory, so nothing waits for that chunk). None: going on would need larger
        step buffers (new buffers lose the device's state; the host takes the chunk in flight first)."""
        B, bs, dev = len(seqs), self.block_size, self.dev
        Bb = batch_bucket(B)
        kv = np.array([s.kv_len + ahead for s in seqs], dtype=np.int64)
        top = int(kv.max()) + k
        # the fused kernel reads each row's length on the device: one graph per batch bucket and length class
        # (short rows and long ones launch it differently) serves any length
        S = paged_kernels.paged_length_class(top) if self.fused.get("paged_attention") else slot_bucket(top)
        width = max(max(len(s.table) for s in seqs), -(-top // bs), -(-max(S, 1) // bs)) + 1
        if ahead:
            if Bb > self.rows_cap or width > self.width_cap:
                return None
            self._put_tables(Bb, block_tables(seqs), staged=True)
        else:
            self._ensure(Bb, width)
            self._load_rows(seqs, Bb, kv)
        sp, temps, top_ps, flags = self._sampling(seqs)
        U_dev = self._staged(self._uniforms(seqs, k, ahead)).to(dev, non_blocking=True)
        toks, lps = [], []
        for j in range(k):
            logits = self._decode(Bb, S)
            t, lp = self._draw(logits[:B], temps, top_ps, flags, U_dev[:, j])
            self.tok_buf[:B].copy_(t)
            toks.append(t)
            lps.append(lp)
        return paged_calls.Chunk.launched(seqs, sp, torch.stack(toks), torch.stack(lps))

    def _staged(self, a: np.ndarray) -> torch.Tensor:
        """``a`` as a host tensor a non-blocking copy can read: pinned (a private copy) on a GPU."""
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.pin_memory() if self.dev.type == "cuda" else t

    def _load_rows(self, seqs: list[Sequence], Bb: int, kv: np.ndarray) -> None:
        """The chunk's inputs into the device buffers: block tables, positions, last tokens, adapters."""
        self._load(Bb, block_tables(seqs), kv, torch.tensor([s.generated[-1] for s in seqs]), [s.key for s in seqs])

    def _load(self, Bb: int, tables: np.ndarray, pos: np.ndarray, toks: torch.Tensor, keys: list) -> None:
        """Rows ``[0, B)`` of the step's device buffers: each row's block table, position, token and adapter
        (``keys``); rows ``[B, Bb)`` are pads (block table of zeros, position 0: they write the scratch block)."""
        B = len(tables)
        self._put_tables(Bb, tables)
        p = np.zeros(Bb, dtype=np.int64)
        p[:B] = pos
        self.pos_buf[:Bb].copy_(torch.from_numpy(p))
        self.tok_buf[:B].copy_(toks)
        if self.is_peft:
            ad = [self.slot_of.get(k, -1) for k in keys] + [-1] * (Bb - B)
            self.row_adapter[:Bb].copy_(torch.tensor(ad))
            for cols, m in self.masks.items():
                m[:Bb].copy_((self.row_adapter[:Bb, None] == self.col_index[cols][None, :]).to(self.dtype))

    def _put_tables(self, Bb: int, tables: np.ndarray, staged: bool = False) -> None:
        """Rows ``[0, Bb)`` of the block-table buffer: ``tables`` first, zeros after (pads: the scratch block);
        ``staged``: through pinned memory, queued behind the device's work (a chunk in flight reads it)."""
        bt = self.bt_host
        bt[:Bb] = 0
        bt[: len(tables), : tables.shape[1]] = tables
        if staged:
            self.bt_buf[:Bb].copy_(self._staged(bt[:Bb]), non_blocking=True)
        else:
            self.bt_buf[:Bb].copy_(torch.from_numpy(bt[:Bb]))

    def _uniforms(self, seqs: list[Sequence], k: int, ahead: int = 0) -> np.ndarray:
        return paged_calls.chunk_uniforms(seqs, k, self.host_rng, ahead)

    def _take(self, seqs: list[Sequence], sp: list, T: list[list[int]], L: list[list[float]], *,
              decoded: bool = True) -> bool:
        """Each call keeps its new tokens (``paged_calls.keep_tokens``); returns whether one finished."""
        return paged_calls.keep_tokens(seqs, sp, T, L, stop_set=self.stop_set, tok=self.tok, sched=self.sched,
                                       output=self._output, decoded=decoded)

    def _check_kernels(self) -> dict:
        fwd = self.fwd
        return {**super()._check_kernels(),
                **paged_kernels.check(self.dev, self.dtype, fwd.n_heads, fwd.n_kv, fwd.head_dim)}

    def _attention(self, li, qkv, cos, sin, B, S):
        f, fwd, pk = self.fused, self.fwd, paged_kernels
        kf, vf = self.kv[li]
        if f.get("paged_rope_attention") and S < pk.PAGED_LONG_KEYS and self.variant != "rows":
            # pk.PAGED_FUSED_ROPE: the two below as one (slower than the two kernels at long lengths;
            # benchmarks/kernel_sweep.py). Not for a prefill's token rows: a row reads keys that other rows of
            # its call write in the same launch, so every row's keys must be written before any row attends
            return pk.paged_rope_attention(qkv, cos, sin, kf, vf, self.slot_buf[:B], self.bt_buf[:B], self.len_buf[:B],
                                           fwd.n_heads, fwd.n_kv, fwd.head_dim, S, self.block_size, fwd.scale)
        rope = pk.rope_and_cache_paged if f.get("rope_and_cache_paged") else pk.rope_and_cache_paged_ref
        q = rope(qkv, cos, sin, kf, vf, self.slot_buf[:B], fwd.n_heads, fwd.n_kv, fwd.head_dim)
        args = (q, kf, vf, self.bt_buf[:B], self.len_buf[:B], S, self.block_size, fwd.scale)
        if f.get("paged_attention"):
            o = pk.paged_attention(*args, splits=pk.paged_splits(B, fwd.n_kv, S) if f.get("paged_attention_split") else 1)
        else:
            o = pk.paged_attention_ref(*args)
        return o.reshape(B, fwd.n_heads * fwd.head_dim)

    def _decode_body(self, B: int, S: int) -> torch.Tensor:
        """Each row's slot (through its block table) and length from its position, then the step."""
        bs, pos = self.block_size, self.pos_buf[:B]
        self.slot_buf[:B].copy_(self.bt_buf[:B].gather(1, (pos // bs)[:, None]).squeeze(1).long() * bs + pos % bs)
        self.len_buf[:B].copy_(pos + 1)
        return self._layers(B, S)

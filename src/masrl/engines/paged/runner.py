"""ModelRunner: everything the paged engine does on the device, in one class. The engine (engine.py) decides which
calls run in a step and keeps their tokens; the runner holds the fused weight copies (``DecodeWeights``), the KV pool
and the step buffers, and runs prefill (token rows of the decode step's graphs when they read few keys, else the
lean forward: ``prefill.PoolPrefill``) and decode: one step for rows ``[0, B)`` (q/k/v and gate/up as one matmul each
with the rows' LoRA columns, rope and the KV write, paged attention through the block tables), captured as a CUDA
graph per (batch bucket, length class) and replayed, on the fused Triton kernels that agreed with their torch
references at start-up (``kernels.check_all``), torch elsewhere and on a CPU.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F

from masrl.engines.paged import blocks, calls
from masrl.engines.paged import kernels as K
from masrl.engines.paged.calls import Sequence
from masrl.engines.paged.prefill import PoolPrefill, block_tables, rows_bucket, token_rows
from masrl.engines.paged.weights import (
    DecodeWeights,
    base_linear,
    batch_bucket,
    capture_lock,
    capture_stream,
    lora_delta,
    residual_linear,
    slot_bucket,
)
from masrl.engines.sampling import BatchFlags, sample_tokens
from masrl.modeling.lean import LlamaForward
from masrl.modeling.sizes import tensor_bytes

# A prefill whose calls' new tokens read at most ``rows_keys`` keys in all (new tokens x their past, each row reading
# its own; ``PagedOptions.prefill_rows_keys``) runs as token rows through the decode graphs, ``rows_batch`` rows a
# replay (``prefill_rows``)
BUFFERS = ("tok_buf", "pos_buf", "slot_buf", "len_buf", "bt_buf", "row_adapter", "masks", "col_index")


# The paged engine's settings: one typed object, built once by ``PagedEngine`` from its keyword arguments; the model
# runner (here) reads most of them, the engine the rest. The driver fills it from the ``rollout`` section
# (``driver/builder.engine_options``).
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


class ModelRunner:
    def __init__(self, model, *, device: str, seed: int, pad_id: int, stats: dict, options: PagedOptions):
        self.model = model
        self.fwd = LlamaForward(model)
        self.core = self.fwd.core
        self.dev = torch.device(device)
        self.dtype = self.core.model.embed_tokens.weight.dtype
        self.is_peft = hasattr(model, "peft_config")
        self.adapters = list(model.peft_config) if self.is_peft else []
        self.slot_of = {name: i for i, name in enumerate(self.adapters)}
        self.block_size = block_size = options.block_size
        self.rows_batch = options.prefill_rows  # token rows a replay of a prefill as decode rows (graph_prefill)
        self.rows_keys = options.prefill_rows_keys  # past it, a prefill's keys read in all, it takes the lean forward instead
        self.w: DecodeWeights | None = DecodeWeights(model, self.adapters)
        self.use_graphs = options.cuda_graphs and self.dev.type == "cuda"
        # token rows of the decode graphs for a prefill (rollout.graph_prefill): None = where the graphs replay
        self.graph_prefill = self.use_graphs if options.graph_prefill is None else options.graph_prefill
        self.fused: dict[str, bool] = {}  # op name -> use the fused Triton version
        if options.fused_kernels and K.available(self.dev):
            cfg, fwd = self.core.config, self.fwd
            verdict = K.check_all(self.dev, self.dtype, fwd.n_heads, fwd.n_kv, fwd.head_dim, cfg.hidden_size,
                                  cfg.intermediate_size)
            self.fused = {name: why is None for name, why in verdict.items()}
            self.fused["paged_rope_attention"] &= options.fused_rope
            bad = {name: why for name, why in verdict.items() if why is not None}
            if bad:
                warnings.warn(f"masrl paged engine: torch ops instead of fused kernels for {bad}", stacklevel=3)
        self.generator = torch.Generator(device=self.dev).manual_seed(seed)
        rot = self.core.model.rotary_emb
        self.inv_freq = rot.inv_freq
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.prefill_pool = PoolPrefill(self.fwd, block_size=block_size, budget=options.prefill_tokens, pad_id=pad_id,
                                        dtype=self.dtype, dev=self.dev, is_peft=self.is_peft,
                                        flash_one_row=options.flash_one_row)
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.graphs: dict[tuple, tuple] = {}
        self.graph_pool = None
        # a graph key's third part: "rows" is a prefill's token rows, a step that writes every row's keys and values
        # before any row attends and returns the final hidden states (the head runs on each call's last row)
        self.variant = ""
        self.rows_cap = self.width_cap = 0
        self._last_sampling = None  # (ids of the calls, sampling's result, the calls) of the last chunk
        self.stats = stats
        stats.update({"graphs_captured": 0, "decode_steps": 0, "row_prefills": 0, "forward_prefills": 0,
                      "fused_kernels": sorted(n for n, on in self.fused.items() if on)})

    # -- what it holds ---------------------------------------------------------------------------------
    def build(self, kv_blocks: int) -> None:
        """The weight copies (after a release) and the KV pool of ``kv_blocks`` blocks, once."""
        if self.w is None:
            self.w = DecodeWeights(self.model, self.adapters)
        if not self.kv:
            self.kv = blocks.allocate_pool(self.model, len(self.fwd.layers), kv_blocks * self.block_size,
                                           (self.fwd.n_kv, self.fwd.head_dim), self.dtype, self.dev)

    def refresh(self) -> None:
        """The trainer changed the weights: the fused copies (or the adapters' columns) follow."""
        if self.w is not None:  # None: released, rebuilt from the live weights on the next build
            self.w.refresh(base=not self.is_peft, adapters=self.is_peft)

    def stale(self) -> list[str]:
        """The weight copies that differ from the live weights (``DecodeWeights.stale``); none when released."""
        return [] if self.w is None else self.w.stale()

    def memory(self) -> dict[str, int]:
        buffers = [self.__dict__.get(n) for n in BUFFERS[:5]] + list(self.__dict__.get("masks", {}).values())
        return {"kv": tensor_bytes([t for pair in self.kv for t in pair]),
                "weights": 0 if self.w is None else self.w.nbytes(), "buffers": tensor_bytes(buffers)}

    def release(self) -> None:
        """Drop the graphs (their private memory now, not when collected), the weight copies, the pool and buffers."""
        for graph, _ in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.graph_pool = None
        self.w = None
        self.kv = []
        for name in BUFFERS:
            self.__dict__.pop(name, None)
        self.rows_cap = self.width_cap = 0
        self._last_sampling = None
        self.stats["releases"] = self.stats.get("releases", 0) + 1

    @contextlib.contextmanager
    def device_scope(self):
        """This runner's device, and attention kernels with fixed costs (cuDNN's attention plans anew for every new
        key length, ~45 ms each time on an H200 with torch 2.11)."""
        if self.dev.type != "cuda":
            yield
            return
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with torch.cuda.device(self.dev), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                       SDPBackend.MATH]):
            yield

    def _ensure(self, rows: int, width: int) -> None:
        """Step buffers for ``rows`` rows and block tables ``width`` wide (new ones drop the graphs that read the old)."""
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

    # -- prefill: the calls' new tokens into their blocks, the logits after each call's last ------------------
    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Token rows through the decode step's graphs (``_prefill_rows``) when they are on and the rows read
        few keys in all (next turns: a few new tokens over a cached past); else the lean forward
        (``PoolPrefill.run``: long prompts, where its attention reads each key once for all new tokens)."""
        lead = [s for s in seqs if s.fork_of is None]
        n = np.array([s.length - s.cached for s in lead], dtype=np.int64)
        c = np.array([s.cached for s in lead], dtype=np.int64)
        if not self.graph_prefill or int((n * c + n * (n + 1) // 2).sum()) > self.rows_keys:
            self.stats["forward_prefills"] += 1
            return self.prefill_pool.run(seqs, self.kv)
        self.stats["row_prefills"] += 1
        return self._prefill_rows(seqs, lead, n, c)

    def _prefill_rows(self, seqs: list[Sequence], lead: list[Sequence], n: np.ndarray, c: np.ndarray) -> torch.Tensor:
        """A prefill as decode steps whose rows are tokens: row ``t`` of call ``s`` is the token at position
        ``cached + t`` over ``s``'s block table. Every layer writes all rows' keys and values into their
        slots before any row attends, so a row sees its call's earlier new tokens as it would its cached
        past: one replay of a captured decode graph computes up to ``rows_batch`` new tokens of any
        number of calls, where the lean forward pads every call to the longest and launches each kernel
        from Python. The graph stops before the output head (variant "rows"); the head runs on each leader's
        last row; forks copy its logits (``PoolPrefill``)."""
        dev, bs = self.dev, self.block_size
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
            for a in range(0, T, self.rows_batch):
                b = min(T, a + self.rows_batch)
                Bb = rows_bucket(b - a)
                top = int(pos[a:b].max()) + 1
                S = K.paged.paged_length_class(top) if self.fused.get("paged_attention") else slot_bucket(top)
                self._ensure(Bb, max(width, -(-max(S, 1) // bs)) + 1)
                who = row_of[a:b]
                self._load(Bb, tables[who], pos[a:b], toks[a:b], [keys[j] for j in who])
                h = self.decode(Bb, S, count=False)  # final hidden states of the rows
                done = np.nonzero((last >= a) & (last < b))[0]
                if len(done):
                    logits[torch.from_numpy(into[done]).to(dev)] = self.head(h[torch.from_numpy(last[done] - a).to(dev)])
        finally:
            self.variant = ""
        for s in lead:
            s.kv_len = s.length
        self.prefill_pool.copy_forks(seqs, logits, self.kv)
        return logits

    # -- sampling --------------------------------------------------------------------------------------
    def sampling(self, seqs: list[Sequence]) -> tuple[list, torch.Tensor, torch.Tensor, BatchFlags]:
        """The calls' sampling settings and their device tensors; the last ones again while the same calls
        decode (most chunks: the running set changes only when a call joins or leaves)."""
        key = tuple(map(id, seqs))
        if self._last_sampling is not None and self._last_sampling[0] == key:
            return self._last_sampling[1]
        sp = [s.call.request.sampling for s in seqs]
        temps, top_ps = [p.temperature for p in sp], [p.top_p for p in sp]
        out = (sp, torch.tensor(temps, device=self.dev), torch.tensor(top_ps, device=self.dev),
               BatchFlags.of(temps, top_ps))
        self._last_sampling = (key, out, list(seqs))  # the calls kept alive, so their ids are not reused
        return out

    def draw(self, logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, flags: BatchFlags,
             uniforms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's next token and its logprob: the fused sampler (two reads of the logits) where it
        agreed with torch at start-up and no row asks for top-p, else ``sample_tokens``. A batch of greedy
        rows only (evaluation) takes torch's argmax below 2**22 logits, where it was faster
        (benchmarks/bench_sampling.py)."""
        if not self.fused.get("sample") or flags.any_top_p or (flags.all_greedy and logits.numel() < 2**22):
            return sample_tokens(logits, temps, top_ps, self.generator, flags, uniforms)
        if uniforms is None:  # the draw sample_tokens makes without per-call numbers
            uniforms = torch.rand(logits.shape[0], 1, generator=self.generator, device=self.dev)
        return K.sample.sample(logits, temps, uniforms)

    # -- decode: chunks of steps for every running call -----------------------------------------------------
    def launch(self, seqs: list[Sequence], k: int, uniforms, ahead: int = 0) -> calls.Chunk | None:
        """Queue ``k`` decode steps of ``seqs`` (``uniforms()``: each call's random numbers, ``[B, k]``, drawn only
        for a chunk that is queued): from the host's
        state (``ahead`` 0), or going on from the device's tokens and positions ``ahead`` steps past it (a chunk in
        flight; only the block tables are sent again, from pinned memory, so nothing waits for that chunk). None:
        going on would need larger step buffers (new buffers lose the device's state; the host takes the chunk in
        flight first)."""
        B, bs, dev = len(seqs), self.block_size, self.dev
        Bb = batch_bucket(B)
        kv = np.array([s.kv_len + ahead for s in seqs], dtype=np.int64)
        top = int(kv.max()) + k
        # the fused kernel reads each row's length on the device: one graph per batch bucket and length class
        # (short rows and long ones launch it differently) serves any length
        S = K.paged.paged_length_class(top) if self.fused.get("paged_attention") else slot_bucket(top)
        width = max(max(len(s.table) for s in seqs), -(-top // bs), -(-max(S, 1) // bs)) + 1
        if ahead:
            if Bb > self.rows_cap or width > self.width_cap:
                return None
            self._put_tables(Bb, block_tables(seqs), staged=True)
        else:
            self._ensure(Bb, width)
            self._load(Bb, block_tables(seqs), kv, torch.tensor([s.generated[-1] for s in seqs]), [s.key for s in seqs])
        sp, temps, top_ps, flags = self.sampling(seqs)
        U_dev = self._staged(uniforms()).to(dev, non_blocking=True)
        toks, lps = [], []
        for j in range(k):
            logits = self.decode(Bb, S)
            t, lp = self.draw(logits[:B], temps, top_ps, flags, U_dev[:, j])
            self.tok_buf[:B].copy_(t)
            toks.append(t)
            lps.append(lp)
        return calls.Chunk.launched(seqs, sp, torch.stack(toks), torch.stack(lps))

    def _staged(self, a: np.ndarray) -> torch.Tensor:
        """``a`` as a host tensor a non-blocking copy can read: pinned (a private copy) on a GPU."""
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.pin_memory() if self.dev.type == "cuda" else t

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

    # -- one step ------------------------------------------------------------------------------------------
    def decode(self, B: int, S: int, *, count: bool = True) -> torch.Tensor:
        """One step of rows ``[0, B)`` over keys up to length class ``S``: replayed from its graph where graphs are
        on (captured on first use), else run eagerly. Logits (hidden states for the "rows" variant)."""
        self.stats["decode_steps"] += count
        if not self.use_graphs:
            return self.step(B, S)
        key = (B, S, self.variant)
        if key not in self.graphs:
            with capture_lock(self.dev):  # one capture at a time on the device's shared capture stream
                self.graphs[key] = self._capture(B, S)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits

    def _capture(self, B: int, S: int):
        saved = [(t, t.clone()) for t in self.step_state()]
        side = capture_stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):  # warm-up: kernels pick their algorithms outside the capture
            self.step(B, S)
        torch.cuda.current_stream(self.dev).wait_stream(side)
        for t, old in saved:
            t.copy_(old)
        if self.graph_pool is None:
            self.graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # the capture stream named, on this runner's device: torch.cuda.graph's default is one stream for
        # the whole process, made on whichever device was current at the first capture, so an engine on
        # cuda:0 built after one on cuda:1 captured on a stream of the other device and failed
        with torch.cuda.device(self.dev), torch.cuda.graph(graph, pool=self.graph_pool, stream=side,
                                                           capture_error_mode="thread_local"):
            logits = self.step(B, S)
        self.stats["graphs_captured"] += 1
        return graph, logits

    def step_state(self) -> list[torch.Tensor]:
        """Buffers a step advances, put back after the warm-up run before a capture."""
        return [self.pos_buf]

    def step(self, B: int, S: int) -> torch.Tensor:
        """What a CUDA graph captures: each row's slot (through its block table) and length from its position, then
        the layers; the logits of the next token (the rows' final hidden states for "rows"); advances ``pos_buf``."""
        fwd, dt, bs = self.fwd, self.dtype, self.block_size
        H, Hkv, D = fwd.n_heads, fwd.n_kv, fwd.head_dim
        pos = self.pos_buf[:B]
        self.slot_buf[:B].copy_(self.bt_buf[:B].gather(1, (pos // bs)[:, None]).squeeze(1).long() * bs + pos % bs)
        self.len_buf[:B].copy_(pos + 1)
        rms = K.op(self.fused, "rms_norm")
        silu_mul = K.op(self.fused, "silu_mul")
        freqs = pos[:, None].float() * self.inv_freq[None, :].float()
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * self.rope_scale).to(dt)  # [B, D]
        sin = (emb.sin() * self.rope_scale).to(dt)
        h = F.embedding(self.tok_buf[:B], self.core.model.embed_tokens.weight)
        for li, e in enumerate(self.w.layers):
            x = rms(h, e["ln1"].weight, e["ln1"].variance_epsilon)
            qkv = self._lora(e, "qkv", x, F.linear(x, e["w_qkv"], e["b_qkv"]), B)
            if e["q_norm"] is not None:  # Qwen3: RMSNorm over each query and key head, in place
                for mod, lo, n in ((e["q_norm"], 0, H), (e["k_norm"], H, Hkv)):
                    part = qkv[:, lo * D : (lo + n) * D].view(B, n, D)
                    part.copy_(F.rms_norm(part, (D,), mod.weight, mod.variance_epsilon))
            o = self._attention(li, qkv, cos, sin, B, S)
            h = self._lora(e, "o", o, residual_linear(h, o, base_linear(e["o"])), B)
            x = rms(h, e["ln2"].weight, e["ln2"].variance_epsilon)
            gu = self._lora(e, "gu", x, F.linear(x, e["w_gu"]), B)
            a = silu_mul(gu) if e["silu"] else e["act"](gu[:, : gu.shape[-1] // 2]) * gu[:, gu.shape[-1] // 2 :]
            h = self._lora(e, "down", a, residual_linear(h, a, base_linear(e["down"])), B)
        norm = self.core.model.norm
        h = rms(h, norm.weight, norm.variance_epsilon)
        if self.variant == "rows":
            return h
        logits = self.head(h)
        self.pos_buf[:B].add_(1)
        return logits

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The output head over final hidden states."""
        head = self.core.lm_head
        return F.linear(h, head.weight, getattr(head, "bias", None))

    def _lora(self, e, name: str, x: torch.Tensor, y: torch.Tensor, B: int) -> torch.Tensor:
        return lora_delta(e, name, x, y, self.masks, B)

    def _attention(self, li: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, B: int,
                   S: int) -> torch.Tensor:
        """Layer ``li``: rope q and k, write this step's k, v into each row's slot, attend over the row's blocks;
        ``[B, H*D]``."""
        f, fwd, pk = self.fused, self.fwd, K.paged
        kf, vf = self.kv[li]
        if f.get("paged_rope_attention") and S < pk.PAGED_LONG_KEYS and self.variant != "rows":
            # the engine's fused_rope: the two below as one (slower than the two kernels at long lengths;
            # benchmarks/kernel_sweep.py). Not for a prefill's token rows: a row reads keys that other rows of
            # its call write in the same launch, so every row's keys must be written before any row attends
            return pk.paged_rope_attention(qkv, cos, sin, kf, vf, self.slot_buf[:B], self.bt_buf[:B], self.len_buf[:B],
                                           fwd.n_heads, fwd.n_kv, fwd.head_dim, S, self.block_size, fwd.scale)
        rope = K.op(f, "rope_and_cache_paged")
        q = rope(qkv, cos, sin, kf, vf, self.slot_buf[:B], fwd.n_heads, fwd.n_kv, fwd.head_dim)
        args = (q, kf, vf, self.bt_buf[:B], self.len_buf[:B], S, self.block_size, fwd.scale)
        if f.get("paged_attention"):
            o = pk.paged_attention(*args, splits=pk.paged_splits(B, fwd.n_kv, S) if f.get("paged_attention_split") else 1)
        else:
            o = pk.paged_attention_ref(*args)
        return o.reshape(B, fwd.n_heads * fwd.head_dim)

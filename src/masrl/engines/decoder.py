"""GraphDecoder: what the static and paged engines share, one decode step over device buffers.

Both engines keep a token and a position per row in device buffers, fused weight copies
(``DecodeWeights``) and, on CUDA, replay the step for a (batch, length) bucket as a CUDA graph.
They differ only in where keys and values live: ``_attention`` (each engine's own) writes this
step's k, v into its cache and attends over it. Everything else of the step is here: embedding,
RMSNorm, q/k/v and gate/up as one matmul each with the rows' LoRA columns, Qwen3's q/k norms, the
residual adds inside the matmuls, SiLU-mul, the output head; the fused Triton kernels where they
agreed with torch when the engine started (``kernels.check``), torch elsewhere and on a CPU.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from masrl.engines import kernels, sample_kernel
from masrl.engines.decode_weights import (
    DecodeWeights,
    base_linear,
    capture_lock,
    capture_stream,
    lora_delta,
    residual_linear,
)
from masrl.engines.defaults import EngineDefaults
from masrl.engines.sampling import BatchFlags, sample_tokens
from masrl.modeling.lean import LlamaForward
from masrl.modeling.sizes import tensor_bytes


class GraphDecoder(EngineDefaults):
    def __init__(self, model, tokenizer, stop_ids: list[int], *, device: str, seed: int, cuda_graphs: bool,
                 fused_kernels: bool):
        self.model = model
        self.tok = tokenizer
        self.fwd = LlamaForward(model)
        self.core = self.fwd.core
        self.stop_set = set(int(s) for s in stop_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.stop_set))
        self.dev = torch.device(device)
        self.device = str(self.dev)
        self.dtype = self.core.model.embed_tokens.weight.dtype
        self.is_peft = hasattr(model, "peft_config")
        self._adapters = list(model.peft_config) if self.is_peft else []
        self.slot_of = {name: i for i, name in enumerate(self._adapters)}
        self.w: DecodeWeights | None = DecodeWeights(model, self._adapters)
        self.use_graphs = cuda_graphs and self.dev.type == "cuda"
        self.fused: dict[str, bool] = {}  # kernel name -> use the fused Triton version
        if fused_kernels and kernels.available(self.dev):
            verdict = self._check_kernels()
            self.fused = {name: why is None for name, why in verdict.items()}
            bad = {name: why for name, why in verdict.items() if why is not None}
            if bad:
                import warnings

                warnings.warn(f"masrl {type(self).__name__}: torch ops instead of fused kernels for {bad}",
                              stacklevel=3)
        self.generator = torch.Generator(device=self.dev).manual_seed(seed)
        rot = self.core.model.rotary_emb
        self.inv_freq = rot.inv_freq
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.graphs: dict[tuple, tuple] = {}
        self.graph_pool = None
        # a third part of a graph's key: "rows" is a prefill's token rows (engines/paged.py), a step that writes
        # every row's keys and values before any row attends and returns the final hidden states, not logits
        # (the caller runs the output head on the rows it needs: each call's last)
        self.variant = ""
        self.stats = {"graphs_captured": 0, "decode_steps": 0,
                      "fused_kernels": sorted(n for n, on in self.fused.items() if on)}

    def _check_kernels(self) -> dict:
        """The fused kernels this engine may use, each run against its torch version: ``{name: None or why not}``."""
        cfg = self.core.config
        return {**kernels.check(self.dev, self.dtype, self.fwd.n_heads, self.fwd.n_kv, self.fwd.head_dim,
                                cfg.hidden_size, cfg.intermediate_size),
                **sample_kernel.check(self.dev, self.dtype)}

    def _draw(self, logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, flags: BatchFlags,
              uniforms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's next token and its logprob: the fused sampler (two reads of the logits) where it
        agreed with torch at start-up and no row asks for top-p, else ``sample_tokens``. A batch of greedy
        rows only (evaluation) takes torch's argmax below 2**22 logits, where it was faster
        (benchmarks/bench_sampling.py)."""
        if not self.fused.get("sample") or flags.any_top_p or (flags.all_greedy and logits.numel() < 2**22):
            return sample_tokens(logits, temps, top_ps, self.generator, flags, uniforms)
        if uniforms is None:  # the draw sample_tokens makes without per-call numbers
            uniforms = torch.rand(logits.shape[0], 1, generator=self.generator, device=self.dev)
        return sample_kernel.sample(logits, temps, uniforms)

    # -- shared parts of the Engine interface -------------------------------------------------------
    def adapters(self) -> list[str]:
        return list(self._adapters)

    def weights_updated(self, policies: list[str] | None = None) -> None:
        if self.w is not None:  # None: released, rebuilt from the live weights on the next generate
            self.w.refresh(base=not self.is_peft, adapters=self.is_peft)

    def _weight_bytes(self) -> int:
        """Bytes of the engine's own weight copies (fused q/k/v and gate/up, LoRA columns)."""
        if self.w is None:
            return 0
        own = [t for e in self.w.layers for t in (e["w_qkv"], e["w_gu"], e["b_qkv"])]
        own += [t for e in self.w.layers for g in e["lora"].values() for t in (g.a, g.b)]
        return tensor_bytes(own)

    def _release(self, buffers: tuple[str, ...]) -> None:
        """Drop the graphs (their private memory now, not when collected), the weight copies and ``buffers``."""
        for graph, _ in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.graph_pool = None
        self.w = None
        for name in buffers:
            self.__dict__.pop(name, None)
        self.stats["releases"] = self.stats.get("releases", 0) + 1

    @contextlib.contextmanager
    def _kernels(self):
        """This engine's device, and attention kernels with fixed costs (cuDNN's attention plans
        anew for every new key length, ~45 ms each time on an H200 with torch 2.11)."""
        if self.dev.type != "cuda":
            yield
            return
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with torch.cuda.device(self.dev), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                       SDPBackend.MATH]):
            yield

    # -- the step ------------------------------------------------------------------------------------
    def _lora(self, e, name: str, x: torch.Tensor, y: torch.Tensor, B: int) -> torch.Tensor:
        return lora_delta(e, name, x, y, self.masks, B)

    def _attention(self, li: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, B: int,
                   S: int) -> torch.Tensor:
        """Layer ``li``: write this step's k, v into the cache, return the attention output ``[B, H*D]``."""
        raise NotImplementedError

    def _layers(self, B: int, S: int) -> torch.Tensor:
        """Logits of the next token for rows ``[0, B)`` from ``tok_buf`` at ``pos_buf``; advances ``pos_buf``."""
        fwd, dt = self.fwd, self.dtype
        H, Hkv, D = fwd.n_heads, fwd.n_kv, fwd.head_dim
        f = self.fused
        rms = kernels.rms_norm if f.get("rms_norm") else kernels.rms_norm_ref
        silu_mul = kernels.silu_mul if f.get("silu_mul") else kernels.silu_mul_ref
        freqs = self.pos_buf[:B, None].float() * self.inv_freq[None, :].float()
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
        logits = self._head(h)
        self.pos_buf[:B].add_(1)
        return logits

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        """The output head over final hidden states (as ``_layers`` runs it)."""
        head = self.core.lm_head
        return F.linear(h, head.weight, getattr(head, "bias", None))

    def _decode_body(self, B: int, S: int) -> torch.Tensor:
        """One step (what a CUDA graph captures): the engine's own bookkeeping around ``_layers``."""
        return self._layers(B, S)

    def _step_state(self, B: int) -> list[torch.Tensor]:
        """Buffers a step advances, put back after the warm-up run before a capture."""
        return [self.pos_buf]

    def _decode(self, B: int, S: int, *, count: bool = True) -> torch.Tensor:
        self.stats["decode_steps"] += count
        if not self.use_graphs:
            return self._decode_body(B, S)
        key = (B, S, self.variant)
        if key not in self.graphs:
            self.graphs[key] = self._capture(B, S)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits

    def _capture(self, B: int, S: int):
        with capture_lock(self.dev):  # one capture at a time on the device's shared capture stream
            return self._capture_locked(B, S)

    def _capture_locked(self, B: int, S: int):
        saved = [(t, t.clone()) for t in self._step_state(B)]
        side = capture_stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):  # warm-up: kernels pick their algorithms outside the capture
            self._decode_body(B, S)
        torch.cuda.current_stream(self.dev).wait_stream(side)
        for t, old in saved:
            t.copy_(old)
        if self.graph_pool is None:
            self.graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # the capture stream named, on this engine's device: torch.cuda.graph's default is one stream for
        # the whole process, made on whichever device was current at the first capture, so an engine on
        # cuda:0 built after one on cuda:1 captured on a stream of the other device and failed
        with torch.cuda.device(self.dev), torch.cuda.graph(graph, pool=self.graph_pool, stream=side,
                                                           capture_error_mode="thread_local"):
            logits = self._decode_body(B, S)
        self.stats["graphs_captured"] += 1
        return graph, logits

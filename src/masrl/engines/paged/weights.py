"""What the paged engine decodes with: fused weight copies, every LoRA adapter's
matrices concatenated by rank, the batch and length buckets graphs are captured at, and the one
capture stream per device.

``DecodeWeights`` holds, per layer, q/k/v and gate/up fused into one matrix each (refreshed in
place after an update, so captured graphs stay valid) and each projection group's LoRA A and
scaled B over all adapters. Under LoRA the base is frozen, so the fused matrix is not a copy: the
base layers' weights become views of its rows (``fuse_rows``), and the 7B shape keeps 8.5 GB less.
A row picks its adapter's columns with a 0/1 mask (``lora_delta``),
so a batch that mixes adapters runs two small matmuls per group and no per-adapter indexing
(which a graph cannot replay).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from masrl.modeling.lean import core_model
from masrl.modeling.sizes import tensor_bytes

_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}
_CAPTURE_LOCKS: dict[torch.device, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


STALE_ROW_STRIDE = 61  # rows of each weight copy compared after a publish (a prime: no alignment with head sizes)


def capture_stream(dev: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every engine's warm-up and capture: cuBLAS keeps a workspace
    (tens of MB) for each stream it has run on, for the life of the process, so a fresh stream per
    capture would leave one behind every time graphs are captured again (after ``release``)."""
    if dev not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[dev] = torch.cuda.Stream(dev)
    return _CAPTURE_STREAMS[dev]


def capture_lock(dev: torch.device) -> threading.Lock:
    """Held for a warm-up and capture on the device's capture stream: engines of several policies in one process
    sample in threads of their own, and two captures (or a warm-up and a capture) on the one shared stream at once
    invalidate the capture (cudaErrorStreamCaptureInvalidated)."""
    with _LOCKS_GUARD:
        return _CAPTURE_LOCKS.setdefault(dev, threading.Lock())


def batch_bucket(n: int) -> int:
    if n <= 8:
        return 1 << (n - 1).bit_length()
    if n <= 64:
        return -(-n // 16) * 16
    return -(-n // 32) * 32


def slot_bucket(n: int, step: int = 64) -> int:
    return max(step, -(-n // step) * step)


def residual_linear(h: torch.Tensor, x: torch.Tensor, lin) -> torch.Tensor:
    """``h + lin(x)``, in place in ``h`` (a step's own intermediate), as one matmul with ``h`` as its addend."""
    if lin.bias is not None:
        return h.add_(F.linear(x, lin.weight, lin.bias))
    return h.addmm_(x, lin.weight.t())


def _adjacent(ts: list[torch.Tensor]) -> bool:
    """Whether ``ts`` are consecutive contiguous pieces of one storage (views ``fuse_rows`` made)."""
    first = ts[0]
    off = first.storage_offset()
    for t in ts:
        if (not t.is_contiguous() or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or t.storage_offset() != off or t.dtype != first.dtype or t.shape[1:] != first.shape[1:]):
            return False
        off += t.numel()
    return True


@torch.no_grad()
def fuse_rows(params: list[torch.Tensor], share: bool) -> torch.Tensor:
    """The rows of ``params`` as one matrix. ``share``: the parameters become views of that matrix's rows
    (their ``.data`` is swapped, so modules, hooks and an offload stash keep them), so a frozen weight is held
    once, not once by the model and once fused; where they already are such views, no copy is made."""
    ts = [p.detach() for p in params]
    if share and _adjacent(ts):
        first = ts[0]
        rows = sum(t.shape[0] for t in ts)
        return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())
    out = torch.cat(ts)
    if share:
        off = 0
        for p in params:
            p.data = out[off : off + p.shape[0]]
            off += p.shape[0]
    return out


def base_linear(mod):
    """The plain Linear under a PEFT LoRA layer (or the module itself)."""
    return getattr(mod, "base_layer", mod)


@dataclass
class LoraGroup:
    """LoRA deltas of one projection group (e.g. q,k,v), all adapters concatenated by rank."""

    a: torch.Tensor  # [C, in]
    b: torch.Tensor  # [out, C] (scaling folded in)
    cols: tuple[int, ...]  # adapter slot of each of the C columns
    sources: list  # (adapter, module, out_offset, col_offset, r)


class DecodeWeights:
    """The tensors one decode step reads, per layer; fused copies refreshed in place."""

    def __init__(self, model, adapters: list[str]):
        self.core = core_model(model)
        self.adapters = adapters
        # a LoRA model's base is frozen (the runner refreshes only its adapters): its q/k/v and gate/up are the fused rows
        self.shared = bool(adapters)
        self.layers = []
        for layer in self.core.model.layers:
            at, mlp = layer.self_attn, layer.mlp
            qkv_mods = [at.q_proj, at.k_proj, at.v_proj]
            gu_mods = [mlp.gate_proj, mlp.up_proj]
            entry = {
                "ln1": layer.input_layernorm, "ln2": layer.post_attention_layernorm,
                "qkv_mods": qkv_mods, "gu_mods": gu_mods,
                "w_qkv": fuse_rows([base_linear(m).weight for m in qkv_mods], self.shared),
                "b_qkv": (fuse_rows([base_linear(m).bias for m in qkv_mods], self.shared)
                          if base_linear(at.q_proj).bias is not None else None),
                "w_gu": fuse_rows([base_linear(m).weight for m in gu_mods], self.shared),
                "o": at.o_proj, "down": mlp.down_proj, "act": mlp.act_fn,
                "silu": getattr(self.core.config, "hidden_act", "silu") in ("silu", "swish"),
                "q_norm": getattr(at, "q_norm", None), "k_norm": getattr(at, "k_norm", None),
                "lora": {},
            }
            for name, mods in (("qkv", qkv_mods), ("o", [at.o_proj]), ("gu", gu_mods), ("down", [mlp.down_proj])):
                grp = self._lora_group(mods)
                if grp is not None:
                    entry["lora"][name] = grp
            self.layers.append(entry)
        self.layouts = sorted({g.cols for e in self.layers for g in e["lora"].values()})

    def _lora_group(self, mods) -> LoraGroup | None:
        sources, col, out = [], 0, 0
        cols: list[int] = []
        for mod in mods:
            w = base_linear(mod).weight
            for slot, name in enumerate(self.adapters):
                if name in getattr(mod, "lora_A", {}):
                    r = mod.lora_A[name].weight.shape[0]
                    sources.append((name, mod, out, col, r))
                    cols += [slot] * r
                    col += r
            out += w.shape[0]
        if not sources:
            return None
        w0 = base_linear(mods[0]).weight
        a = torch.zeros((col, w0.shape[1]), dtype=w0.dtype, device=w0.device)
        b = torch.zeros((out, col), dtype=w0.dtype, device=w0.device)
        grp = LoraGroup(a, b, tuple(cols), sources)
        self._fill_lora(grp)
        return grp

    @staticmethod
    def _lora_pieces(grp: LoraGroup):
        """``(adapter, column block, what it holds)`` of ``grp``'s columns: each adapter's A, and its B times its
        scaling (computed in the adapter's dtype; the block casts it to its own)."""
        for name, mod, out_off, col_off, r in grp.sources:
            bw = mod.lora_B[name].weight
            yield name, grp.a[col_off : col_off + r], mod.lora_A[name].weight
            yield name, grp.b[out_off : out_off + bw.shape[0], col_off : col_off + r], bw * mod.scaling[name]

    @staticmethod
    def _fused_pieces(e: dict):
        """``(label, rows of a fused copy, the weight they copy)`` of layer entry ``e``: q/k/v (and their biases) and
        gate/up."""
        for label, mods, fused, attr in (("q/k/v", e["qkv_mods"], e["w_qkv"], "weight"),
                                         ("q/k/v bias", e["qkv_mods"], e["b_qkv"], "bias"),
                                         ("gate/up", e["gu_mods"], e["w_gu"], "weight")):
            if fused is None:
                continue
            off = 0
            for m in mods:
                w = getattr(base_linear(m), attr)
                yield label, fused[off : off + w.shape[0]], w
                off += w.shape[0]

    @classmethod
    def _fill_lora(cls, grp: LoraGroup) -> None:
        for _, dst, src in cls._lora_pieces(grp):
            dst.copy_(src)

    @torch.no_grad()
    def refresh(self, base: bool, adapters: bool) -> None:
        for e in self.layers:
            if base and not self.shared:  # shared: the fused rows are the weights
                for _, dst, src in self._fused_pieces(e):
                    dst.copy_(src)
            if adapters:
                for grp in e["lora"].values():
                    self._fill_lora(grp)

    @torch.no_grad()
    def stale(self, every: int = STALE_ROW_STRIDE) -> list[str]:
        """The copies that no longer hold what the model's weights hold (each ``every``-th row compared exactly, in
        the copy's dtype, as ``refresh`` writes it): a weight change the engine was not told of, so it would sample
        the old policy."""
        out: list[str] = []

        def differs(dst, src) -> bool:
            return not torch.equal(dst[::every], src[::every].to(dst.dtype))
        for i, e in enumerate(self.layers):
            pieces = [] if self.shared else [(f"layer {i} {label}", d, w) for label, d, w in self._fused_pieces(e)]
            pieces += [(f"layer {i} {group} LoRA '{name}'", d, w)
                       for group, grp in e["lora"].items() for name, d, w in self._lora_pieces(grp)]
            for label, dst, src in pieces:
                if label not in out and differs(dst, src):
                    out.append(label)
        return out

    def nbytes(self) -> int:
        """Bytes of the copies this holds beside the model's own weights: fused q/k/v and gate/up (unless shared
        with the model), LoRA columns."""
        own = [] if self.shared else [t for e in self.layers for t in (e["w_qkv"], e["w_gu"], e["b_qkv"])]
        return tensor_bytes(own + [t for e in self.layers for g in e["lora"].values() for t in (g.a, g.b)])


def lora_delta(e: dict, name: str, x: torch.Tensor, y: torch.Tensor, masks: dict, B: int) -> torch.Tensor:
    """``y`` plus projection group ``name``'s LoRA delta for each of the ``B`` rows of ``x``, every row
    through its own adapter's columns (``masks[cols]``: 0/1 per row and column)."""
    grp = e["lora"].get(name)
    if grp is None:
        return y
    t = (x @ grp.a.t()) * masks[grp.cols][:B]
    return torch.addmm(y, t, grp.b.t())

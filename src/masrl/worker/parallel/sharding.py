"""FSDP2 for one full-weight policy: its weights, gradients and optimizer state sharded over its
data-parallel ranks (``policies.X.fsdp``), with torch's own ``fully_shard``.

Each rank holds 1/N of the fp32 parameters (the masters), their gradients and AdamW moments.
Forward and backward gather one decoder layer at a time in the compute dtype (bf16 on CUDA,
``MixedPrecisionPolicy``) and reduce-scatter its gradient in fp32, summed over the ranks (the
ranks' losses are already normalised by the whole mini-batch, as in ``data_parallel``).

The trainer's forward is masrl's lean one (``modeling.lean``), which calls a layer's submodules,
not the layer itself; FSDP's hooks fire on a module's call. So each decoder layer is wrapped in a
``LeanBlock`` module whose forward is the lean layer step, and the embedding, final norm and head
are gathered by a ``ShardRoot`` module whose forward runs the whole completion pass. Neither
wrapper renames or copies a parameter: the HF model's modules hold the sharded parameters, and
``state_dict`` keeps the HF names.

Every rank takes part in every gather, so every rank must run the same number of forwards: the
trainer pads a rank's micro-batches with zero-weight ones up to the most any rank has
(``steps_in_step``).

Rollouts: each rank's engine samples from a full copy of the weights in the compute dtype
(``EngineWeights``), refreshed after every update by gathering one layer at a time into it
(``publish``). The engine's copy costs one bf16 model per rank (what the unsharded engine reads
anyway); the gather moves (N-1)/N of the bf16 weights into each rank.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
from pathlib import Path

import torch
from torch import nn

from masrl.errors import ConfigError


class LeanBlock(nn.Module):
    """One decoder layer, called as a module so that FSDP gathers it: ``forward`` is the lean layer step."""

    def __init__(self, fwd, layer: nn.Module):
        super().__init__()
        self.layer = layer
        self._fwd = fwd  # the LlamaForward that owns the step (not a module: not part of the tree)

    def forward(self, *args):
        h, _ = self._fwd._layer(self.layer, *args)
        return h, None  # a sharded pass never keeps the layer's keys and values (no shared-prefix layout)


class ShardRoot(nn.Module):
    """The parameters outside the layers (embedding, final norm, head) and the layers' blocks: its
    forward runs ``fn`` (a whole completion pass) with those parameters gathered."""

    def __init__(self, core: nn.Module, blocks: list[LeanBlock]):
        super().__init__()
        self.embed = core.model.embed_tokens
        self.norm = core.model.norm
        self.head = core.lm_head
        self.blocks = nn.ModuleList(blocks)

    def forward(self, fn, *args, **kwargs):
        out = fn(*args, **kwargs)  # views out of an FSDP module draw a warning: hand back tensors of their own
        return tuple(x.clone() if isinstance(x, torch.Tensor) and x._is_view() else x for x in out)


class ShardedPolicy:
    """The host's full model (or ``module``: its frozen reference model) sharded over the ``world``
    ranks of the default process group."""

    def __init__(self, host, world: int, compute_dtype: torch.dtype, module: nn.Module | None = None):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if host.is_lora:
            raise ConfigError("policies.X.fsdp shards a full-weight policy; a LoRA team's base is frozen and its "
                              "adapters are small: train it without fsdp")
        core = host.core if module is None else module
        fwd = host.fast_forward(core)
        if fwd is None:
            from masrl.modeling.lean import unsupported

            raise ConfigError(f"policies.X.fsdp needs masrl's lean forward, which cannot run this model: "
                              f"{unsupported(host.model)}")
        mesh = init_device_mesh(host.device.type, (world,))
        mp = (MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
              if compute_dtype != torch.float32 else MixedPrecisionPolicy())
        self.compute_dtype = compute_dtype
        # where each engine parameter is read from once its group is gathered: (group, [(module, attr, name)])
        self.blocks = [LeanBlock(fwd, layer) for layer in fwd.layers]
        self._reads = [(b, [(m, a, f"model.layers.{i}.{n}") for n, m, a in _leaves(b.layer)])
                       for i, b in enumerate(self.blocks)]
        root_reads = [(m, a, n) for n, m, a in _leaves(core) if not n.startswith("model.layers.")]
        for b in self.blocks:
            fully_shard(b, mesh=mesh, mp_policy=mp)
        self.root = ShardRoot(core, self.blocks)
        fully_shard(self.root, mesh=mesh, mp_policy=mp)
        self._reads.append((self.root, root_reads))
        for m in [*self.blocks, self.root]:
            m.set_gradient_divide_factor(1.0)  # summed over the ranks, as data_parallel sums
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)
        fwd.blocks = self.blocks
        self.core = core

    @staticmethod
    def over(held, copy: EngineWeights, world: int, name: str) -> None:
        """``policies.X.fsdp``: shard ``held``'s model over ``world`` ranks (and its frozen reference alike);
        the engine's copy gathers from the shards. The optimizers are then built again over the fp32 shards,
        which are their own masters (``Updater.join``)."""
        held.sharded = ShardedPolicy(held, world, copy.dtype)
        copy.sharded = held.sharded
        if held.reference is not None:  # algorithm.kl_coef > 0
            held.sharded_reference = ShardedPolicy(held, world, copy.dtype, module=held.reference)
        params = list(held.model.parameters())
        mine = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
        print(f"[masrl] {name}: FSDP2 over {world} ranks, this rank holds {mine / 1e6:,.1f}M of "
              f"{sum(p.numel() for p in params) / 1e6:,.1f}M parameters (fp32), computes in {copy.dtype}",
              file=sys.stderr, flush=True)

    def run(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` with the root's parameters gathered (a forward of the sharded model)."""
        return self.root(fn, *args, **kwargs)

    @torch.no_grad()
    def gather_into(self, target: nn.Module) -> int:
        """Copy the full weights into ``target`` (an unsharded model of the same shape), one group
        at a time; every rank calls it together. Returns the bytes written."""
        dst = dict(target.named_parameters())
        moved = 0
        for group, reads in self._reads:
            group.unshard()
            for module, attr, name in reads:
                d = dst[name]
                d.copy_(getattr(module, attr))
                moved += d.numel() * d.element_size()
            group.reshard()
        return moved

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, optimizer, directory: Path) -> None:
        """Every rank's shard of the fp32 weights and AdamW moments, with torch.distributed.checkpoint
        (every rank calls it; rank 0 also writes the metadata)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.core, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))

    def load(self, optimizer, directory: Path, with_optimizer: bool) -> None:
        """The shards ``save`` wrote (``with_optimizer``: the AdamW moments too); every rank calls it."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_state_dict,
            set_model_state_dict,
            set_state_dict,
        )

        if not with_optimizer:  # the weights alone (eval, serve): what else the checkpoint holds stays unread
            state = {"model": get_model_state_dict(self.core)}
            dcp.load(state, checkpoint_id=str(directory))
            set_model_state_dict(self.core, state["model"])
            return
        model_sd, optim_sd = get_state_dict(self.core, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(self.core, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        """Full weights (an exported ``model.safetensors``, read by every rank) into the shards."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        tied = getattr(self.core.config, "tie_word_embeddings", False)
        if tied:
            full = {k: v for k, v in full.items() if k != "lm_head.weight"}
        set_model_state_dict(self.core, full, options=StateDictOptions(full_state_dict=True, strict=not tied))


def _leaves(module: nn.Module):
    """``(name, owning module, attribute)`` for each parameter of ``module``, once each."""
    seen: set[int] = set()
    for mname, m in module.named_modules():
        for attr, p in m.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            yield (f"{mname}.{attr}" if mname else attr), m, attr


class EngineWeights:
    """The engine's full copy of a sharded policy's weights, in the compute dtype; the same
    interface as ``WeightCopy`` (``model``, ``lock``, ``updating``, ``publish``)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        self.model = copy.deepcopy(model).to(dtype).requires_grad_(False).eval()
        self.dtype = dtype
        self.lock = threading.Lock()
        self.sharded: ShardedPolicy | None = None  # attached once the ranks have joined
        self.gathered = (0.0, 0)  # (seconds, bytes) of the last publish

    def copied_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def updating(self):
        return contextlib.nullcontext()

    def publish(self, policies: list[str] | None = None) -> None:
        """Gather the live weights into this copy (a collective: every rank publishes together)."""
        import time

        if self.sharded is None:
            return
        t0 = time.perf_counter()
        moved = self.sharded.gather_into(self.model)
        if next(self.model.parameters()).is_cuda:
            torch.cuda.synchronize()
        self.gathered = (time.perf_counter() - t0, moved)

"""Device and precision: resolve the config's words into torch objects, and the optimizer that
keeps fp32 master weights for bf16 parameters.

The scheme (``precision: bf16``, the default on CUDA): **bf16 parameters with an fp32 master
copy**, not autocast over fp32 parameters. The same weights serve the rollout engine and the
trainer; the engine must read bf16 weights at every decode step (casting fp32 weights per step
would cost more than the step), and the trainer's forward then needs no casts either. The
optimizer holds an fp32 copy of every bf16 trainable parameter; each micro-batch's bf16 gradient
is added into an fp32 buffer as soon as autograd produces it (so accumulation is in fp32), AdamW
(fused on CUDA) updates the fp32 copy with fp32 state, and the result is written back to the bf16
parameter in place. Updates smaller than bf16's resolution accumulate in the master copy instead
of rounding away. Trainable parameters that are already fp32 (LoRA adapters, which PEFT keeps in
fp32 on a bf16 base; value heads) are their own masters.
"""

from __future__ import annotations

import torch

from masrl.errors import ConfigError
from masrl.worker.model.offload import PinnedStash


def resolve_device(name: str) -> str:
    """``auto`` -> ``cuda:0`` when a GPU is visible, else ``cpu``; ``cuda`` -> ``cuda:0``."""
    if name == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device '{name}': this machine has no CUDA GPU that torch {torch.__version__} can use; "
                              f"use device=cpu (or device=auto)")
        index = int(name.split(":", 1)[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device '{name}': only {torch.cuda.device_count()} GPU(s) visible (cuda:0 .. "
                              f"cuda:{torch.cuda.device_count() - 1})")
        return f"cuda:{index}"
    return "cpu"


def cpu_bf16_units(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16 in its flags), where
    ``precision=bf16`` runs a GRPO step ~1.6x faster than fp32 (docs/benchmarks.md); elsewhere bf16 is
    emulated and slower. False when the flags cannot be read (not Linux)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def param_dtype(precision: str, device: str) -> torch.dtype:
    if precision == "auto":
        precision = "bf16" if device.startswith("cuda") else "fp32"
    return torch.bfloat16 if precision == "bf16" else torch.float32


class MasterWeightsAdamW:
    """AdamW over fp32 masters of the given parameters; see the module docstring."""

    def __init__(self, params: list[torch.nn.Parameter], *, lr: float, betas, eps: float, weight_decay: float):
        self.params = list(params)
        self.masters: list[torch.Tensor] = []
        for p in self.params:
            if p.dtype == torch.float32:
                self.masters.append(p)
                continue
            m = p.detach().float().clone().requires_grad_(True)
            self.masters.append(m)
            # the newest optimizer over a parameter owns its gradient: an earlier one's hook would take
            # the gradient first and leave this one None (a benchmark's second optimizer, a rebuilt one)
            earlier = getattr(p, "_masrl_master_hook", None)
            if earlier is not None:
                earlier.remove()
            p._masrl_master_hook = p.register_post_accumulate_grad_hook(self._accumulate_into(m))
        fused = bool(self.params) and all(m.is_cuda for m in self.masters)
        self._stash = PinnedStash()
        self._defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                          "fused": fused or None}
        self.opt = torch.optim.AdamW(self.masters, **self._defaults)
        self.shard_of: tuple[int, int] | None = None  # (rank, ranks) once sharded

    def shard(self, rank: int, world: int) -> None:
        """ZeRO stage 1 over the data-parallel process group (already joined): from here on this
        rank keeps the AdamW moments of its share of the masters only, steps that share, and
        receives the rest from their owners after each step (torch.distributed's
        ``ZeroRedundancyOptimizer``). Call before the first step: state so far is dropped."""
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.opt = ZeroRedundancyOptimizer(self.masters, optimizer_class=torch.optim.AdamW, **self._defaults)
        self.shard_of = (rank, world)

    @property
    def file_name(self) -> str:
        """This optimizer's checkpoint file: a sharded rank writes and reads its own share."""
        return "optimizer.pt" if self.shard_of is None or self.shard_of[0] == 0 else f"optimizer.rank{self.shard_of[0]}.pt"

    @property
    def _local(self) -> torch.optim.Optimizer:
        """The AdamW that holds this process's moments (the shard's own when sharded)."""
        return self.opt.optim if self.shard_of is not None else self.opt

    def state_bytes(self, device: str, seen: set[int] | None = None) -> int:
        """Bytes of the fp32 masters and AdamW moments this process holds on ``device`` (``seen``:
        storages counted already, such as fp32 parameters that are their own masters)."""
        from masrl.modeling.sizes import tensor_bytes

        moments = [v for st in self._local.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        return tensor_bytes(list(self.masters) + moments, device, seen)

    def moment_bytes(self) -> int:
        """Bytes of AdamW state this process holds (its share, when sharded; a DTensor's local shard)."""
        held = [getattr(v, "_local_tensor", v) for st in self._local.state.values() for v in st.values()
                if isinstance(v, torch.Tensor)]
        return sum(v.numel() * v.element_size() for v in held)

    @staticmethod
    def _accumulate_into(master: torch.Tensor):
        def hook(p: torch.Tensor) -> None:
            g = p.grad.float()
            if master.grad is None:
                master.grad = g
            else:
                master.grad.add_(g)
            p.grad = None

        return hook

    @property
    def param_groups(self):
        return self.opt.param_groups

    def grads(self) -> list[torch.Tensor]:
        """The fp32 tensors whose ``.grad`` the update uses (for clipping and norms)."""
        return self.masters

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        self.opt.zero_grad(set_to_none=True)

    @torch.no_grad()
    def step(self) -> None:
        self.opt.step()
        low = [(p, m) for p, m in zip(self.params, self.masters) if p is not m]
        if low:
            torch._foreach_copy_([p for p, _ in low], [m for _, m in low])

    def state_dict(self) -> dict:
        if self.shard_of is not None:  # this rank's share of the moments, without a collective
            out = {"adamw_shard": self._local.state_dict(), "shard_of": list(self.shard_of)}
            if self.shard_of[0] > 0:
                return out  # the masters are the same on every rank: rank 0 writes them
        else:
            out = {"adamw": self.opt.state_dict()}
        out["masters"] = [m.detach().cpu() for p, m in zip(self.params, self.masters) if p is not m]
        return out

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        saved_shard = tuple(state["shard_of"]) if "shard_of" in state else None
        if saved_shard != self.shard_of:
            from masrl.errors import MasrlError

            raise MasrlError(f"optimizer state saved {'as share %d of %d' % saved_shard if saved_shard else 'whole'}"
                             f" cannot load {'as share %d of %d' % self.shard_of if self.shard_of else 'whole'}: "
                             f"resume with the same data_parallel and shard_optimizer, or load the weights "
                             f"without the optimizer state")
        if saved_shard is not None:  # the masters come with it (rank 0's, read by checkpoint.load_policy)
            self._local.load_state_dict(state["adamw_shard"])
        elif "adamw" not in state:  # an optimizer state saved before master weights existed
            self.opt.load_state_dict(state)
            return
        else:
            self.opt.load_state_dict(state["adamw"])
        low = [(p, m) for p, m in zip(self.params, self.masters) if p is not m]
        saved = state.get("masters", [])
        if len(saved) != len(low):
            # saved under another precision: the parameters themselves are the masters
            for p, m in low:
                m.copy_(p.float())
            return
        for (p, m), s in zip(low, saved):
            m.copy_(s.to(m.device))
            p.copy_(m)

    def _tensors(self) -> list[torch.Tensor]:
        """What offloading moves: fp32 masters of low-precision parameters and the AdamW state."""
        out = [m for p, m in zip(self.params, self.masters) if p is not m]
        for st in self._local.state.values():
            out += [v for v in st.values() if isinstance(v, torch.Tensor)]
        return out

    def offload(self) -> int:
        """Move the masters and optimizer state into pinned CPU memory (the same tensor objects, so
        the optimizer and the gradient hooks keep working after ``reload``); returns bytes moved."""
        return self._stash.out(self._tensors())

    def reload(self) -> int:
        """Bring the offloaded tensors back to the device they came from; returns bytes moved."""
        return self._stash.back(self._tensors())

    def sync_from_params(self) -> None:
        """After loading weights into the parameters, refresh the masters from them."""
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if p is not m:
                    m.copy_(p.float())

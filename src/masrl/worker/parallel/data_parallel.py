"""Data-parallel ranks of one policy (torch.distributed: gloo on CPU, NCCL on GPUs).

Each rank holds a full copy of the policy and samples its share of the calls. At an update the
ranks exchange their calls' rewards and keys (``all_gather_object``), so every rank computes the
advantages, reward statistics and mini-batch order of the whole batch exactly as one process
would; each then runs forward and backward on its own calls only, with losses normalised by the
whole mini-batch's token and sequence counts, and the gradients are summed across ranks
(``all_reduce``) before clipping and the optimizer step. Every rank thus takes the step one
process would take on the union of the calls, and the weights stay identical across ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class DataParallel:
    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def gather(self, samples: list) -> list:
        """Every rank's samples, in rank order (copies; token ids travel with them)."""
        out: list = [None] * self.world
        dist.all_gather_object(out, list(samples))
        return [s for part in out for s in part]

    @torch.no_grad()
    def sum_grads(self, tensors: list[torch.Tensor]) -> None:
        """Sum the ``.grad`` of ``tensors`` over the ranks, in one flat buffer per dtype."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            if t.grad is None:
                t.grad = torch.zeros_like(t)
            by_dtype.setdefault(t.grad.dtype, []).append(t)
        for group in by_dtype.values():
            flat = torch.cat([t.grad.reshape(-1) for t in group])
            dist.all_reduce(flat)
            off = 0
            for t in group:
                n = t.grad.numel()
                t.grad.copy_(flat[off : off + n].view_as(t.grad))
                off += n

    def max(self, x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def sum(self, x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())


def init_ranks(init_method: str, rank: int, world: int, backend: str = "gloo") -> DataParallel:
    """Join the process group of one data-parallel policy (``tcp://HOST:PORT`` of rank 0).
    ``backend``: ``gloo`` on CPUs; ``cpu:gloo,cuda:nccl`` on GPUs (NCCL sums the gradients, gloo
    carries the pickled samples and the CPU scalars)."""
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    return DataParallel(rank, world)


def free_port() -> int:
    """A TCP port free on this host (rank 0's rendezvous)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]

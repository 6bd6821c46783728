"""Host <-> device copies that do not wait for the device.

A plain ``tensor.to("cuda")`` from pageable memory, or ``.tolist()`` of a CUDA tensor, synchronises
the stream: the host waits for every kernel queued before it. The paged engine queues its next
decode chunk before it reads the last one, so its uploads go through pinned memory without
blocking (``upload``), and its sampled tokens come back into pinned memory behind an event that
marks the end of that chunk only (``Readback``): the host reads them while the device runs the
next chunk. On a CPU both are plain copies.
"""

from __future__ import annotations

import torch


def upload(x, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x`` (a list or array) on ``device``, copied from pinned memory without waiting on a GPU."""
    t = torch.as_tensor(x, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class Readback:
    """Device tensors copied to the host as soon as the kernels queued so far are done; ``get``
    waits for that point of the stream only, not for work queued after it."""

    def __init__(self, *tensors: torch.Tensor):
        self.event = None
        if tensors and tensors[0].is_cuda:
            self.host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            for h, t in zip(self.host, tensors):
                h.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = list(tensors)

    def get(self) -> list[list]:
        if self.event is not None:
            self.event.synchronize()
        return [h.tolist() for h in self.host]

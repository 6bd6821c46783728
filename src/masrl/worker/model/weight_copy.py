"""The engine's own copy of the trainable weights, so that an update can run while the engine samples.

With ``rollout.overlap_update`` (asynchronous rollouts), a policy's optimizer writes the live
parameters while the engine keeps sampling from this copy; when the update ends, ``publish`` copies
the new values in (one device-to-device copy per tensor, between two engine batches) and the calls
sampled from then on carry the new version. Every tensor that no optimizer writes (a LoRA base, a
frozen policy, buffers) is shared with the live model, not copied: for LoRA per agent the copy costs
the adapters' size only; for a full-parameter policy, one more copy of its weights.

With ``device`` (``policies.X.rollout_device``) the copy lives on another device, whole (a frozen base
too), and the engine samples there: generation and training then run on two devices at once.

On CUDA the update runs on a stream of its own, so its kernels and the engine's can run at the same
time; ``publish`` waits for that stream before copying.
"""

from __future__ import annotations

import contextlib
import copy
import threading

import torch
from torch import nn


class WeightCopy:
    def __init__(self, model: nn.Module, trainable: dict[str, list[nn.Parameter]], device: str | None = None):
        """``trainable``: policy name -> the live parameters its optimizer writes; ``device``: where the
        copy lives (default: the model's own device)."""
        dev = next(model.parameters()).device
        if device is not None and torch.device(device) != dev:  # all of it there (moving a shared tensor
            self.model = copy.deepcopy(model).to(device)  # would move the live model's own)
        else:
            written = {id(p) for ps in trainable.values() for p in ps}
            memo: dict[int, object] = {id(t): t for t in list(model.parameters()) + list(model.buffers())
                                       if id(t) not in written}
            self.model = copy.deepcopy(model, memo)  # shares every tensor in memo, copies the rest
        self.model.requires_grad_(False).eval()
        mine = dict(self.model.named_parameters(remove_duplicate=False))
        name_of = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
        self.pairs = {pol: ([mine[name_of[id(p)]] for p in ps], list(ps)) for pol, ps in trainable.items()}
        self.lock = threading.Lock()  # held by an engine batch, and by a publish
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def copied_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for dst, _ in self.pairs.values() for t in dst)

    def updating(self):
        """Where an update runs: on CUDA, a stream of its own; elsewhere, as it is."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    @torch.no_grad()
    def publish(self, policies: list[str] | None = None) -> None:
        """Copy the live values of ``policies`` (default: all) into the engine's copy. The caller holds ``lock``."""
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
        for pol in policies if policies is not None else list(self.pairs):
            if pol in self.pairs:
                dst, src = self.pairs[pol]
                torch._foreach_copy_(dst, src)
        if self.stream is not None:  # the next update writes the live values only after this copy read them
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))

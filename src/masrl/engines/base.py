"""The Engine interface the PolicyWorker codes against; the worker never knows which one it has.

An engine samples completions for a batch of ``GenRequest`` rows from the weights its worker
trains, and returns exact token ids and the sampling logprob of each token. Implementations:
``HFEngine`` (eager, any architecture, CPU or GPU) and ``StaticEngine`` (preallocated KV cache;
on CUDA, decode steps replayed as CUDA graphs; Llama-family models). ``make_engine`` picks one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from masrl.messages import GenOutput, GenRequest


@runtime_checkable
class Engine(Protocol):
    device: str  # "cpu" | "cuda:N"

    def generate(self, requests: list[GenRequest]) -> list[GenOutput]:
        """Sample every row; rows may mix adapters, temperatures, top-p, limits and stop strings."""
        ...

    def weights_updated(self, policies: list[str] | None = None) -> None:
        """The trainer changed the weights (of these LoRA adapters, or all): the next ``generate``
        must sample from the new ones. Engines that read the live parameters do nothing here."""
        ...

    def adapters(self) -> list[str]:
        """LoRA adapter names a request may ask for (empty for a full model)."""
        ...


def make_engine(kind: str, model, tokenizer, stop_ids: list[int], *, device: str, seed: int, **options) -> Engine:
    """``kind``: hf | static | auto (static on CUDA when the model supports it, else hf)."""
    from masrl.modeling import lean

    if kind == "auto":
        kind = "static" if device.startswith("cuda") and lean.supports(model) else "hf"
    if kind == "static":
        if not lean.supports(model):
            from masrl.errors import ConfigError

            arch = getattr(lean.core_model(model).config, "model_type", "?")
            raise ConfigError(f"rollout.engine: static supports {', '.join(lean.SUPPORTED_MODEL_TYPES)} models, not "
                              f"'{arch}'; use rollout.engine=hf")
        from masrl.engines.static import StaticEngine

        return StaticEngine(model, tokenizer, stop_ids, device=device, seed=seed, **options)
    if kind == "hf":
        from masrl.engines.hf import HFEngine

        return HFEngine(model, tokenizer, stop_ids, seed=seed)
    raise ValueError(f"unknown engine kind {kind!r}: use auto, hf or static")

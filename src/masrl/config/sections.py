"""The sections of a run's configuration (all but the policies', in ``policy.py``): sampling,
agents, workflow, data, tools' back-ends, rollout, rewards, algorithm, training and evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from masrl.config.policy import Strict


class SamplingParams(Strict):
    """How an agent samples. The one definition of these settings: agents set them in config,
    and the same object travels with every call to the worker and its engine."""

    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)

    temperature: float = Field(1.0, ge=0, le=5, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int | None = Field(None, ge=1, le=32768, description="default: the workflow's value for the agent")
    stop: tuple[str, ...] | None = Field(None, description="stop strings; default: the workflow's for the agent")
    ignore_eos: bool = Field(False, description="generate exactly max_new_tokens (benchmarks)")

    def resolved(self, max_new_tokens: int, stop: tuple[str, ...] = ()) -> "SamplingParams":
        """A copy with the unset fields filled from the workflow's defaults for the agent."""
        return self.model_copy(update={
            "max_new_tokens": self.max_new_tokens if self.max_new_tokens is not None else max_new_tokens,
            "stop": tuple(self.stop) if self.stop is not None else tuple(stop),
        })


class AgentConfig(SamplingParams):
    policy: str = Field(description="name of the policy (under `policies`) that plays this agent")
    trainable: bool | None = Field(None, description="false: the agent runs but its calls never train; default: "
                                                     "true unless its policy is frozen")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments for the tokenizer's chat template (e.g. "
                                          "enable_thinking: false for Qwen3), over the policy's")

    def sampling(self) -> SamplingParams:
        return SamplingParams(**{k: getattr(self, k) for k in SamplingParams.model_fields})


class WorkflowConfig(Strict):
    name: str = Field(description="a registered workflow (math_team, math_solver) or 'module:Class'")
    options: dict[str, Any] = Field(default_factory=dict)


class DataSourceConfig(Strict):
    source: str = Field(
        "arithmetic", description="arithmetic: seeded math word problems; math_chain: seeded problems that chain "
                                  "2-8 events on one count (levels: the number of events); code_gen: seeded "
                                  "function-writing tasks with visible and hidden tests; code_docs: the same "
                                  "functions under invented names, each task's documentation entry among "
                                  "others' (data.world.context_docs of them); humaneval: the 164 HumanEval problems; "
                                  "reasoning_gym: the reasoning-gym library's datasets (options.datasets); qa_world: "
                                  "seeded multi-hop questions over `data.world`'s corpus; episodes: seeds for an "
                                  "environment's episodes (workflow env); file: JSONL or Parquet; or your own "
                                  "'module:function' (data/sources.py)")
    kind: str = Field(
        "math", description="how rows are read, for source file and for rows your own source returns as dicts: "
                            "math (a question and a numeric answer) or a task family's kind (code rows carry tests; "
                            "qa rows answers and supporting facts); checked against the registered kinds")
    path: str | None = Field(None, description="JSONL or Parquet file (source: file)")
    n: int | None = Field(None, ge=1, description="number of tasks (generators) or first n rows (file, humaneval)")
    seed: int = 0
    levels: list[int] = Field(default_factory=lambda: [1], description="difficulty levels: arithmetic 1-4, code_gen "
                                                                       "and code_docs 1-2, qa_world 1 one-hop, 2 "
                                                                       "two-hop, 3 comparison")
    options: dict[str, Any] = Field(default_factory=dict, description="options of source reasoning_gym "
                                  "(datasets: {name: {weight, config}}, examples) or keyword options of your own source")

    @model_validator(mode="after")
    def _check(self) -> "DataSourceConfig":
        if self.path and not Path(self.path).expanduser().is_file():
            raise ValueError(f"dataset file '{self.path}' does not exist; fix `path` or create the file")
        return self


class WorldConfig(Strict):
    """The seeded QA world: one corpus for train and held-out questions (``source: qa_world``)."""

    docs: int = Field(300, ge=12, description="entities (one document each): people, cities, organisations")
    seed: int = 0
    context_docs: int = Field(0, ge=0, le=64, description="passages given with each question (meta.context): its "
                              "supporting documents among same-kind distractors, for the reading workflows; 0: none. "
                              "Source code_docs reads it too: documentation entries a task shows (at least 2)")
    dir: str | None = Field(None, description="where its corpus.jsonl is written (default: $MASRL_CACHE_DIR or "
                                              "~/.cache/masrl, under qa_world/)")


class DataConfig(Strict):
    train: DataSourceConfig = Field(default_factory=lambda: DataSourceConfig(n=2000, seed=1))
    eval: DataSourceConfig = Field(default_factory=lambda: DataSourceConfig(n=64, seed=2))
    world: WorldConfig = Field(default_factory=WorldConfig)


class RetrieverConfig(Strict):
    """What the search tool searches (search and RAG workflows)."""

    kind: Literal["local", "http"] = Field(
        "local", description="local: a BM25 index in this process; http: retrieval servers (`masrl retriever serve CORPUS`), "
                             "tried in order with failover")
    corpus: str | None = Field(None, description="local: a JSONL corpus of {id, title?, text}; default: the QA "
                                                 "world's corpus")
    endpoints: list[str] = Field(default_factory=list, description="http: server URLs, e.g. http://127.0.0.1:8000")
    topk: int = Field(3, ge=1, le=100, description="documents per query")
    timeout_s: float = Field(5.0, gt=0, le=86_400, description="http: per request")
    retries: int = Field(1, ge=0, description="http: retries per endpoint before failing over")
    dead_for_s: float = Field(30.0, ge=0, le=86_400, description="http: a failed endpoint is skipped this long")
    api_key_env: str | None = Field(None, description="http: environment variable holding the servers' API key "
                                                      "(a server started without one answers loopback hosts only)")

    @model_validator(mode="after")
    def _check(self) -> "RetrieverConfig":
        if self.kind == "http" and not self.endpoints:
            raise ValueError("retriever kind 'http' needs `endpoints`: a list of server URLs")
        if self.kind == "local" and self.endpoints:
            raise ValueError("`endpoints` is set but kind is 'local'; set kind: http to use the servers")
        if self.corpus and not Path(self.corpus).expanduser().is_file():
            raise ValueError(f"retriever corpus '{self.corpus}' does not exist")
        return self


class SandboxConfig(Strict):
    """Where model-written code runs (the code workflows' ``run_tests`` tool)."""

    require: Literal["any", "namespaces"] = Field(
        "any", description="namespaces: refuse to run unless the full walls are available (root + unshare); "
                           "any: run with what the machine allows, warning when it is weak")
    max_workers: int | None = Field(None, ge=1, description="programs run at once (default: CPU count)")
    cpu_s: float = Field(5.0, gt=0, le=86_400)
    wall_s: float = Field(10.0, gt=0, le=86_400)
    memory_mb: int = Field(512, ge=64, le=1_048_576, description="for the whole run of one program, its children "
                                                                  "included")
    tool_timeout_s: float = Field(300.0, gt=0, le=86_400, description="a test run that takes longer (queueing included) is "
                                                            "an infrastructure failure")


class RolloutConfig(Strict):
    tasks_per_step: int = Field(4, ge=1)
    samples_per_task: int = Field(4, ge=1, description="samples of each task per step (the GRPO group)")
    max_in_flight: int = Field(64, ge=1, description="workflows running at once")
    max_batch_size: int = Field(64, ge=1, description="largest engine batch per worker")
    max_wait_ms: float = Field(20.0, ge=0, le=10_000, description="how long a batcher waits to fill a batch (a paged host's "
                                                          "waits at most 1 ms: its calls join the running decode)")
    engine: Literal["auto", "hf", "paged", "vllm"] = Field(
        "auto", description="hf: eager, any architecture; paged: continuous batching over a paged KV cache held to "
                            "gpu_memory_utilization, shared prompt blocks, pre-emption instead of failure, CUDA "
                            "graphs and fused kernels on CUDA (Llama-family models); vllm: vLLM in the worker's "
                            "process (pip install 'masrl[vllm]'), weights pushed to it after every update; auto: "
                            "paged on CUDA when the model supports it, else hf")
    @field_validator("engine", mode="before")
    @classmethod
    def _retired(cls, v):
        if v == "static":
            raise ValueError("the static engine was retired: rollout.engine: paged (the default on CUDA) runs every "
                             "case it ran; use paged or auto")
        return v

    gpu_memory_utilization: float = Field(
        0.04, gt=0, le=0.95, description="paged and vllm engines: the fraction of the device's memory (for paged on a "
                                         "CPU: the host's) the KV cache takes, per worker, allocated once (vLLM's "
                                         "kv_cache_memory_bytes); 0.04 of an H200 (5.6 GB) "
                                         "holds 245k tokens of a SmolLM2-135M, 480k of a Qwen2.5-0.5B, 100k of a "
                                         "Qwen2.5-7B")
    kv_block_size: int = Field(16, ge=1, le=1024, description="paged engine: token slots per KV block (the unit of "
                                                               "allocation and of prefix sharing)")
    cuda_graphs: bool = Field(True, description="paged and vllm engines on CUDA: replay decode steps as CUDA graphs")
    graph_prefill: bool | None = Field(None, description="paged engine: a prefill whose new tokens read few keys "
                                                          "(next turns over a cached past, short prompts) runs as "
                                                          "token rows of the decode step, through its CUDA graphs, not "
                                                          "as eager forwards; null (default): on where the decode step "
                                                          "replays CUDA graphs, true/false: always/never")
    overlap_chunks: bool | None = Field(None, description="paged engine: queue the next decode chunk (the same calls, "
                                                           "from the device's last tokens) before the host takes "
                                                           "the tokens of the one in flight, so the device decodes "
                                                           "while the host keeps tokens and tells callers; null "
                                                           "(default): on a GPU; the tokens are the same either way")
    sync_every: int = Field(8, ge=1, le=256, description="paged engine: decode steps between host checks for "
                                                           "finished rows (EOS, stop strings)")
    call_timeout_s: float = Field(600.0, gt=0, le=86_400)
    trace_timeout_s: float = Field(1800.0, gt=0, le=7 * 86_400)
    reward_timeout_s: float = Field(120.0, gt=0, le=3600, description="the reward allocators of one trace, together: "
                                                                       "past it the trace fails (a stuck judge or "
                                                                       "plugin), counted like other failed traces")
    reward_isolation: Literal["process", "thread"] = Field(
        "process", description="where `module:factory` rewards run: process: in worker processes stopped at "
                               "reward_timeout_s and capped at reward_memory_mb (rewards/isolated.py); thread: in "
                               "the run's process, on a thread that is abandoned, not stopped, at the limit. The "
                               "built-in rewards always run in the run's process")
    reward_memory_mb: int = Field(2048, ge=64, le=1_048_576, description="process isolation: each reward worker's "
                                                                          "address space; past it the trace fails")
    reward_workers: int = Field(4, ge=1, le=64, description="process isolation: worker processes per reward plugin "
                                                             "(started as traces need them)")
    max_failed_fraction: float = Field(0.5, ge=0, le=1, description="stop the run when more of a step's traces "
                                                                    "than this fail for infrastructure reasons")
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: each step generates, then updates; async: episodes keep running while policies "
                            "update (driver/run/async_loop.py), each call tagged with its weights' version")
    overlap_update: Literal["auto"] | bool = Field(
        "auto", description="async mode: the engine samples from its own copy of the trainable weights, so a policy's "
                            "update runs while episodes keep generating (on CUDA in a stream of its own); the new "
                            "weights are copied in when the update ends (worker/model/weight_copy.py). Costs one copy of "
                            "the trainable weights (LoRA: the adapters only). auto: on in async mode on CUDA with "
                            "the hf or paged engine; false: the engine and the update take turns")
    counterfactual: CounterfactualConfig | None = Field(
        None, description="counterfactual credit per call ({k, agents}): costs k re-runs of the rest of the trace per "
                          "credited call, reported per step")
    dynamic_sampling: int = Field(0, ge=0, le=16, description="refill rounds per step (DAPO's dynamic sampling): a "
                                                                "task whose every group has equal rewards teaches "
                                                                "nothing, so its calls leave the update and fresh "
                                                                "tasks are rolled out in its place, up to this many "
                                                                "extra rollouts a step; 0: off")


REWARD_TYPES = ("outcome", "format", "turn_delta", "credit", "judge", "counterfactual")


class CounterfactualConfig(Strict):
    """Counterfactual credit: each call of ``agents`` is resampled ``k`` times and the rest of its trace
    re-run; the call earns its outcome minus the alternatives' mean (paid by the counterfactual reward)."""

    k: int = Field(2, ge=1, le=16, description="alternative samples per credited call")
    agents: list[str] | None = Field(None, description="agents whose calls are credited; default: every agent")


class RewardConfig(Strict):
    type: str = Field(description="outcome | format | turn_delta | credit (what the workflow credits each call) | "
                                  "judge (a model behind an OpenAI-compatible endpoint scores the final answer; "
                                  "options: base_url, model, ...) | counterfactual (each call's outcome minus the "
                                  "mean outcome with it resampled; needs rollout.counterfactual) | 'module:factory'")
    weight: float = 1.0
    per_agent: dict[str, float] = Field(default_factory=dict, description="format: weight per agent")
    penalty: float = Field(0.0, ge=0, description="format: subtracted when an output has no usable tag")
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "RewardConfig":
        if self.type not in REWARD_TYPES and ":" not in self.type:
            raise ValueError(f"unknown reward type {self.type!r}: use {', '.join(REWARD_TYPES)} or 'module:factory'")
        if self.type != "format":
            unused = [k for k, v in (("per_agent", self.per_agent), ("penalty", self.penalty)) if v]
            if unused:
                raise ValueError(f"{' and '.join(unused)} only apply to the format reward, not '{self.type}'; "
                                 f"remove {'them' if len(unused) > 1 else 'it'}")
        return self


class AlgorithmConfig(Strict):
    @model_validator(mode="after")
    def _check(self) -> "AlgorithmConfig":
        if self.mis is not None and not (0 <= self.mis[0] <= 1 <= self.mis[1]):
            raise ValueError(f"mis: [low, high] must hold 1 (low <= 1 <= high), got {list(self.mis)}")
        if self.pack and self.share_prefix:
            raise ValueError("pack and share_prefix are two layouts of a micro-batch: set one of them to true, not both")
        return self

    advantage: str = Field("grpo", description="grpo | rloo | reinforce_pp | gae | rae | 'module:function' (your own: "
                                               "f(batch: EstimatorBatch, **options), see algorithms/estimators.py)")
    advantage_options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the estimator, "
                                                                                "over the ones it takes from this "
                                                                                "section (std_normalize, gamma, ...)")
    group_key: list[Literal["task_id", "agent", "turn", "policy", "sample_idx", "state"]] = Field(
        default_factory=lambda: ["task_id", "agent", "turn"],
        description="the fields whose equal values make a group; state: the position a game's move was made from "
                    "([agent, state]: every move from one position in the step is one group, a turn-level baseline)")
    std_normalize: bool = Field(True, description="grpo: divide by the group's std")
    std_scope: Literal["group", "agent"] = Field(
        "group", description="grpo with std_normalize: the std of each group (GRPO), or of each agent's centred "
                             "rewards across its groups (per-agent normalisation, Dr. MAS)")
    reward_norm: Literal["none", "batch", "running"] = Field(
        "none", description="normalise each policy's rewards before the estimator: batch (this step's mean and std) "
                            "or running (mean and std over all steps so far, saved in checkpoints)")
    whiten_advantages: bool = Field(False, description="after the estimator, whiten each policy's advantages "
                                                       "(minus their mean, over their std) over the step")
    baseline: Literal["none", "group_mean"] = Field("none", description="reinforce_pp baseline")
    clip_eps: float = Field(0.2, gt=0, lt=1)
    clip_eps_high: float | None = Field(None, gt=0, description="asymmetric upper clip (DAPO); default clip_eps")
    kl_coef: float = Field(0.0, ge=0, description="weight of KL(policy || reference) in the loss")
    kl_estimator: Literal["k1", "k3"] = "k3"
    entropy_coef: float = Field(0.0, ge=0)
    aggregation: Literal["token", "sequence"] = "token"
    ppo_epochs: int = Field(1, ge=1)
    mini_batches: int = Field(1, ge=1, description="optimizer steps per epoch")
    micro_batch_size: int = Field(8, ge=1, description="sequences per forward/backward")
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="token budget per forward/backward (padded, or packed when `pack` is on); "
                                "set: micro-batches are filled by length up to it instead of by `micro_batch_size`")
    pack: bool | None = Field(None, description="pack sequences without padding (varlen flash attention, CUDA only); "
                                                  "default: on where available")
    share_prefix: bool | None = Field(None, description="run the prompt prefix that rows share once per micro-batch "
                                                          "(with micro_batch_tokens, the prefix counts once); default: "
                                                          "on CPU; on CUDA when it runs at most a quarter of the "
                                                          "tokens packing runs (long prompts that a call's samples "
                                                          "share, short answers), else packing; true or false decides")
    activation_checkpointing: bool = Field(False, description="recompute each layer's activations in backward")
    tis_cap: float | None = Field(
        None, gt=0, description="truncated importance sampling: recompute the old logprobs with the trainer and weight "
                                "each token by min(pi_trainer / pi_rollout, tis_cap); for when the engine's numerics "
                                "differ from the trainer's (bf16, other kernels)")
    mis: tuple[float, float] | None = Field(
        None, description="masked importance sampling: [low, high]; tokens whose ratio pi_trainer / pi_rollout "
                          "leaves it are dropped from the loss (with tis_cap, the kept ones are also truncated)")
    gamma: float = Field(1.0, ge=0, le=1, description="gae discount")
    lam: float = Field(0.95, ge=0, le=1, description="gae lambda")
    vf_coef: float = Field(0.5, ge=0, description="gae: value loss weight")
    value_clip: float | None = Field(0.2, gt=0)
    skip_zero_advantage: bool = Field(True, description="skip sequences whose gradient is exactly zero")


class KeepBestConfig(Strict):
    """``train.keep_best``: keep the checkpoint that scores best on a validation split."""

    n: int = Field(64, ge=1, description="validation tasks, drawn from the training tasks (the training "
                                         "distribution) and held back from training; never the held-out set")
    every: int = Field(10, ge=1, description="score the validation tasks every N steps (and after the last step)")


class TrainConfig(Strict):
    steps: int = Field(10, ge=0)
    keep_best: KeepBestConfig | None = Field(None, description="keep checkpoints/best, the weights that score best "
                                                               "on a validation split; held-out figures are "
                                                               "reported for them beside the last step's")
    save_every: int = Field(5, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep_last: int = Field(2, ge=0, description="checkpoints kept (older ones are deleted once a new one is "
                                                "complete); 0 keeps all")
    eval_before: bool = True
    eval_after: bool = True
    eval_every: int = Field(0, ge=0, description="evaluate on the held-out set every N steps (0: never during training)")
    log_traces: int = Field(4, ge=0, description="traces per step written to traces.jsonl")
    progress_every_s: float = Field(60.0, gt=0, le=86_400, description="when the console is not a terminal (a log file), a line "
                                                            "'rollout: done/total after XmYYs' at most this often "
                                                            "during a rollout or an evaluation")
    stop_when_stuck: int = Field(40, ge=0, description="end the run (checkpoint, final evaluation, exit status 3) "
                                                        "after this many steps in which the training outcome never "
                                                        "rose above the first step's and most of every agent's groups "
                                                        "had equal rewards, or whose updates trained no token at all; "
                                                        "0: never")
    time_limit_s: float | None = Field(None, gt=0, description="wall-clock budget in seconds from the run's start: the "
                                                               "steps end once the next one would end past it, then "
                                                               "the run checkpoints and evaluates as a finished run "
                                                               "does (leave room for that); None: no limit")
    policy_kl: int = Field(0, ge=0, description="each step, KL between every two trainable policies on one tokenizer "
                                                "on up to this many of each one's calls (its logprobs against the "
                                                "other's on the same tokens); 0: off")
    loggers: list[str] = Field(default_factory=lambda: ["jsonl"],
                               description="jsonl (always on) | tensorboard | wandb | 'module:factory'")
    wandb_project: str = "masrl"
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"


class EvalConfig(Strict):
    temperature: float = Field(0.0, ge=0, description="sampling temperature at eval (0 = greedy)")
    samples_per_task: int = Field(1, ge=1, description="k: pass@1, pass@k (unbiased estimator) and maj@k over k samples")
    log_traces: int = Field(32, ge=0, description="held-out traces written per evaluation to eval_traces.jsonl in the "
                                                  "run's folder (masrl eval: in output_dir), every call's prompt and "
                                                  "reply; 0: none")

    @model_validator(mode="after")
    def _check(self) -> "EvalConfig":
        if self.samples_per_task > 1 and self.temperature == 0:
            raise ValueError("eval.samples_per_task > 1 with eval.temperature 0 draws the same greedy sample k times; "
                             "set eval.temperature (e.g. 0.7) for pass@k / maj@k")
        return self

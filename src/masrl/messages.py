"""The plain messages that cross the seams between controller, worker and engine.

No torch here: workflows, tools and the controller import these, and they travel to Ray actors
as they are. The flow of one LLM call::

    controller --GenCall--> PolicyWorker --GenRequest--> Engine
    controller <-GenResult- PolicyWorker <--GenOutput--- Engine

Token ids and logprobs stop at the worker (it keeps them to train on); the controller gets text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from masrl.config import SamplingParams

__all__ = ["SamplingParams", "GenCall", "GenResult", "GenRequest", "GenOutput", "RAW_ROLE"]

# A message of this role holds a raw prompt: the worker tokenizes it as it is, with no chat template
# (the gateway's /v1/completions).
RAW_ROLE = "__raw_prompt__"


@dataclass
class GenCall:
    """One agent call, as the controller hands it to the worker that hosts the agent's policy."""

    call_id: str
    policy: str
    messages: list[dict]
    sampling: SamplingParams  # resolved: max_new_tokens and stop are set
    record: bool = True  # keep the tokens for training
    key: dict = field(default_factory=dict)  # task_id, agent, turn, sample_idx, trace_id
    template_kwargs: dict = field(default_factory=dict)  # for the tokenizer's chat template (enable_thinking, ...)
    seed: int | None = None  # the call's own sampling seed: its tokens do not depend on its batch
    tools: list[dict] = field(default_factory=list)  # JSON specs of tools the model may call (``tools.calls``)
    extends: str | None = None  # an earlier call whose prompt and sampled completion these messages continue
    logprobs: int | None = None  # None: none back; 0: each sampled token's logprob; k: and the k likeliest tokens


@dataclass
class GenResult:
    call_id: str
    text: str
    n_prompt_tokens: int
    n_completion_tokens: int
    finish_reason: str  # "stop" (EOS or stop string) | "length"
    version: int = 0  # the policy's weight version that sampled it (its updates so far)
    # when the call asked (GenCall.logprobs): per sampled token {"token", "logprob", "bytes", "top_logprobs"}
    logprobs: list[dict] | None = None


@dataclass
class GenRequest:
    """One row of an engine batch: token ids in, sampled token ids and logprobs out."""

    prompt_ids: list[int]
    sampling: SamplingParams
    adapter: str | None = None  # LoRA adapter name on a shared base; None: the plain model
    seed: int | None = None  # set on every row of a batch: token t of this row uses counter_uniforms(seed)[t]

    @property
    def max_new_tokens(self) -> int:
        n = self.sampling.max_new_tokens
        if n is None:
            raise ValueError("GenRequest.sampling.max_new_tokens is unset; resolve the sampling params first")
        return n


@dataclass
class GenOutput:
    completion_ids: list[int]
    logprobs: list[float]  # of each sampled token under softmax(logits / T), before top-p
    text: str
    finish_reason: str  # "stop" | "length"
    meta: dict = field(default_factory=dict)

"""The record of one workflow run: ordered LLM calls and tool calls, final state, metrics, error.

Traces are thin: text, parsed output and ids. Token ids and logprobs stay in the worker that
served each call, keyed by ``call_id`` (see DESIGN.md), so a trace is cheap to copy and log.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Call:
    """One LLM call made by an agent inside a workflow."""

    call_id: str
    trace_id: str
    task_id: str
    sample_idx: int
    agent: str
    policy: str
    turn: int
    messages: list[dict[str, str]]
    completion: str = ""
    n_prompt_tokens: int = 0
    n_completion_tokens: int = 0
    finish_reason: str = ""  # "stop" (EOS or stop string) | "length"
    parsed: dict[str, Any] | None = None
    format_ok: bool = False
    format_score: float = 0.0  # partial credit in [0, 1] from the agent's parser
    turn_score: float | None = None  # optional per-turn quality set by the workflow (for turn deltas)
    credit: float | None = None  # the workflow's own reward for this call (paid by the `credit` reward)
    counterfactual: float | None = None  # outcome minus the mean outcome with this call resampled (`counterfactual`)
    reward: float | None = None
    reward_parts: dict[str, float] = field(default_factory=dict)
    advantage: float | None = None  # what the update used (mean over tokens for GAE); None: not trained
    trainable: bool = True
    policy_version: int = 0  # the version of the policy's weights that sampled this call (its updates so far)
    state: str | None = None  # the situation the call answers, named by the workflow (a game's position)
    # per-token logprobs, only when the caller asked for them (a gateway request's ``logprobs``); never logged
    token_logprobs: list[dict] | None = field(default=None, repr=False)


@dataclass
class ToolCall:
    """One tool invocation made by a workflow."""

    trace_id: str
    name: str
    args: dict[str, Any]
    result: Any = None
    error: str | None = None  # model-caused (shown to the model) unless ``infra``
    duration_s: float = 0.0
    turn: int = 0
    infra: bool = False  # the failure was the infrastructure's: the trace is dropped


@dataclass
class Trace:
    trace_id: str
    task_id: str
    sample_idx: int
    calls: list[Call] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    final_answer: Any = None
    state: dict[str, Any] = field(default_factory=dict)  # workflow-specific final state
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # infrastructure failure: the trace is excluded from training
    duration_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for c in d["calls"]:
            c.pop("token_logprobs", None)
        return d


@dataclass(frozen=True)
class RewardAssignment:
    """A scalar reward bound to one call; ``source`` names the allocator that produced it."""

    call_id: str
    reward: float
    source: str

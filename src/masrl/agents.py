"""AgentSpec: a logical agent of a workflow and what it maps to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from masrl.parsing import ParseResult

Parser = Callable[[str], ParseResult]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentRole:
    """What a workflow declares about one of its agents: how to prompt it and parse its output."""

    name: str
    parser: Parser
    description: str = ""
    default_max_new_tokens: int = 64
    default_stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentSpec:
    """A logical agent: its role in the workflow plus the policy and sampling chosen in config."""

    name: str
    policy: str
    parser: Parser
    sampling: SamplingParams = field(default_factory=SamplingParams)
    trainable: bool = True

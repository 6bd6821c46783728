"""AgentSpec: a logical agent of a workflow and what it maps to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from masrl.config import SamplingParams
from masrl.parsing import ParseResult

Parser = Callable[[str], ParseResult]


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
    """A logical agent: its role in the workflow plus the policy and sampling chosen in config
    (``sampling`` is resolved: the role's defaults fill what the config left unset)."""

    name: str
    policy: str
    parser: Parser
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams().resolved(64))
    trainable: bool = True
    template_kwargs: dict = field(default_factory=dict)  # for the tokenizer's chat template

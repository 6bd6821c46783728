"""The multi-agent environment interface, beside workflows.

An environment owns the episode: who acts next, what each agent observes, what its action
(text) does, the messages agents send each other, per-agent rewards and termination::

    class MyEnv:
        agents = ["scout", "solver"]                          # logical agents, mapped to policies in config
        def roles(self) -> dict[str, AgentRole]: ...          # parser, max tokens, stop strings per agent
        def reset(self, seed: int) -> dict[str, str]: ...     # first observation of every agent
        def next_agent(self) -> str | None: ...               # turn order; None when the episode is over
        def prompt(self, agent: str) -> list[dict]: ...       # the chat messages the agent acts on now
        def step(self, agent: str, action: str, parsed: dict) -> StepResult: ...
        def outcome(self) -> dict[str, float]: ...            # metrics of the finished episode; "outcome" required

``EnvWorkflow`` (``workflows/env.py``) adapts any such environment onto masrl's traces: every
action is a call on the trace (agent, turn), each step's reward for the acting agent is that
call's ``credit`` (paid by the ``credit`` reward), rewards given to other agents at a step are
added to their latest call, and ``outcome()`` is the trace's score. Allocators, estimators and
trainers apply unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from masrl.agents import AgentRole


@dataclass
class StepResult:
    rewards: dict[str, float] = field(default_factory=dict)  # per agent, for this step
    messages: dict[str, list[str]] = field(default_factory=dict)  # delivered to these agents' observations
    done: bool = False
    info: dict = field(default_factory=dict)


class Environment(Protocol):
    agents: list[str]

    def roles(self) -> dict[str, AgentRole]: ...

    def reset(self, seed: int) -> dict[str, str]: ...

    def next_agent(self) -> str | None: ...

    def prompt(self, agent: str) -> list[dict]: ...

    def step(self, agent: str, action: str, parsed: dict) -> StepResult: ...

    def outcome(self) -> dict[str, float]: ...

"""The Workflow protocol: control flow over agents and tools."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.trace import Trace

if TYPE_CHECKING:
    from masrl.driver.context import WorkflowContext


class Workflow(Protocol):
    """A workflow declares its agents, runs one task, and scores the finished trace.

    ``run`` calls ``await ctx.call(agent, messages)`` and ``await ctx.tool(name, **args)`` and
    ends with ``ctx.finish(answer)``. ``score`` returns metrics for the trace; the key
    ``outcome`` (a float, usually 0 or 1) is what the outcome reward pays.
    """

    name: str

    def roles(self) -> dict[str, AgentRole]: ...

    async def run(self, task: Task, ctx: "WorkflowContext") -> None: ...

    def score(self, trace: Trace, task: Task) -> dict[str, float]: ...

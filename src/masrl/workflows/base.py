"""What a workflow is (``Workflow``) and what it sees while it runs (``Context``).

The driver's ``WorkflowContext`` implements ``Context``; a workflow depends on this protocol only,
so workflows sit below the driver that runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.tools.base import ToolResult
from masrl.trace import Call, Trace


class Context(Protocol):
    """One episode's view of the run: its trace, its agents and tools, and where it records its end."""

    trace: Trace
    state: dict[str, Any]
    train: bool

    async def call(self, agent: str, messages: list[dict[str, str]], *, turn: int | None = None,
                   tools: list[str] | None = None, tool_specs: list[dict] | None = None,
                   limit: dict | None = None, extends: str | None = None) -> Call: ...

    async def tool(self, name: str, **args: Any) -> ToolResult: ...

    async def model_tool(self, name: str, args: dict) -> ToolResult: ...

    def finish(self, answer: Any = None, **state: Any) -> None: ...


class Workflow(Protocol):
    """A workflow declares its agents, runs one task, and scores the finished trace.

    ``run`` calls ``await ctx.call(agent, messages)`` and ``await ctx.tool(name, **args)`` and
    ends with ``ctx.finish(answer)``. ``score`` returns metrics for the trace; the key
    ``outcome`` (a float, usually 0 or 1) is what the outcome reward pays.

    Optional parts (``HOOKS``; the driver reads them once, through ``hooks_of``):
    - ``tools(services) -> {name: Tool}``: a workflow with tools, or one that needs the run's back-ends;
    - ``check_split(source, key)``: one that reads a data split's options (a game's seating), checking them; a
      split with options is refused for a workflow without it;
    - ``async yardsticks(trainer) -> dict``: exact measures of a trained policy beside the held-out figures (a
      game's exploitability; its ``lines`` printed), which ``masrl eval`` reports;
    - ``async aclose()``: one that starts something of its own (a gateway, a runner process), stopped at the end.
    """

    name: str

    def roles(self) -> dict[str, AgentRole]: ...

    async def run(self, task: Task, ctx: Context) -> None: ...

    def score(self, trace: Trace, task: Task) -> dict[str, float]: ...


HOOKS = ("tools", "check_split", "yardsticks", "aclose")


@dataclass(frozen=True)
class Hooks:
    """A workflow's optional parts (``Workflow``), each None where it has none."""

    tools: Callable[[Any], dict] | None
    check_split: Callable[[Any, str], None] | None
    yardsticks: Callable[[Any], Any] | None
    aclose: Callable[[], Any] | None


def hooks_of(workflow) -> Hooks:
    """The optional parts ``workflow`` defines, found once by name."""
    return Hooks(**{name: getattr(workflow, name, None) for name in HOOKS})


def state_means(trace: Trace, names: dict[str, str]) -> dict[str, float]:
    """Metrics from lists a workflow left in ``trace.state`` (``ctx.finish(grounded=[1.0, 0.0])``): each
    ``names`` key's list averaged under its metric name; empty or missing lists give no metric."""
    return {name: sum(xs) / len(xs) for key, name in names.items() if (xs := trace.state.get(key) or [])}

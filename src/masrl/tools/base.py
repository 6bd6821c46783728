"""The tool seam: a named, described function with typed arguments, run off the event loop.

    @tool(description="Run the program against the task's tests", timeout_s=20)
    async def run_tests(code: str, task_id: str) -> dict: ...

A tool's argument schema (JSON Schema, what chat templates take as ``tools=``) is derived from
its signature. ``run_tool`` (through ``ctx.tool``) checks arguments against it, runs async tools on the loop and
sync ones in a thread pool, each under its timeout, so one slow tool never stalls the other
workflows or the engine batchers. Two kinds of failure, kept apart:

* ``ToolUseError`` (and bad arguments): the model caused it (a failing program, a query with no
  hits, a wrong argument). It comes back as ``ToolResult(ok=False, error=...)``, which the
  workflow shows the model and can reward.
* anything else, and timeouts: infrastructure (retriever down, sandbox crashed). ``run_tool``
  raises ``ToolInfraError``; ``ctx.tool`` records it and raises ``errors.ToolError`` (an
  ``InfraError``), and the trace is dropped from training and counted.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable


class ToolUseError(Exception):
    """Raised by a tool for a failure the model caused; shown to the model, not an infrastructure failure."""


@dataclass
class ToolResult:
    ok: bool
    value: Any = None
    error: str | None = None  # the model-facing message when not ok


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}
_PY_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}


def _schema_of(ann: Any) -> dict:
    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        return _schema_of(args[0]) if len(args) == 1 else {}
    if origin in (list, tuple):
        inner = typing.get_args(ann)
        return {"type": "array", **({"items": _schema_of(inner[0])} if inner else {})}
    if origin is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(ann))}
    return {"type": _JSON_TYPES[ann]} if ann in _JSON_TYPES else {}


@dataclass
class Tool:
    name: str
    description: str
    fn: Callable[..., Any]
    timeout_s: float = 30.0
    parameters: dict = field(default_factory=dict)  # JSON Schema of the arguments

    @classmethod
    def from_function(cls, fn: Callable, *, name: str | None = None, description: str | None = None,
                      timeout_s: float = 30.0) -> "Tool":
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        props, required = {}, []
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            props[p.name] = _schema_of(hints.get(p.name, Any))
            if p.default is p.empty:
                required.append(p.name)
        desc = description or (inspect.getdoc(fn) or "").split("\n\n")[0] or fn.__name__
        return cls(name or fn.__name__, desc, fn, timeout_s,
                   {"type": "object", "properties": props, "required": required})

    def spec(self) -> dict:
        """The OpenAI/chat-template function spec (what ``apply_chat_template(tools=...)`` takes)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def check_args(self, args: dict) -> str | None:
        """Why ``args`` do not fit the schema (a model-facing message), or None."""
        props = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", []) if k not in args]
        if missing:
            return f"tool '{self.name}' needs argument(s) {', '.join(missing)}"
        extra = [k for k in args if k not in props]
        if extra:
            return f"tool '{self.name}' takes no argument(s) {', '.join(extra)} (it takes {', '.join(props) or 'none'})"
        for k, v in args.items():
            want = props[k].get("type")
            py = _PY_TYPES.get(want)
            if py is not None and (not isinstance(v, py) or (want in ("integer", "number") and isinstance(v, bool))):
                return f"tool '{self.name}': argument '{k}' must be a {want}, got {type(v).__name__}"
            if "enum" in props[k] and v not in props[k]["enum"]:
                return f"tool '{self.name}': argument '{k}' must be one of {props[k]['enum']}"
        return None


def tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None,
         timeout_s: float = 30.0):
    """Decorator: turn a function into a ``Tool`` (schema from its signature and type hints)."""
    if fn is None:
        return functools.partial(tool, name=name, description=description, timeout_s=timeout_s)
    return Tool.from_function(fn, name=name, description=description, timeout_s=timeout_s)


class ToolInfraError(RuntimeError):
    """A tool failed for a reason the model did not cause (or ran past its timeout)."""


async def run_tool(t: Tool, args: dict) -> ToolResult:
    """Run ``t`` with ``args``: model-caused failures come back as a ToolResult; infrastructure
    failures raise ToolInfraError."""
    problem = t.check_args(args)
    if problem:
        return ToolResult(False, error=problem)
    try:
        if inspect.iscoroutinefunction(t.fn):
            out = await asyncio.wait_for(t.fn(**args), t.timeout_s)
        else:
            out = await asyncio.wait_for(asyncio.to_thread(t.fn, **args), t.timeout_s)
    except ToolUseError as exc:
        return ToolResult(False, error=str(exc))
    except asyncio.TimeoutError:
        raise ToolInfraError(f"tool '{t.name}' did not answer within {t.timeout_s:g}s") from None
    except Exception as exc:
        raise ToolInfraError(f"tool '{t.name}' failed: {type(exc).__name__}: {exc}") from exc
    return ToolResult(True, out)

"""Workflows written as a graph in YAML, for users who do not want to write Python.

    workflow: {name: graph, options: {path: qa/graphs/rag.yaml}}     # or options: {graph: {...}}

A graph file::

    agents:                       # the logical agents (mapped to policies in the run config's `agents`)
      answerer:
        system: "You answer ..."
        examples: [["Question: ...", "<answer>...</answer>"]]    # worked turns before the prompt
        parser: {tags: [answer]}  # or {json: queries} (a JSON object's key) or raw
        max_new_tokens: 24
        stop: ["</answer>"]
    tools: [search_many]          # search | search_many | run_tests | module:factory (factory(services) -> Tool)
    start: decompose
    max_steps: 20                 # node runs per task; past it the task ends with the answer so far
    max_calls: 64                 # model calls per task (each of a foreach's counted); past it, the same
    nodes:
      decompose: {type: llm, agent: decomposer, prompt: "Question: {task.question}", next: retrieve}
      retrieve:  {type: tool, tool: search_many, args: {queries: "take(decompose.queries or [task.question], 3)"},
                  next: write}
      write:     {type: llm, agent: evidence_writer, foreach: retrieve.args.queries,
                  prompt: "Search: {item}\\nResults:\\n{docs(retrieve.result[index])}", next: answer}
      answer:    {type: llm, agent: answerer, prompt: "Notes: {numbered(write.evidence)}",
                  next: [{if: "answer.answer == none and visits.answer < 2", to: answer}, {to: end}]}
    answer: answer.answer         # the final answer (an expression)
    score: qa                     # qa (token F1 / exact match) | math | module:function(trace, task) -> dict

Prompts are templates whose ``{...}`` fields are expressions (``workflows.expr``: comparisons,
boolean logic, field access, a few functions; never ``eval``). An llm node's value has its
parser's fields (``None`` when missing) and ``text``; a ``foreach`` node runs one call per item
of a list, all at once, with ``item`` and ``index`` bound, and its fields are lists. A tool node's
value has ``result``, ``ok``, ``error`` and ``args``. ``visits.<node>`` counts a node's runs,
``steps`` all runs and ``calls`` the model calls. Everything is checked at load: an unknown node, agent,
tool, function or field, or a node named as a built-in (``task``, ``steps``, a function), is an error
that names it. An expression that fails on the values a task meets fails that trace (``GraphRunError``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from masrl.agents import AgentRole
from masrl.config.explain import format_validation_error
from masrl.config.loading import MAX_YAML_NODES, expanded_size, read_yaml
from masrl.data.tasks import Task
from masrl.errors import ConfigError, InfraError
from masrl.parsing import ParseResult, TagSpec, nonempty, parse_json_key, parse_tags
from masrl.trace import Trace
from masrl.workflows.expr import FUNCTIONS, EvalError, Expr, ExprError, compile_expr, compile_template
from masrl.workflows.prompting import few_shot


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class AgentDef(_Strict):
    system: str = ""
    examples: list[tuple[str, str]] = Field(default_factory=list)
    parser: Union[Literal["raw"], dict[str, Any]] = Field("raw", description="raw | {tags: [..]} | {json: key}")
    max_new_tokens: int = Field(64, ge=1)
    stop: list[str] = Field(default_factory=list)
    description: str = ""


class Edge(_Strict):
    to: str
    if_: str | None = Field(None, alias="if")


class LLMNode(_Strict):
    type: Literal["llm"]
    agent: str
    prompt: str
    foreach: str | None = None
    next: Union[str, list[Edge]] = "end"


class ToolNode(_Strict):
    type: Literal["tool"]
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    next: Union[str, list[Edge]] = "end"


class GraphSpec(_Strict):
    agents: dict[str, AgentDef]
    tools: list[str] = Field(default_factory=list)
    start: str
    max_steps: int = Field(50, ge=1, le=10_000, description="node runs per task")
    max_calls: int = Field(64, ge=1, le=10_000, description="model calls per task, a foreach's each counted; past "
                                                              "it the task ends with the answer so far")
    nodes: dict[str, Annotated[Union[LLMNode, ToolNode], Field(discriminator="type")]]
    answer: str
    score: str = "qa"


TASK_FIELDS = {"question", "answer", "id", "meta"}
BUILTIN_NAMES = {"task", "visits", "steps", "calls", "item", "index", "end", "none", "true", "false"}


class GraphRunError(InfraError):
    """An expression failed on the values a task met (a model's reply of another shape than the graph expects,
    say): that trace fails, counted like other failed traces; a graph that fails every trace stops the run."""


def make_parser(spec: Union[str, dict], where: str):
    """(parser, its field names) for a parser spec."""
    if spec == "raw":
        return (lambda text: ParseResult(bool(text.strip()), float(bool(text.strip())), {})), []
    if isinstance(spec, dict) and set(spec) == {"tags"}:
        tags = spec["tags"]
        if not isinstance(tags, list) or not tags or not all(isinstance(t, str) and t.isidentifier() for t in tags):
            raise ConfigError(f"{where}.parser.tags must be a list of tag names, got {tags!r}")
        specs = [TagSpec(t, nonempty) for t in tags]
        return (lambda text: parse_tags(text, specs)), list(tags)
    if isinstance(spec, dict) and set(spec) == {"json"}:
        key = spec["json"]
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"{where}.parser.json must be a key name, got {key!r}")
        return (lambda text: parse_json_key(text, key)), [key]
    raise ConfigError(f"{where}.parser: {spec!r} is not a parser; use raw, {{tags: [name, ...]}} or {{json: key}}")


def tool_factory(name: str):
    """The function that builds tool ``name`` from the run's services."""
    if name in ("search", "search_many"):
        from masrl.tools.search import search_tools

        return lambda services: search_tools(services)[name]
    if name == "run_tests":
        from masrl.tools.code_tests import code_tools

        return lambda services: code_tools(services)["run_tests"]
    if ":" in name:
        from masrl.config.loading import load_object

        return load_object(name, "graph tool")
    raise ConfigError(f"graph tool '{name}' is unknown; use search, search_many, run_tests or 'module:factory'")


def load_graph(path: str | Path | None = None, graph: dict | None = None) -> GraphSpec:
    if (path is None) == (graph is None):
        raise ConfigError("workflow 'graph' needs options.path (a graph YAML file) or options.graph (the graph inline)")
    where = "workflow.options.graph"
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(f"graph file '{path}' does not exist (workflow.options.path)")
        graph = read_yaml(p.read_text(), f"graph file '{path}'")
        where = str(path)
    if not isinstance(graph, dict):
        raise ConfigError(f"{where}: a graph must be a mapping with agents, start, nodes and answer")
    if expanded_size(graph, MAX_YAML_NODES) > MAX_YAML_NODES:  # an inline graph, read with the run's config
        raise ConfigError(f"{where}: the graph stands for more than {MAX_YAML_NODES:,} values once its YAML aliases "
                          f"are expanded; write it without nested anchors")
    try:
        return GraphSpec.model_validate(graph)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, where, GraphSpec).replace("invalid config", "invalid graph", 1)) \
            from None


class Graph:
    """A workflow built from a ``GraphSpec``: every name checked at load."""

    name = "graph"

    def __init__(self, path: str | None = None, graph: dict | None = None):
        spec = load_graph(path, graph)
        self.where = str(path) if path else "workflow.options.graph"
        self.spec = spec
        self.parsers, self.fields = {}, {}
        for name, a in spec.agents.items():
            self.parsers[name], self.fields[name] = make_parser(a.parser, f"{self.where}: agents.{name}")
        self.tool_factories = {t.rsplit(":", 1)[-1] if ":" in t else t: tool_factory(t) for t in spec.tools}
        self.compiled: dict[str, dict[str, Any]] = {}
        if spec.start not in spec.nodes:
            raise ConfigError(f"{self.where}: start '{spec.start}' is not a node (nodes: {', '.join(spec.nodes)})")
        for name in spec.nodes:
            if name in BUILTIN_NAMES or name in FUNCTIONS:
                raise ConfigError(f"{self.where}: nodes.{name}: '{name}' is a built-in name of the expressions; "
                                  f"rename the node")
        for name, node in spec.nodes.items():
            self.compiled[name] = self._compile_node(name, node)
        self.answer = self._expr(spec.answer, "answer", foreach=False)
        self.scorer = self._scorer(spec.score)

    # -- load-time checks --------------------------------------------------------------------------
    def _node_fields(self, node) -> set[str]:
        if isinstance(node, ToolNode):
            return {"result", "ok", "error", "args"}
        return {"text", *self.fields[node.agent]}

    def _check_refs(self, e: Expr, where: str, foreach: bool) -> None:
        for root, fld in e.refs:
            if root in FUNCTIONS or root in ("steps", "calls"):
                continue
            if root in ("item", "index"):
                if not foreach:
                    raise ConfigError(f"{self.where}: {where}: '{root}' exists only in a node with `foreach`")
            elif root in ("visits", "task"):
                self._check_builtin_field(root, fld, where)
            else:
                self._check_node_field(root, fld, e, where)

    def _check_builtin_field(self, root: str, fld: str | None, where: str) -> None:
        """``visits.<node>`` names a node; ``task.<field>`` a task field."""
        if fld is None:
            return
        if root == "visits" and fld not in self.spec.nodes:
            raise ConfigError(f"{self.where}: {where}: visits.{fld}: no node '{fld}' "
                              f"(nodes: {', '.join(self.spec.nodes)})")
        if root == "task" and fld not in TASK_FIELDS:
            raise ConfigError(f"{self.where}: {where}: task has no field '{fld}' "
                              f"(fields: {', '.join(sorted(TASK_FIELDS))})")

    def _check_node_field(self, root: str, fld: str | None, e: Expr, where: str) -> None:
        if root not in self.spec.nodes:
            raise ConfigError(f"{self.where}: {where}: unknown name '{root}' in `{e.source}` (nodes: "
                              f"{', '.join(self.spec.nodes)}; also task, item, index, visits, steps)")
        known = self._node_fields(self.spec.nodes[root])
        if fld is not None and fld not in known:
            raise ConfigError(f"{self.where}: {where}: node '{root}' has no field '{fld}' in `{e.source}` "
                              f"(fields: {', '.join(sorted(known))})")

    def _expr(self, src: Any, where: str, foreach: bool) -> Expr:
        try:
            e = compile_expr(src)
        except ExprError as exc:
            raise ConfigError(f"{self.where}: {where}: {exc}") from None
        self._check_refs(e, where, foreach)
        return e

    def _compile_node(self, name: str, node) -> dict[str, Any]:
        where = f"nodes.{name}"
        out: dict[str, Any] = {}
        if isinstance(node, LLMNode):
            if node.agent not in self.spec.agents:
                raise ConfigError(f"{self.where}: {where}.agent: unknown agent '{node.agent}' "
                                  f"(agents: {', '.join(self.spec.agents)})")
            try:
                tpl = compile_template(node.prompt)
            except ExprError as exc:
                raise ConfigError(f"{self.where}: {where}.prompt: {exc}") from None
            for e in tpl.exprs:
                self._check_refs(e, f"{where}.prompt field {{{e.source}}}", node.foreach is not None)
            out["prompt"] = tpl
            out["foreach"] = self._expr(node.foreach, f"{where}.foreach", False) if node.foreach else None
        else:
            if node.tool not in self.tool_factories:
                raise ConfigError(f"{self.where}: {where}.tool: unknown tool '{node.tool}' (declare it under `tools`; "
                                  f"declared: {', '.join(self.tool_factories) or 'none'})")
            out["args"] = {k: self._expr(v, f"{where}.args.{k}", False) if isinstance(v, str) else v
                           for k, v in node.args.items()}
        edges = [Edge(to=node.next)] if isinstance(node.next, str) else node.next
        out["edges"] = []
        for i, edge in enumerate(edges):
            if edge.to != "end" and edge.to not in self.spec.nodes:
                raise ConfigError(f"{self.where}: {where}.next: unknown node '{edge.to}' "
                                  f"(nodes: {', '.join(self.spec.nodes)}, or end)")
            cond = self._expr(edge.if_, f"{where}.next.{i}.if", False) if edge.if_ else None
            out["edges"].append((cond, edge.to))
        return out

    def _scorer(self, name: str):
        if name == "qa":
            from masrl.data.qa_scoring import exact_match, token_f1

            def qa(trace: Trace, task: Task) -> dict[str, float]:
                a = trace.final_answer
                f1 = token_f1(str(a), task.answer) if a else 0.0
                return {"outcome": f1, "f1": f1, "em": exact_match(str(a), task.answer) if a else 0.0}

            return qa
        if name == "math":
            from masrl.data.answers import answers_equivalent

            return lambda trace, task: {"outcome": float(trace.final_answer is not None and answers_equivalent(
                str(trace.final_answer), task.answer))}
        if ":" in name:
            from masrl.config.loading import load_object

            return load_object(name, "graph score")
        raise ConfigError(f"{self.where}: score '{name}' is unknown; use qa, math or 'module:function'")

    # -- the workflow ------------------------------------------------------------------------------
    def roles(self) -> dict[str, AgentRole]:
        return {n: AgentRole(n, self.parsers[n], a.description, a.max_new_tokens, tuple(a.stop))
                for n, a in self.spec.agents.items()}

    def tools(self, services) -> dict:
        from masrl.tools.base import Tool

        out = {}
        for name, factory in self.tool_factories.items():
            t = factory(services)
            out[name] = t if isinstance(t, Tool) else Tool.from_function(t, name=name)
        return out

    def _value(self, agent: str, call) -> dict[str, Any]:
        v = {f: call.parsed.get(f) for f in self.fields[agent]}
        v["text"] = call.completion
        return v

    async def _llm(self, node: LLMNode, c: dict, env: dict, ctx) -> dict[str, Any]:
        a = self.spec.agents[node.agent]

        def messages(local: dict) -> list[dict]:
            return few_shot(a.system, [tuple(x) for x in a.examples], c["prompt"].render(local))

        if c["foreach"] is None:
            env["calls"] += 1
            return self._value(node.agent, await ctx.call(node.agent, messages(env)))
        items = c["foreach"](env)
        if not isinstance(items, list):
            raise EvalError(f"foreach `{c['foreach'].source}` gave a {type(items).__name__}, not a list")
        room = self.spec.max_calls - env["calls"]
        if len(items) > room:  # the rest would pass max_calls: the task ends after the calls it may make
            items, env["call_limit_hit"] = items[:room], True
        env["calls"] += len(items)
        calls = await asyncio.gather(*[ctx.call(node.agent, messages({**env, "item": it, "index": i}))
                                       for i, it in enumerate(items)])
        values = [self._value(node.agent, call) for call in calls]
        return {k: [v[k] for v in values] for k in ["text", *self.fields[node.agent]]}

    async def _step(self, current: str, env: dict, ctx) -> str:
        """Run node ``current``; the node to run next."""
        node, c = self.spec.nodes[current], self.compiled[current]
        if isinstance(node, LLMNode):
            env[current] = await self._llm(node, c, env, ctx)
        else:
            args = {k: v(env) if isinstance(v, Expr) else v for k, v in c["args"].items()}
            res = await ctx.tool(node.tool, **args)
            env[current] = {"result": res.value, "ok": res.ok, "error": res.error, "args": args}
        env["steps"] += 1
        env["visits"][current] += 1
        return next((to for cond, to in c["edges"] if cond is None or cond(env)), "end")

    async def run(self, task: Task, ctx) -> None:
        env: dict[str, Any] = {"task": {"question": task.question, "answer": task.answer, "id": task.id,
                                        "meta": dict(task.meta)}, "visits": {n: 0 for n in self.spec.nodes}, "steps": 0,
                                        "calls": 0, "call_limit_hit": False}
        current, limit_hit = self.spec.start, False
        while current != "end":
            if env["steps"] >= self.spec.max_steps or env["call_limit_hit"] or (
                    env["calls"] >= self.spec.max_calls and isinstance(self.spec.nodes[current], LLMNode)):
                limit_hit = True
                break
            try:
                current = await self._step(current, env, ctx)
            except EvalError as exc:  # an expression failed on the values it met: this trace fails, saying where
                raise GraphRunError(f"{self.where}: nodes.{current}: {exc}") from None
        try:
            answer = self.answer(env)
        except Exception:  # the node it reads never ran (the step limit cut the graph short)
            answer = None
        ctx.finish(answer, graph_steps=env["steps"], step_limit_hit=limit_hit)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        out = dict(self.scorer(trace, task))
        out["step_limit_hit"] = float(bool(trace.state.get("step_limit_hit")))
        return out

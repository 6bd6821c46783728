"""A run config's tasks as verl trains on them, so that verl and masrl train on the same rows (issue 74, the
learning curves side by side).

``export_rows``: each task of a split as a row of verl's parquet layout (``data_source``, ``prompt``, ``ability``,
``reward_model: {style, ground_truth}``, ``extra_info``), its ``prompt`` the very chat messages masrl's workflow
sends its agent (the system prompt and few-shot examples included), found by running the workflow up to that call.
``compute_score``: verl's custom reward function (``custom_reward_function.path`` this file, ``.name``
``compute_score``): the completion verl sampled is put on a trace as that call's, the workflow finishes on it, and
the config's own rewards (outcome, format, ...) pay it: the reward masrl would have given. Single-call workflows
without tools only (a solver): verl's rollout samples one reply per prompt.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from masrl.data.tasks import Task
from masrl.errors import ConfigError
from masrl.trace import Call, Trace, new_id


class _FirstCall(Exception):
    def __init__(self, agent: str, messages: list[dict]):
        super().__init__(agent)
        self.agent, self.messages = agent, messages


class _Replay:
    """A ``Context`` whose first call answers ``completion`` (parsed by the agent's role) and that refuses any more
    calls or tools; with ``completion`` None, its first call ends the run (``_FirstCall``)."""

    train = False

    def __init__(self, task: Task, roles: dict, completion: str | None):
        self.trace = Trace(new_id("trace"), task.id, 0)
        self.state = self.trace.state
        self.roles, self.completion = roles, completion

    async def call(self, agent: str, messages: list[dict], **_: Any) -> Call:
        if self.completion is None:
            raise _FirstCall(agent, messages)
        if self.trace.calls:
            raise ConfigError(f"the workflow called agent '{agent}' after its first call; verl's rollout samples one "
                              f"reply per prompt, so only single-call workflows (a solver) can be exported to it")
        call = Call(new_id("call"), self.trace.trace_id, self.trace.task_id, 0, agent, "policy", 0, messages,
                    completion=self.completion)
        parsed = self.roles[agent].parser(self.completion)
        call.parsed, call.format_ok, call.format_score = parsed.fields, parsed.ok, parsed.score
        self.trace.calls.append(call)
        return call

    async def tool(self, name: str, **_: Any):
        raise ConfigError(f"the workflow runs tool '{name}'; verl's side of the comparison runs no masrl tools, so "
                          f"export a workflow without tools")

    async def model_tool(self, name: str, args: dict):
        await self.tool(name)

    def finish(self, answer: Any = None, **state: Any) -> None:
        self.trace.final_answer = answer
        self.state.update(state)


def _run(coro) -> None:
    """Run ``coro`` to its end from synchronous code, also when this thread already runs an event loop (a reward
    function called from an asynchronous reward manager): then on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result()


def first_call(workflow, task: Task) -> tuple[str, list[dict]]:
    """The agent the workflow calls first on ``task`` and the messages it sends it."""
    try:
        _run(workflow.run(task, _Replay(task, workflow.roles(), None)))
    except _FirstCall as first:
        return first.agent, first.messages
    raise ConfigError(f"the workflow called no model on task {task.id}; there is nothing for verl to sample")


def replayed(workflow, task: Task, completion: str) -> Trace:
    """The trace of ``workflow`` on ``task`` whose one call answered ``completion``."""
    ctx = _Replay(task, workflow.roles(), completion)
    _run(workflow.run(task, ctx))
    ctx.trace.metrics.update(workflow.score(ctx.trace, task))  # as the controller scores a finished episode
    return ctx.trace


def export_rows(config: str, overrides: list[str], split: str, n: int | None = None) -> list[dict]:
    """The tasks of ``split`` (train | eval) of the config as verl rows (``n``: the first n)."""
    cfg, plan, tasks = _run_of(config, tuple(overrides), split)
    source = getattr(cfg.data, split).source
    rows = []
    for i, task in enumerate(list(tasks.values())[:n]):
        _, messages = first_call(plan.workflow, task)
        rows.append({
            "data_source": source, "prompt": messages, "ability": cfg.workflow.name,
            "reward_model": {"style": "rule", "ground_truth": "" if task.answer is None else str(task.answer)},
            "extra_info": {"split": split, "index": i, "task_id": task.id, "masrl_config": str(config),
                           "masrl_overrides": list(overrides)},
        })
    return rows


@functools.lru_cache(maxsize=8)
def _run_of(config: str, overrides: tuple[str, ...], split: str):
    """The config, its checked plan and its split's tasks by id (in order), once per config (verl scores many rows)."""
    from masrl.config import load_config
    from masrl.driver.checks import check_run
    from masrl.families import build_tasks

    cfg = load_config(config, list(overrides))
    plan = check_run(cfg)
    train, evals = build_tasks(cfg)
    return cfg, plan, {t.id: t for t in (train if split == "train" else evals)}


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **_: Any):
    """verl's reward function: the reward masrl's config gives ``solution_str`` as the answer of the row's task."""
    from masrl.rewards.base import combine_all

    info = extra_info or {}
    if "masrl_config" not in info:
        raise ValueError("compute_score: the row's extra_info has no masrl_config; export the rows with "
                         "`masrl data export CONFIG --out FILE.parquet`")
    cfg, plan, tasks = _run_of(info["masrl_config"], tuple(info.get("masrl_overrides") or ()), info["split"])
    task = tasks[info["task_id"]]
    trace = replayed(plan.workflow, task, solution_str)
    scored = combine_all([(trace, task)], plan.allocators, cfg.rollout.reward_timeout_s)[0]
    if isinstance(scored, Exception):
        raise scored
    return float(scored[trace.calls[0].call_id])

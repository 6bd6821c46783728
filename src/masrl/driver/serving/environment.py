"""Any masrl run config served as an OpenEnv environment, so that other trainers (TRL's OpenEnv path, OpenEnv's own
clients, a verifiers taskset that steps it) train on masrl's worlds: the config's workflow runs on its tasks and
the client writes every model reply.

    from masrl.driver.serving.environment import TaskEnvironment, TaskAction
    env = TaskEnvironment("reasoning_gym/solver")      # a shipped config, or a path to any YAML; overrides=[...]
    obs = env.reset(seed=3)          # obs.messages: the chat the workflow's next call sends; obs.agent: whose call
    obs = env.step(TaskAction(message="... the answer is 42"))    # the workflow goes on; at its end, the reward

    # or over OpenEnv's HTTP server, for OpenEnv's clients (and verifiers' ``openenv`` taskset):
    masrl environment math/solver --port 8000

``reset(seed)`` draws the task ``seed`` of the config's held-out split (``split="train"``: its training tasks, as a
run has them; ``"all"``: the training tasks, then the held-out ones);
each observation is one call the workflow makes (a team's every agent in turn, a stepping agent's every step, a
game's every move), its tools run here as in training (the calculator, the sandbox, the search index); when the
workflow finishes, the observation is ``done`` and its reward is the episode's ``outcome`` as the family scores it
(``metadata``: every metric the workflow reports). Needs ``openenv-core`` (``pip install -e '.[openenv]'``).
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from masrl.config import load_config
from masrl.driver.checks import check_run
from masrl.driver.rollout.context import WorkflowContext
from masrl.driver.rollout.services import Services
from masrl.errors import ConfigError, InfraError
from masrl.trace import Trace, new_id

STEP_S = 600.0  # a workflow's tools (a sandbox run, a search) between two calls
_WORLDS: dict[tuple, tuple] = {}  # (config, split, overrides) -> its tasks, workflow, agents and tools


class TaskAction(Action):
    message: str = Field(description="the reply to the call the last observation showed")


class TaskObservation(Observation):
    prompt: str = Field(default="", description="the call's messages as text (the last one is what to answer)")
    messages: list[dict] = Field(default_factory=list, description="the call's chat messages, as the workflow sent")
    agent: str = Field(default="", description="the workflow's agent making this call (a team has several)")


def _as_text(messages: list[dict]) -> str:
    return "\n\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)


class TaskEnvironment(Environment[TaskAction, TaskObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, config: str = "math/solver", split: str = "eval", overrides: list[str] | None = None):
        super().__init__()
        from masrl.families import build_tasks, config_path

        if split not in ("eval", "train", "all"):
            raise ConfigError(f"split: 'eval' (the held-out tasks), 'train', or 'all' (the training tasks, then the "
                              f"held-out ones), not {split!r}")
        key = (str(config), split, tuple(overrides or ()))
        if key not in _WORLDS:  # one checked config, task list and workflow for every session of this process
            cfg = load_config(config_path(config), overrides)
            plan = check_run(cfg)
            train, held_out = build_tasks(cfg)  # as a run of this config has them: training never repeats held-out
            tasks = {"eval": held_out, "train": train, "all": train + held_out}[split]
            if not tasks:
                raise ConfigError(f"the config's {split} split has no tasks")
            tools = (plan.hooks.tools(Services(cfg.sandbox, cfg.retriever, cfg.data.world))
                     if plan.hooks.tools else {})
            _WORLDS[key] = (tasks, plan.workflow, plan.agents, tools)
        self.tasks, self.workflow, self.agents, self.tools = _WORLDS[key]
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True, name="masrl-task-env").start()
        self._events: asyncio.Queue | None = None
        self._reply: asyncio.Future | None = None
        self._episode: asyncio.Future | None = None
        self._state = State()

    # -- the workflow's side: its calls wait for the client's replies --------------------------------------------
    async def _submit(self, agent: str, gen) -> SimpleNamespace:
        self._reply = self._loop.create_future()
        await self._events.put(("call", agent, [dict(m) for m in gen.messages]))
        text = await self._reply
        return SimpleNamespace(text=text, n_prompt_tokens=0, n_completion_tokens=0, finish_reason="stop")

    async def _run(self, task) -> None:
        trace = Trace(trace_id=new_id("trace"), task_id=task.id, sample_idx=0)
        ctx = WorkflowContext(trace, self.agents, self._submit, train=False, call_timeout_s=1e9, tools=self.tools)
        try:
            await self.workflow.run(task, ctx)
            metrics = {k: float(v) for k, v in self.workflow.score(trace, task).items()}
        except InfraError as exc:  # a tool or the environment failed: the episode ends without a score
            await self._events.put(("error", str(exc), None))
            return
        await self._events.put(("done", metrics, trace.final_answer))

    async def _next(self) -> tuple:
        return await asyncio.wait_for(self._events.get(), STEP_S)

    def _wait(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _observe(self, event: tuple) -> TaskObservation:
        kind, a, b = event
        if kind == "call":
            return TaskObservation(prompt=_as_text(b), messages=b, agent=a, reward=0.0, done=False)
        if kind == "error":
            raise RuntimeError(f"the episode failed: {a}")
        return TaskObservation(prompt="The episode is over.", reward=a.get("outcome", 0.0), done=True,
                               metadata={"metrics": a, "answer": None if b is None else str(b)[:2000]})

    # -- OpenEnv's side ----------------------------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> TaskObservation:
        task = self.tasks[(0 if seed is None else int(seed)) % len(self.tasks)]
        self.close()

        async def start():
            self._events = asyncio.Queue()
            self._episode = asyncio.ensure_future(self._run(task))
            return await self._next()

        self._state = State(episode_id=episode_id, step_count=0)
        return self._observe(self._wait(start()))

    def step(self, action: TaskAction, timeout_s: Optional[float] = None, **kwargs: Any) -> TaskObservation:
        if self._reply is None or self._reply.done():
            raise RuntimeError("no call is waiting for a reply: reset() starts an episode")
        self._state.step_count += 1

        async def answer():
            self._reply.set_result(action.message)
            return await self._next()

        return self._observe(self._wait(answer()))

    def close(self) -> None:
        if self._episode is not None and not self._episode.done():
            self._loop.call_soon_threadsafe(self._episode.cancel)
        self._episode = self._reply = None

    @property
    def state(self) -> State:
        return self._state


def serve_environment(config: str, overrides: list[str] | None = None, *, split: str = "eval",
                      host: str = "127.0.0.1", port: int = 8000, max_sessions: int = 64) -> None:
    """``masrl environment CONFIG``: OpenEnv's HTTP server (fastapi, uvicorn) over ``TaskEnvironment``; the config is
    checked once here, so a bad one is refused before the server starts."""
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app

    TaskEnvironment(config, split, overrides).close()
    app = create_fastapi_app(lambda: TaskEnvironment(config, split, overrides), TaskAction, TaskObservation,
                             max_concurrent_envs=max_sessions)
    print(f"[masrl] {config} as an OpenEnv environment on http://{host}:{port} (reset(seed): task seed of the "
          f"{split} split)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")

"""OpenEnv environments, unchanged, as a workflow (``workflow: openenv``): masrl's agents are the actors.

    workflow:
      name: openenv
      options: {env: my_pkg.server:MyEnvironment}          # an openenv Environment subclass, in this process
      # or     {url: "http://127.0.0.1:8000", action_field: message}   # an OpenEnv server, over its own client
    data.train: {source: episodes, n: 2000, seed: 1}        # one episode per task, reset with its seed

Each task is one episode: ``reset(seed=...)``, then each turn the acting agent is called on the conversation so
far (a system prompt, each observation as a user message, its own replies), its reply becomes the environment's
action, and ``step`` answers with the next observation, a reward and whether the episode is done. Rewards are the
environment's own (its rubric, where it has one, sets them): every call is paid the rewards from its step to the end
(``credit``, so train with the ``credit`` reward), and ``outcome`` is the episode's total.

The action: the reply put in ``action_field`` of the environment's action class (its one required field when not
given; a reply that is a JSON object with the class's fields fills them instead); the class is the environment's
own (its ``Environment[Action, Observation, State]`` parameters, or ``action``). What the model sees:
``observation_field`` of the observation (by default the first of ``prompt``, ``text``, ``message``,
``observation``, ``board``, ``content`` it has, else its fields as JSON); ``messages_field``: an observation field
that holds the whole chat to send, as ``[{role, content}]`` (masrl's own worlds served by ``masrl environment``).
Several actors: ``agents`` lists them and ``actor_field`` names the observation field that says whose turn it is
(an agent's name or its index). A server takes ``max_sessions`` episodes at once (its ``max_concurrent_envs``;
OpenEnv's default is 1).

An action the environment refuses (a validation error, an exception in ``step``) fails that episode as
infrastructure and is counted (``rollout.max_failed_fraction`` stops the run). Needs ``openenv-core``
(``pip install -e '.[openenv]'``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing

from masrl.agents import AgentRole
from masrl.config.loading import load_object
from masrl.data.tasks import Task
from masrl.errors import ConfigError, InfraError
from masrl.parsing import ParseResult
from masrl.trace import Trace

TEXT_FIELDS = ("prompt", "text", "message", "observation", "board", "content")
HIDDEN = {"reward", "done", "metadata"}


def _library():
    try:
        from openenv.core.env_server import interfaces, types
    except ImportError as exc:
        raise ConfigError(f"workflow 'openenv' needs OpenEnv: pip install -e '.[openenv]' ({exc})") from None
    return interfaces, types


def _raw(text: str) -> ParseResult:
    return ParseResult(bool(text.strip()), 1.0 if text.strip() else 0.0, {"text": text.strip()}, [])


def _action_class(env_cls) -> type | None:
    """The action class of an ``Environment[Act, Obs, State]`` subclass, from its generic parameters."""
    interfaces, types = _library()
    for klass in inspect.getmro(env_cls):
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is interfaces.Environment:
                args = typing.get_args(base)
                if args and isinstance(args[0], type) and issubclass(args[0], types.Action):
                    return args[0]
    return None


def _environment(ref: str, options: dict):
    """The Environment subclass ``ref`` names, checked to build with ``options`` before any model loads."""
    interfaces, _ = _library()
    cls = load_object(ref, "workflow.options.env")
    if not (inspect.isclass(cls) and issubclass(cls, interfaces.Environment)):
        raise ConfigError(f"workflow.options.env: '{ref}' is not an openenv Environment subclass "
                          f"(openenv.core.env_server.interfaces.Environment)")
    try:
        cls(**options)
    except Exception as exc:
        raise ConfigError(f"workflow.options.env_options: {cls.__name__}(**env_options) failed: "
                          f"{type(exc).__name__}: {str(exc)[:300]}") from None
    return cls


def _action_field(action_cls, given: str | None) -> str:
    """The action's field that takes the reply: ``given`` (a field of the class), else its one required field."""
    if action_cls is not None:
        fields = set(action_cls.model_fields)
        if given is not None and given not in fields:
            raise ConfigError(f"workflow.options.action_field: '{given}' is not a field of {action_cls.__name__} "
                              f"(its fields: {', '.join(sorted(fields))})")
        given = given or _required_field(action_cls)
    if given is None:
        raise ConfigError("workflow.options.action_field: name the action's field that takes the model's reply"
                          + (f" ({action_cls.__name__} has no single required field)" if action_cls is not None
                             else " (a server's action class is not known here)"))
    return given


def _required_field(action_cls) -> str | None:
    req = [n for n, f in action_cls.model_fields.items() if f.is_required() and n != "metadata"]
    return req[0] if len(req) == 1 else None


class OpenEnvWorkflow:
    name = "openenv"

    def __init__(self, env: str | None = None, url: str | None = None, env_options: dict | None = None,
                 action: str | None = None, action_field: str | None = None, observation_field: str | None = None,
                 agents: list[str] | None = None, actor_field: str | None = None, system: str | None = None,
                 messages_field: str | None = None,
                 max_turns: int = 16, max_new_tokens: int = 128, timeout_s: float = 60.0, max_sessions: int = 1):
        if (env is None) == (url is None):
            raise ConfigError("workflow.options: give exactly one of env ('module:Class', an openenv Environment run "
                              "in this process) and url (an OpenEnv server, e.g. http://127.0.0.1:8000)")
        if not 1 <= max_turns <= 1000:
            raise ConfigError("workflow.options.max_turns: 1-1000 turns an episode")
        if not 1 <= max_sessions <= 4096:
            raise ConfigError("workflow.options.max_sessions: 1-4096 episodes at once on the server (its "
                              "max_concurrent_envs; OpenEnv's default is 1)")
        self.agents = list(agents or ["actor"])
        if len(self.agents) > 1 and not actor_field:
            raise ConfigError("workflow.options.actor_field: with several agents, name the observation field that "
                              "says whose turn it is (an agent's name or index)")
        self.url, self.env_options = url, dict(env_options or {})
        self.env_cls = _environment(env, self.env_options) if env is not None else None
        self.action_cls = load_object(action, "workflow.options.action") if action else (
            _action_class(self.env_cls) if self.env_cls is not None else None)
        self.action_field = _action_field(self.action_cls, action_field)
        self.observation_field, self.actor_field, self.messages_field = observation_field, actor_field, messages_field
        self.system = system or ("You act in an environment. Read the observation and reply with your action only.")
        self.max_turns, self.max_new_tokens, self.timeout_s = max_turns, max_new_tokens, timeout_s
        self.max_sessions, self._sessions = max_sessions, {}  # a semaphore per event loop

    def roles(self) -> dict[str, AgentRole]:
        return {a: AgentRole(a, _raw, "acts in the environment", self.max_new_tokens, ()) for a in self.agents}

    # -- one episode ------------------------------------------------------------------------------------------
    async def run(self, task: Task, ctx) -> None:
        seed = int(task.meta.get("seed", 0))
        if self.env_cls is not None:
            await self._episode(_Local(self), seed, ctx)
            return
        loop = asyncio.get_running_loop()
        gate = self._sessions.setdefault(id(loop), asyncio.Semaphore(self.max_sessions))
        async with gate:  # no more sessions at once than the server takes (max_sessions)
            await self._episode(_Remote(self), seed, ctx)

    async def _episode(self, session, seed: int, ctx) -> None:
        try:
            obs, reward, done = await session.reset(seed)
            rewards: list[float] = []
            history: dict[str, list[dict]] = {a: [] for a in self.agents}
            calls, turns = [], 0
            while not done:
                if turns >= self.max_turns:
                    break
                agent = self._actor(obs)
                if self.messages_field:  # the environment writes the whole chat (masrl's own, served)
                    call = await ctx.call(agent, self._messages(obs), turn=turns)
                else:
                    history[agent].append({"role": "user", "content": self._text(obs)})
                    call = await ctx.call(agent, [{"role": "system", "content": self.system}, *history[agent]],
                                          turn=turns)
                reply = (call.completion or "").strip()
                history[agent].append({"role": "assistant", "content": reply})
                obs, reward, done = await session.step(self._action(reply))
                calls.append(call)
                rewards.append(float(reward or 0.0))
                turns += 1
        finally:
            await session.close()
        for i, call in enumerate(calls):  # each call paid the rewards from its step to the end
            call.credit = sum(rewards[i:])
        ctx.state.update(rewards=rewards, turns=turns, done=bool(done))
        ctx.finish(self._text(obs)[-200:] if obs is not None else "")

    def _actor(self, obs: dict) -> str:
        if len(self.agents) == 1:
            return self.agents[0]
        who = obs.get(self.actor_field)
        if isinstance(who, int) and 0 <= who < len(self.agents):
            return self.agents[who]
        if str(who) in self.agents:
            return str(who)
        raise InfraError(f"the observation's {self.actor_field} is {who!r}: no agent of {self.agents} (name or index)")

    def _messages(self, obs: dict) -> list[dict]:
        msgs = obs.get(self.messages_field)
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs):
            raise InfraError(f"the observation's {self.messages_field} is not a list of chat messages "
                             f"({{role, content}}): {str(msgs)[:200]}")
        return [{"role": m["role"], "content": m["content"]} for m in msgs]

    def _text(self, obs: dict) -> str:
        if self.observation_field:
            return str(obs.get(self.observation_field, ""))
        for name in TEXT_FIELDS:
            if isinstance(obs.get(name), str):
                return obs[name]
        return json.dumps({k: v for k, v in obs.items() if k not in HIDDEN}, default=str)[:20_000]

    def _action(self, reply: str) -> dict:
        if self.action_cls is not None and reply.startswith("{"):
            try:
                obj = json.loads(reply)
                if isinstance(obj, dict) and obj and set(obj) <= set(self.action_cls.model_fields):
                    return obj
            except json.JSONDecodeError:
                pass
        return {self.action_field: reply}

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        rewards = trace.state.get("rewards") or []
        return {"outcome": float(sum(rewards)), "turns": float(trace.state.get("turns", 0)),
                "done": float(bool(trace.state.get("done")))}


class _Local:
    """An environment instance of this process for one episode (sync or async methods)."""

    def __init__(self, wf: OpenEnvWorkflow):
        self.wf, self.env = wf, wf.env_cls(**wf.env_options)

    async def _call(self, name: str, *args, **kwargs):
        try:
            fn = getattr(self.env, f"{name}_async", None)
            out = fn(*args, **kwargs) if fn is not None else getattr(self.env, name)(*args, **kwargs)
            return await out if inspect.isawaitable(out) else out
        except Exception as exc:
            raise InfraError(f"openenv {type(self.env).__name__}.{name} raised {type(exc).__name__}: "
                             f"{str(exc)[:300]}") from exc

    @staticmethod
    def _split(obs) -> tuple[dict, float | None, bool]:
        data = obs.model_dump() if hasattr(obs, "model_dump") else dict(obs)
        return data, data.get("reward"), bool(data.get("done"))

    async def reset(self, seed: int):
        return self._split(await self._call("reset", seed=seed))

    async def step(self, action: dict):
        try:
            act = self.wf.action_cls(**action) if self.wf.action_cls is not None else action
        except Exception as exc:  # pydantic's refusal of the reply as this action
            raise InfraError(f"the reply is not a valid {self.wf.action_cls.__name__}: {str(exc)[:300]}") from exc
        return self._split(await self._call("step", act))

    async def close(self) -> None:
        try:
            self.env.close()
        except Exception:  # the episode is over; its cleanup's failure is not the trace's
            pass


class _Remote:
    """One session of an OpenEnv server (its own WebSocket client, ``GenericEnvClient``)."""

    def __init__(self, wf: OpenEnvWorkflow):
        from openenv.core.generic_client import GenericEnvClient

        self.client = GenericEnvClient(base_url=wf.url, message_timeout_s=wf.timeout_s)

    async def _call(self, name: str, *args, **kwargs):
        try:
            return await getattr(self.client, name)(*args, **kwargs)
        except Exception as exc:
            raise InfraError(f"openenv server {name} failed: {type(exc).__name__}: {str(exc)[:300]}") from exc

    @staticmethod
    def _split(result) -> tuple[dict, float | None, bool]:
        obs = result.observation if isinstance(result.observation, dict) else {"observation": result.observation}
        return obs, result.reward, bool(result.done)

    async def reset(self, seed: int):
        return self._split(await self._call("reset", seed=seed))

    async def step(self, action: dict):
        return self._split(await self._call("step", action))

    async def close(self) -> None:
        try:
            await self.client.close()
        except Exception:
            pass

"""verifiers environments, unchanged, as a workflow (``workflow: verifiers``): masrl's agents play its seats.

    workflow:
      name: verifiers
      options:
        env: {taskset: {id: my_taskset}}        # verifiers' EnvConfig, as its CLI takes it (--env.*)
        seats: {agent: solver}                  # each seat of the env -> the masrl agent that plays it
        path: envs                              # where my_taskset.py is, if it is not installed
    data.train: {source: verifiers, n: 200, options: {env: {taskset: {id: my_taskset}}, path: envs, idx: "0:200"}}

verifiers 0.4 (``verifiers.v1``) runs an episode as its harness programs talking to an OpenAI-compatible
endpoint; here that endpoint is masrl's gateway (``docs/gateway.md``), so every model call of every seat
becomes a call on the episode's masrl trace, with the exact tokens sampled, and the environment's own
machinery (its harness, tools, ``run(task, agents)`` for several agents, its ``@reward`` functions and
judges) is what scores it. Each seat's reward pays its agent's calls (``credit``, so train with the
``credit`` reward or ``outcome``); ``outcome`` is the sum over seats; each reward function's score is kept on
the trace (``trace.state["rewards"]``).

verifiers pins ``openai<3`` and ``mcp==2.0.0``, so it runs in its own Python (``make verifiers`` builds
``.venv-verifiers``; ``python`` or ``MASRL_VERIFIERS_PYTHON`` names another): one runner process
(``verifiers_runner.py``) per run serves every episode. Seats run in verifiers' ``subprocess`` runtime unless
the env config pins another. An environment that cannot be built is refused before any model loads, with
verifiers' own message; an episode whose environment raises fails alone, as infrastructure, with its message
(``rollout.max_failed_fraction`` stops the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.errors import ConfigError, DataError, InfraError
from masrl.parsing import ParseResult
from masrl.trace import Trace

RUNNER = str(Path(__file__).with_name("verifiers_runner.py"))
VENV = ".venv-verifiers"
CHECK_S = 300.0  # loading an environment (imports, a dataset) before the run starts


def _raw(text: str) -> ParseResult:
    return ParseResult(True, 1.0, {"text": text}, [])


def verifiers_python(python: str | None = None) -> str:
    """The interpreter with verifiers installed: ``python``, else ``$MASRL_VERIFIERS_PYTHON``, else
    ``.venv-verifiers/bin/python`` where it exists, else the one running masrl."""
    chosen = python or os.environ.get("MASRL_VERIFIERS_PYTHON")
    if chosen:
        return chosen
    local = Path(VENV) / "bin" / "python"
    return str(local.absolute()) if local.exists() else sys.executable


def _runner_env(python: str) -> dict:
    # the seats' programs are run by uv (verifiers' runtimes), installed beside that Python
    return dict(os.environ, PATH=f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _ask(python: str, mode: str, config: dict, key: str) -> list[dict]:
    """Run the runner once (``check`` or ``list``); its JSON lines, or a ConfigError with its message."""
    try:
        out = subprocess.run([python, RUNNER, mode, json.dumps(config)], capture_output=True, text=True,
                             timeout=CHECK_S, env=_runner_env(python))
    except FileNotFoundError:
        raise ConfigError(f"{key}: no Python at {python!r} to run verifiers; `make verifiers` builds {VENV}, or "
                          f"set workflow.options.python / MASRL_VERIFIERS_PYTHON") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{key}: loading the verifiers environment took more than {CHECK_S:g}s") from None
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or not lines:
        said = next((x["error"] for x in lines if "error" in x), None)
        if said is None:
            tail = out.stderr.strip().splitlines()[-2:]
            said = " | ".join(tail) or f"exit status {out.returncode}"
            if "No module named 'verifiers'" in out.stderr:
                said = (f"verifiers is not installed for {python} (`make verifiers` builds {VENV}; or set "
                        f"workflow.options.python / MASRL_VERIFIERS_PYTHON)")
        raise ConfigError(f"{key}: the verifiers environment {json.dumps(config['env'])[:200]} could not be "
                          f"loaded: {said[:500]}")
    return lines


def _idx(text) -> tuple[int, int | None]:
    start, _, stop = str(text).partition(":")
    return int(start or 0), (int(stop) if stop else None)


def verifiers_tasks(spec) -> list[Task]:
    """``source: verifiers``: the taskset's tasks, unchanged (``options: {env: ..., idx: "0:100"}``, ``idx`` the
    split's range of them, as verifiers' ``--idx`` takes it); each task is its index into the taskset, its prompt
    the question (held-out prompts are kept out of training)."""
    options = dict(spec.options)
    start, stop = _idx(options.get("idx", "0:"))
    config = {"env": options.get("env") or {}, "limit": stop if stop is not None else options.get("limit"),
              "path": options.get("path")}
    rows = [r for r in _ask(verifiers_python(options.get("python")), "list", config, "data.options.env")
            if r["idx"] >= start]
    if not rows:
        raise DataError(f"source 'verifiers': the taskset has no tasks in idx {options.get('idx', '0:')}")
    tid = (config["env"].get("taskset") or {}).get("id", "taskset")
    return [Task(f"vf-{tid}-{r['idx']}", r["prompt"], None, {"vf_idx": r["idx"]}) for r in rows]


def check_source_options(options: dict, key: str) -> None:
    unknown = sorted(set(options) - {"env", "idx", "limit", "path", "python"})
    if unknown:
        raise ConfigError(f"{key}.options: source 'verifiers' takes env (verifiers' EnvConfig), idx, limit, path "
                          f"and python, not {', '.join(unknown)}")
    try:
        start, stop = _idx(options.get("idx", "0:"))
        assert start >= 0 and (stop is None or stop > start)
    except (ValueError, AssertionError):
        raise ConfigError(f"{key}.options.idx: a range of the taskset's tasks, 'start:stop' (e.g. '0:100'), not "
                          f"{options.get('idx')!r}") from None
    if not isinstance(options.get("env"), dict) or not isinstance(options["env"].get("taskset"), dict):
        raise ConfigError(f"{key}.options.env: verifiers' EnvConfig as a mapping, at least "
                          f"{{taskset: {{id: <taskset module>}}}}")


class VerifiersWorkflow:
    name = "verifiers"

    def __init__(self, env: dict, seats: dict[str, str] | None = None, python: str | None = None,
                 max_new_tokens: int = 256, timeout_s: float = 600.0, port: int = 0, limit: int | None = None,
                 path: str | None = None):
        if not isinstance(env, dict) or not isinstance(env.get("taskset"), dict) or not env["taskset"].get("id"):
            raise ConfigError("workflow.options.env: verifiers' EnvConfig as a mapping, at least "
                              "{taskset: {id: <taskset module>}}")
        self.python = verifiers_python(python)
        self.env = dict(env)
        self.path = path
        found = _ask(self.python, "check", {"env": self.env, "limit": limit, "path": path}, "workflow.options.env")[0]
        self.seats = dict(seats or {s: s for s in found["seats"]})
        missing = sorted(set(found["seats"]) - set(self.seats))
        unknown = sorted(set(self.seats) - set(found["seats"]))
        if missing or unknown:
            raise ConfigError(f"workflow.options.seats: the environment's seats are {', '.join(found['seats'])}"
                              + (f"; no agent for {', '.join(missing)}" if missing else "")
                              + (f"; it has no seat {', '.join(unknown)}" if unknown else ""))
        if len(set(self.seats.values())) != len(self.seats):
            raise ConfigError("workflow.options.seats: one agent per seat (two seats on one policy: two agents "
                              "mapped to that policy in the agents section)")
        self.n_tasks, self.limit = found["tasks"], limit
        self.max_new_tokens, self.timeout_s, self.port = max_new_tokens, timeout_s, port
        self._new_gateway = None
        self._loop = self._gateway = self._pid = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._stderr_tail = b""

    def roles(self) -> dict[str, AgentRole]:
        return {a: AgentRole(a, _raw, f"plays seat {s} of the verifiers environment", self.max_new_tokens, ())
                for s, a in self.seats.items()}

    def tools(self, services) -> dict:
        self._new_gateway = services.gateway
        return {}

    # -- the gateway and the runner, one of each per event loop ---------------------------------------------------
    async def _start(self):
        if self._new_gateway is None:
            raise RuntimeError("the verifiers workflow runs inside a masrl run (workflow.tools(services) was not "
                               "called)")
        gw = self._new_gateway(port=self.port)
        await gw.start()
        config = {"env": self.env, "models": dict(self.seats), "limit": self.limit, "path": self.path}
        proc = await asyncio.create_subprocess_exec(self.python, RUNNER, "serve", json.dumps(config),
                                                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, env=_runner_env(self.python),
                                                    limit=1 << 24, start_new_session=True)
        self._pid = proc.pid  # its own session: the runner and the seats' programs it started
        self._stderr_reader = asyncio.ensure_future(self._read_stderr(proc))
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), CHECK_S) or b"{}")
        if not first.get("ready"):
            raise InfraError(f"the verifiers runner did not start: {first.get('error') or self._tail()}")
        self._reader = asyncio.ensure_future(self._read_answers(proc))
        return gw, proc

    async def _started(self):
        loop = asyncio.get_running_loop()
        if self._gateway is None or self._loop is not loop:
            self._loop = loop
            self._gateway = asyncio.ensure_future(self._start())
        return await asyncio.shield(self._gateway)

    async def _read_stderr(self, proc) -> None:
        while chunk := await proc.stderr.read(1 << 16):
            self._stderr_tail = (self._stderr_tail + chunk)[-8192:]

    def _tail(self) -> str:
        return " | ".join(self._stderr_tail.decode(errors="replace").strip().splitlines()[-3:])

    async def _read_answers(self, proc) -> None:
        while line := await proc.stdout.readline():
            with contextlib.suppress(json.JSONDecodeError):
                answer = json.loads(line)
                fut = self._waiting.pop(answer.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(answer)
        for fut in self._waiting.values():  # the runner is gone: every episode waiting on it fails
            if not fut.done():
                fut.set_exception(InfraError(f"the verifiers runner exited: {self._tail()}"))
        self._waiting.clear()

    async def aclose(self) -> None:
        if self._gateway is None:
            return
        if self._loop is not asyncio.get_running_loop():  # started on a loop that is gone: stop its runner all the same
            if self._pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._pid, signal.SIGKILL)
            self._gateway = self._loop = self._pid = None
            return
        with contextlib.suppress(Exception):
            gw, proc = await self._gateway
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            await gw.stop()
        self._gateway = self._loop = self._pid = None

    # -- one episode ------------------------------------------------------------------------------------------
    async def run(self, task: Task, ctx) -> None:
        idx = task.meta.get("vf_idx")
        if not isinstance(idx, int) or not 0 <= idx < self.n_tasks:
            raise InfraError(f"task {task.id} is not a task of this verifiers taskset (data source 'verifiers' "
                             f"gives them; it has {self.n_tasks})")
        gw, proc = await self._started()
        rid, base_url = gw.open(ctx)
        job = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[job] = fut
        try:
            proc.stdin.write((json.dumps({"id": job, "idx": idx, "base_url": base_url,
                                          "model": next(iter(self.seats.values()))}) + "\n").encode())
            await proc.stdin.drain()
            answer = await asyncio.wait_for(fut, self.timeout_s)
        except asyncio.TimeoutError:
            raise InfraError(f"the verifiers episode of task {task.id} did not finish within {self.timeout_s:g}s "
                             f"(workflow.options.timeout_s)") from None
        finally:
            self._waiting.pop(job, None)
            errors = gw.finish(rid)
        if errors:
            raise InfraError(f"a model call of the verifiers episode failed: {errors[0]}")
        if not answer.get("ok"):
            raise InfraError("the verifiers episode failed: " + "; ".join(answer.get("errors") or ["no reason given"])[:600])
        by_agent = {self.seats[s]: float(r) for s, r in answer["seats"].items() if s in self.seats}
        for call in ctx.trace.calls:  # each seat's reward pays its agent's calls
            call.credit = by_agent.get(call.agent, 0.0)
        ctx.state.update(seat_rewards=answer["seats"], rewards=answer.get("rewards", {}), tools=answer.get("tools", []))
        ctx.finish(json.dumps(answer["seats"]))

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        return {"outcome": float(sum((trace.state.get("seat_rewards") or {}).values()))}

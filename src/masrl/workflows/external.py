"""Train an agent team written outside masrl, unchanged: ``workflow: {name: external, ...}``.

For each task sample masrl opens an episode on its OpenAI-compatible gateway (``driver.serving.gateway``,
handed to this workflow by the run's services)
and hands the episode's base URL to your program, which talks to it as to any OpenAI server:

- ``agent: "pkg.module:run"``: masrl calls ``run(task, base_url)`` (sync, in a thread, or async),
  with ``task = {"id", "question"}``; its return value is the final answer;
- ``command: ["python", "my_team.py"]``: masrl runs it with ``OPENAI_BASE_URL`` and
  ``OPENAI_API_KEY`` set and the task in ``MASRL_TASK`` (JSON); the last line it prints is the
  answer (or a JSON object's ``answer``). A leading ``python`` is the interpreter running masrl.

Either may instead post its answer: ``POST <base_url>/answer`` with ``{"answer": ...}``.

Each request names its agent as ``model`` (one of ``agents``); every request becomes a call on
the episode's trace, with the exact tokens sampled, so the usual rewards, per-policy groups and
updates follow. ``score``: ``math`` (the answer is the gold number), ``exact``, ``contains``,
``'module:function'`` (``f(answer, task) -> float``), or ``posted``: the program posts the outcome
itself (``POST <base_url>/rewards`` with ``{"reward": r}``; ``{"id": <a response's id>, "reward": r}``
posts a call's credit, paid by the ``credit`` reward, with any scorer). A program that raises,
hangs past ``timeout_s`` or meets a failed model call has its trace dropped as infrastructure and
counted (``rollout.max_failed_fraction`` stops the run); the answer is never made up.

A command's output is read in chunks as it comes: the last ``KEEP_OUT`` bytes of its stdout (where the
answer is) and ``KEEP_ERR`` of its stderr are kept, and a program that writes more than ``max_output_mb``
in all is stopped, with every process it started, and its trace fails (four programs writing 360 MB
each once took the driver to 2.5 GB).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from masrl.agents import AgentRole
from masrl.config.loading import load_object
from masrl.data.answers import answers_equivalent
from masrl.data.tasks import Task
from masrl.errors import ConfigError, InfraError
from masrl.parsing import ParseResult
from masrl.trace import Trace

CHUNK = 64 * 1024
KEEP_OUT = 1 << 20  # bytes of a command's stdout kept: its last line is the answer
KEEP_ERR = 64 * 1024  # of its stderr: the end says why it failed
STOP_S = 10.0  # a killed command's pipes are read this long before they are closed by force


def parse_raw(text: str) -> ParseResult:
    """An outside agent's output is whatever it wrote; its program reads it."""
    return ParseResult(ok=True, score=1.0, fields={"text": text})


SCORERS = ("math", "exact", "contains", "posted")


class External:
    name = "external"

    def __init__(self, agents: list[str], agent: str | None = None, command: list[str] | str | None = None,
                 score: str = "math", timeout_s: float = 600.0, max_new_tokens: int = 256, api_key: str | None = None,
                 port: int = 0, max_output_mb: float = 64.0):
        if not 0 < max_output_mb <= 4096:
            raise ValueError("max_output_mb: a command's output in MB, more than 0 and at most 4096")
        self.max_output = int(max_output_mb * 2**20)
        if (agent is None) == (command is None):
            raise ValueError("give exactly one of agent ('pkg.module:function', called with the task and a base URL) "
                             "and command (a program run with OPENAI_BASE_URL set)")
        if not agents:
            raise ValueError("agents: list the names your program sends as `model` (each maps to a policy in the "
                             "config's agents section)")
        if score not in SCORERS and ":" not in score:
            raise ValueError(f"score: {score!r} is not one of {', '.join(SCORERS)} or 'module:function'")
        self.agent_names = list(agents)
        self.fn = load_object(agent, "workflow.options.agent") if agent else None
        if self.fn is not None and not callable(self.fn):
            raise ConfigError(f"workflow.options.agent: '{agent}' is not a function")
        command = [command] if isinstance(command, str) else command
        if command and command[0] in ("python", "python3"):  # the interpreter running masrl: the same environment
            command = [sys.executable, *command[1:]]
        self.command = command
        self.scorer = load_object(score, "workflow.options.score") if ":" in score else score
        self.timeout_s, self.max_new_tokens, self.api_key, self.port = timeout_s, max_new_tokens, api_key, port
        self._gateway = self._gateway_loop = None  # a task that starts the gateway, and its loop
        self._new_gateway = None  # the run's gateway factory (services.gateway), given by tools()
        self._pool: ThreadPoolExecutor | None = None  # for a synchronous agent function

    def roles(self) -> dict[str, AgentRole]:
        return {a: AgentRole(a, parse_raw, "an agent of the outside program", self.max_new_tokens, ())
                for a in self.agent_names}

    async def gateway(self):
        """The gateway of this event loop: started once, by the first episode (the others await
        the same start); a new event loop gets a new one."""
        loop = asyncio.get_running_loop()
        if self._gateway is None or self._gateway_loop is not loop:
            self._gateway_loop = loop
            self._gateway = asyncio.ensure_future(self._start_gateway())
        return await asyncio.shield(self._gateway)

    def tools(self, services) -> dict:
        """No tools for the model; the run's services give the gateway the outside program talks to."""
        self._new_gateway = services.gateway
        return {}

    async def _start_gateway(self):
        if self._new_gateway is None:
            raise RuntimeError("the external workflow runs inside a masrl run: its gateway comes from the run's "
                               "services (workflow.tools(services) was not called)")
        gw = self._new_gateway(port=self.port, api_key=self.api_key)
        await gw.start()
        return gw

    async def aclose(self) -> None:
        if self._gateway is not None and self._gateway_loop is asyncio.get_running_loop():
            await (await self._gateway).stop()
        self._gateway = self._gateway_loop = None

    async def run(self, task: Task, ctx) -> None:
        gw = await self.gateway()
        rid, base_url = gw.open(ctx)
        try:
            answer = await asyncio.wait_for(self._invoke(task, base_url), self.timeout_s)
        except asyncio.TimeoutError:
            raise InfraError(f"the outside agent did not finish task {task.id} within {self.timeout_s:g}s "
                             f"(workflow.options.timeout_s)") from None
        except InfraError:
            raise
        except Exception as exc:  # the user's program failed: its trace is dropped, never scored
            raise InfraError(f"the outside agent raised {type(exc).__name__}: {exc}") from exc
        finally:
            errors = gw.finish(rid)
        if errors:
            raise InfraError(f"a model call of the outside agent failed: {errors[0]}")
        answer = ctx.trace.state.get("posted_answer", answer)  # a posted answer wins over what was returned
        if self.scorer == "posted" and "posted_outcome" not in ctx.trace.state:
            raise InfraError(f"the outside agent finished task {task.id} without posting its reward "
                             f"(score: posted; POST {{\"reward\": r}} to the episode's base URL + /rewards)")
        ctx.finish(answer)

    async def _invoke(self, task: Task, base_url: str):
        view = {"id": task.id, "question": task.question}
        if self.fn is None:
            return await self._run_command(view, base_url)
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(view, base_url)
        # threads of its own: a blocking client waits on the gateway, whose batchers need the default
        # executor's threads to run the model; sharing them would deadlock once every thread waits
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="masrl-external")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.fn, view, base_url)

    async def _run_command(self, view: dict, base_url: str):
        env = dict(os.environ, OPENAI_BASE_URL=base_url, OPENAI_API_KEY=self.api_key or "masrl",
                   MASRL_TASK=json.dumps(view))
        proc = await asyncio.create_subprocess_exec(*self.command, env=env, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, start_new_session=True)
        seen = [0]
        readers = [asyncio.ensure_future(self._tail(proc.stdout, KEEP_OUT, seen)),
                   asyncio.ensure_future(self._tail(proc.stderr, KEEP_ERR, seen))]
        try:
            out, err = await asyncio.gather(*readers)
            await proc.wait()
        except BaseException:  # cancelled (the trace's time limit), or it wrote past its cap
            for r in readers:
                r.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await asyncio.shield(_stop(proc))
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise InfraError(f"the outside agent {self.command[0]} exited with status {proc.returncode}: "
                             + " | ".join(tail))
        lines = [x for x in out.decode(errors="replace").splitlines() if x.strip()]
        last = lines[-1].strip() if lines else ""
        try:
            obj = json.loads(last)
            return obj.get("answer") if isinstance(obj, dict) else last
        except json.JSONDecodeError:
            return last

    async def _tail(self, stream, keep: int, seen: list[int]) -> bytes:
        """The last ``keep`` bytes ``stream`` gives, read in chunks; past ``max_output`` bytes on both streams
        together, ``InfraError``."""
        tail = b""
        while chunk := await stream.read(CHUNK):
            seen[0] += len(chunk)
            if seen[0] > self.max_output:
                raise InfraError(f"the outside agent {self.command[0]} wrote more than {self.max_output / 2**20:g} MB "
                                 f"(workflow.options.max_output_mb); it was stopped")
            tail = (tail + chunk)[-keep:]
        return tail

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        if self.scorer == "posted":
            return {"outcome": float(trace.state["posted_outcome"])}
        answer = trace.final_answer
        if callable(self.scorer):
            return {"outcome": float(self.scorer(answer, task))}
        if answer is None:
            return {"outcome": 0.0}
        text, gold = str(answer).strip(), task.answer
        golds = gold if isinstance(gold, (list, tuple)) else [gold]
        if self.scorer == "math":
            ok = answers_equivalent(text, gold)
        elif self.scorer == "exact":
            ok = any(text.lower() == str(g).strip().lower() for g in golds)
        else:
            ok = any(str(g).strip().lower() in text.lower() for g in golds)
        return {"outcome": 1.0 if ok else 0.0}



async def _stop(proc) -> None:
    """Kill a command and every process it started (its own session), then read what they left in the pipes:
    ``wait()`` returns only once both pipes close, and a pipe whose reader stopped reading stays paused, never
    closing. A pipe still open after that (a process that left the session) is closed by force."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)

    async def drain(stream):
        while await stream.read(CHUNK):
            pass
    try:
        await asyncio.wait_for(asyncio.gather(drain(proc.stdout), drain(proc.stderr), proc.wait()), STOP_S)
    except asyncio.TimeoutError:
        proc._transport.close()  # no public way to drop the pipes of a process that keeps them open

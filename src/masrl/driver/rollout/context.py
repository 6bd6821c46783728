"""WorkflowContext: what a running workflow sees. ``call`` an agent, use a ``tool``, ``finish``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from masrl.agents import AgentSpec
from masrl.errors import InfraError, PromptError, ToolError  # noqa: F401 - InfraError: workflows import it here
from masrl.messages import GenCall
from masrl.seeding import stable_seed
from masrl.tools.base import Tool, ToolInfraError, ToolResult, run_tool
from masrl.trace import Call, ToolCall, Trace, new_id

Submit = Callable[[str, GenCall], Awaitable[Any]]


def _limited(sampling, limit: dict | None):
    """The agent's sampling with a request's ``max_new_tokens`` (never above the agent's) and ``stop``."""
    if not limit:
        return sampling
    update = {}
    if limit.get("max_new_tokens"):
        update["max_new_tokens"] = min(int(limit["max_new_tokens"]), sampling.max_new_tokens)
    if limit.get("stop"):
        update["stop"] = tuple(dict.fromkeys([*(sampling.stop or ()), *limit["stop"]]))
    return sampling.model_copy(update=update) if update else sampling


@dataclass(frozen=True)
class Branch:
    """Re-run a trace from its call ``at`` (counterfactual credit): the calls before it are the
    recorded ones, replayed without sampling; call ``at`` is sampled anew with alternative
    ``alt``'s seed; the calls after it are sampled as usual. Nothing a branch samples trains."""

    replay: tuple  # the recorded trace's calls
    at: int
    alt: int


class WorkflowContext:
    """One episode's context (``workflows.base.Context``): its calls go through ``submit`` to the
    batchers, its tools run off the event loop, and both are recorded on the trace."""

    def __init__(
        self,
        trace: Trace,
        agents: dict[str, AgentSpec],
        submit: Submit,
        *,
        admit: Callable[[], Awaitable[None]] | None = None,
        train: bool,
        call_timeout_s: float,
        tools: dict[str, Callable] | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        branch: Branch | None = None,
    ):
        self.trace = trace
        self.agents = agents
        self._submit = submit
        self._admit = admit  # awaited before a recorded call's timeout starts (the controller may hold training)
        self.train = train
        self.call_timeout_s = call_timeout_s
        self.tools = {k: v if isinstance(v, Tool) else Tool.from_function(v, name=k) for k, v in (tools or {}).items()}
        self.temperature = temperature  # eval override
        self.top_p: float | None = None  # a served request's own (masrl serve)
        self.seed = seed  # the trace's sampling seed; each call's derives from it, its agent and turn
        self.branch = branch
        self.state = trace.state

    async def call(self, agent: str, messages: list[dict[str, str]], *, turn: int | None = None,
                   tools: list[str] | None = None, tool_specs: list[dict] | None = None,
                   limit: dict | None = None, extends: str | None = None, logprobs: int | None = None,
                   state: str | None = None) -> Call:
        """Call ``agent`` on ``messages``. ``tools``: names of this workflow's tools the model may
        call itself (rendered through the chat template's ``tools=`` or masrl's tag format; read
        its calls with ``tools.calls.parse_tool_calls`` and run them with ``model_tool``).
        ``tool_specs``: JSON function specs given as they are (a request through the gateway).
        ``limit``: ``max_new_tokens`` no larger than the agent's own, and ``stop`` strings added to
        the agent's (what an outside program may ask for without changing what is trained).
        ``extends``: an earlier call these messages continue (its messages, its completion, more);
        the worker then reuses that call's exact prompt and sampled ids instead of re-tokenising.
        ``logprobs``: the sampled tokens' logprobs back on the call (``token_logprobs``), with the k
        likeliest tokens at each position when k > 0. ``state``: a name for the situation the call answers (a
        game's position), so that ``algorithm.group_key: [agent, state]`` compares the moves made from one
        position across every game of the step (a turn-level baseline). A prompt that cannot be run (``PromptError``:
        it does not tokenise, or does not fit) fails this call alone and leaves no call on the trace."""
        spec = self.agents.get(agent)
        if spec is None:
            raise KeyError(f"the workflow called agent '{agent}', which the config does not define under `agents` "
                           f"(defined: {', '.join(self.agents)})")
        t = self.trace
        index = len(t.calls)
        if self.branch is not None and index < self.branch.at:
            return self._replayed(index, agent)
        call = Call(
            call_id=new_id("call"), trace_id=t.trace_id, task_id=t.task_id, sample_idx=t.sample_idx, agent=agent,
            policy=spec.policy, turn=len(t.calls) if turn is None else turn, messages=messages,
            trainable=self.train and spec.trainable, state=state,
        )
        t.calls.append(call)
        sampling = _limited(spec.sampling, limit)
        if self.temperature is not None or self.top_p is not None:  # eval's (or a served request's) override
            update = {"temperature": self.temperature, "top_p": 1.0} if self.temperature is not None else {}
            if self.top_p is not None:
                update["top_p"] = self.top_p
            sampling = sampling.model_copy(update=update)
        gen = GenCall(
            call_id=call.call_id, policy=spec.policy, messages=messages, sampling=sampling, record=call.trainable,
            template_kwargs=spec.template_kwargs, tools=self._specs(tools) + list(tool_specs or []),
            seed=self._call_seed(agent, call.turn, index), extends=extends, logprobs=logprobs,
            key={"task_id": t.task_id, "agent": agent, "turn": call.turn, "sample_idx": t.sample_idx, "trace_id": t.trace_id,
                 "state": state},
        )
        try:
            if self._admit is not None and gen.record:
                await self._admit()
            res = await asyncio.wait_for(self._submit(agent, gen), self.call_timeout_s)
        except (asyncio.CancelledError, PromptError):  # the caller went away, or the prompt cannot run:
            t.calls.remove(call)                        # no call was made
            raise
        except asyncio.TimeoutError:
            raise InfraError(f"call to agent '{agent}' timed out after {self.call_timeout_s:g}s (rollout.call_timeout_s; "
                             f"for long prompts on a slow device raise it, or lower rollout.max_batch_size)") from None
        except InfraError:
            raise
        except Exception as exc:
            raise InfraError(f"call to agent '{agent}' failed in the engine: {type(exc).__name__}: {exc}") from exc
        call.completion = res.text
        call.n_prompt_tokens = res.n_prompt_tokens
        call.n_completion_tokens = res.n_completion_tokens
        call.finish_reason = res.finish_reason
        call.policy_version = getattr(res, "version", 0)
        call.token_logprobs = getattr(res, "logprobs", None)
        parsed = spec.parser(res.text)
        call.parsed = parsed.fields
        call.format_ok = parsed.ok
        call.format_score = parsed.score
        return call

    def _call_seed(self, agent: str, turn: int, index: int) -> int | None:
        if self.seed is None:
            return None
        seed = stable_seed(self.seed, agent, turn)
        if self.branch is not None and index == self.branch.at:  # the alternative sample of the branched call
            seed = stable_seed(seed, "counterfactual", self.branch.alt)
        return seed

    def _replayed(self, index: int, agent: str) -> Call:
        """The recorded call ``index`` again, under this trace (a branch's prefix is not sampled)."""
        rec = self.branch.replay[index]
        if rec.agent != agent:  # the workflow did not repeat itself on the same outputs
            raise InfraError(f"counterfactual replay diverged at call {index}: the workflow called '{agent}' where "
                             f"the recorded trace had '{rec.agent}'")
        call = dataclasses.replace(rec, call_id=new_id("call"), trace_id=self.trace.trace_id, trainable=False,
                                   reward=None, reward_parts={}, advantage=None, credit=None, counterfactual=None,
                                   turn_score=None)
        self.trace.calls.append(call)
        return call

    def _specs(self, names: list[str] | None) -> list[dict]:
        unknown = [n for n in names or [] if n not in self.tools]
        if unknown:
            raise KeyError(f"the workflow offered tool(s) {', '.join(unknown)} to a model, but provides only "
                           f"{', '.join(self.tools) or 'none'}")
        return [self.tools[n].spec() for n in names or []]

    async def tool(self, name: str, **args: Any) -> ToolResult:
        """Run tool ``name``. A failure the model caused (bad arguments, a failing program) comes
        back as ``ToolResult(ok=False, error=...)``; an infrastructure failure raises ToolError
        (the trace is dropped). Every call is recorded on the trace in order."""
        t = self.tools.get(name)
        if t is None:
            raise KeyError(f"the workflow used tool '{name}', which it does not provide "
                           f"(tools: {', '.join(self.tools) or 'none'})")
        return await self._run(t, name, args)

    async def model_tool(self, name: str, args: dict) -> ToolResult:
        """Run a tool call the model wrote: an unknown name is the model's mistake, returned as a result."""
        t = self.tools.get(name)
        if t is None:
            rec = self._record(name, args)
            rec.error = f"unknown tool '{name}' (available: {', '.join(self.tools) or 'none'})"
            return ToolResult(False, error=rec.error)
        return await self._run(t, name, args)

    def _record(self, name: str, args: dict) -> ToolCall:
        rec = ToolCall(trace_id=self.trace.trace_id, name=name, args=args, turn=len(self.trace.calls))
        self.trace.tool_calls.append(rec)
        return rec

    async def _run(self, t: Tool, name: str, args: dict) -> ToolResult:
        rec = self._record(name, args)
        t0 = time.perf_counter()
        try:
            res = await run_tool(t, args)
        except ToolInfraError as exc:
            rec.error, rec.infra = str(exc), True
            raise ToolError(str(exc)) from exc
        finally:
            rec.duration_s = time.perf_counter() - t0
        rec.result, rec.error = res.value, res.error
        return res

    def finish(self, answer: Any = None, **state: Any) -> None:
        self.trace.final_answer = answer
        self.trace.state.update(state)

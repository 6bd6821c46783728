"""Test helpers importable as 'helpers:...' from configs (tests/ is on sys.path)."""

from __future__ import annotations

import contextlib
import threading
import zlib
from dataclasses import dataclass

from masrl.trace import RewardAssignment


@dataclass
class TextHashReward:
    """A meaningless but deterministic reward with variance: a hash of the completion text.

    Random tiny models never produce the tag format, so real rewards are all zero and nothing
    trains; tests that need a gradient use this instead.
    """

    weight: float = 1.0
    agents: tuple[str, ...] | None = None
    name: str = "text_hash"

    def allocate(self, trace, task):
        out = []
        for c in trace.calls:
            if self.agents is None or c.agent in self.agents:
                out.append(RewardAssignment(c.call_id, self.weight * (zlib.crc32(c.completion.encode()) % 97) / 97.0, self.name))
        return out


def agent_hash_reward(weight: float = 1.0, agents: list[str] | None = None):
    return TextHashReward(weight=weight, agents=tuple(agents) if agents else None)


@dataclass
class TaskTextHashReward:
    """Like TextHashReward, but also hashes the task id: identical completions of different tasks
    (a greedy random model repeats itself) still get different rewards, so groups have variance."""

    weight: float = 1.0
    name: str = "task_text_hash"

    def allocate(self, trace, task):
        return [RewardAssignment(c.call_id, self.weight * (zlib.crc32(f"{task.id}|{c.completion}".encode()) % 97) / 97.0,
                                 self.name) for c in trace.calls]


def task_hash_reward(weight: float = 1.0):
    return TaskTextHashReward(weight=weight)


def full_logprobs(model, prompt, completion, temperature=1.0):
    """Reference: logprobs of ``completion`` after ``prompt`` from one plain forward of ``model``."""
    import torch

    ids = torch.tensor([list(prompt) + list(completion)], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    comp = torch.tensor(list(completion), device=model.device)
    return torch.log_softmax(logits / t, -1).gather(-1, comp[:, None]).squeeze(-1).cpu()


def adapter_logprobs(peft_model, adapter, prompt, completion, temperature=0.0):
    """``full_logprobs`` under one LoRA adapter of a PEFT model (None: the base, adapters off)."""
    if adapter is None:
        with peft_model.disable_adapter():
            return full_logprobs(peft_model, prompt, completion, temperature)
    peft_model.set_adapter(adapter)
    return full_logprobs(peft_model, prompt, completion, temperature)


def centered_advantage(batch, scale: float = 1.0):
    """A user's advantage estimator (used from a config as 'helpers:centered_advantage'):
    the reward minus the batch mean, scaled."""
    return (batch.rewards - batch.rewards.mean()) * scale


@dataclass
class HalfFlatReward:
    """Tasks whose id hashes even get one reward for every call (flat: no advantage anywhere);
    the others their sample's index plus a text hash below 1 (groups whose samples always differ: a
    hash alone gave two samples equal rewards one time in 97). For dynamic sampling's tests."""

    weight: float = 1.0
    name: str = "half_flat"

    def allocate(self, trace, task):
        flat = is_flat_task(task.id)
        return [RewardAssignment(c.call_id, 0.5 if flat else trace.sample_idx + (zlib.crc32(
            f"{task.id}|{c.completion}|{c.call_id}".encode()) % 97) / 97.0, self.name) for c in trace.calls]


def is_flat_task(task_id: str) -> bool:
    return zlib.crc32(task_id.encode()) % 2 == 0


def half_flat_reward(weight: float = 1.0):
    return HalfFlatReward(weight=weight)


@contextlib.contextmanager
def update_held_open(worker, timeout_s: float = 60):
    """Run ``worker.train_step(keep_pending=True)`` in a thread and hold it open once its update has
    run: the block runs inside the update. Yields a dict that holds the step's metrics under ``m``
    after the block (the update is released and joined on leaving it)."""
    inside, release, got = threading.Event(), threading.Event(), {}
    real = worker.updater.update

    def held(*a, **k):
        m = real(*a, **k)
        inside.set()
        assert release.wait(timeout_s)
        return m

    def step():
        try:
            got["m"] = worker.train_step(keep_pending=True)
        except BaseException as e:  # the update failed before it was held: say so now, not at the timeout
            got["error"] = e
            inside.set()

    worker.updater.update = held
    th = threading.Thread(target=step)
    th.start()
    try:
        assert inside.wait(timeout_s), f"the update did not run within {timeout_s} s"
        if "error" in got:
            raise AssertionError(f"the held update failed: {got['error']!r}") from got["error"]
        yield got
    finally:
        release.set()
        th.join(timeout_s)
        worker.updater.update = real


def word_sums(spec):
    """A user's own task source (``data.train.source: helpers:word_sums``): rows as dicts, read as
    math rows (any field alias works), with the offset from ``options``; one ready-made Task too."""
    from masrl.data.tasks import Task

    offset = spec.options.get("offset", 0)
    for i in range(spec.n or 10):
        a, b = spec.seed + i, offset + 2 * i
        yield {"problem": f"Ada has {a} apples and gets {b} more. How many apples does she have?", "answer": str(a + b),
               "uid": f"sum-{spec.seed}-{i}"}
    yield Task("ready-made", "What is 2 + 2?", "4")


def broken_rows(spec):
    """A source whose second row has no answer (the error must name it)."""
    return [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "What is 2 + 2?"}]


class ScriptedEngine:
    """An engine that answers each agent's calls with its next scripted text (workflow tests)."""

    def __init__(self, outputs: dict[str, list[str]]):
        self.outputs = {k: list(v) for k, v in outputs.items()}
        self.seen = []

    async def __call__(self, agent, gen):
        from types import SimpleNamespace

        self.seen.append((agent, gen))
        return SimpleNamespace(text=self.outputs[agent].pop(0), n_prompt_tokens=10, n_completion_tokens=5,
                               finish_reason="stop")


def run_scripted(wf, task, outputs: dict[str, list[str]], tools: dict | None = None, trace=None):
    """Run workflow ``wf`` on ``task`` with scripted completions; returns the scored trace and the engine."""
    import asyncio

    from masrl.agents import AgentSpec
    from masrl.driver.rollout.context import WorkflowContext
    from masrl.trace import Trace

    trace = trace or Trace("t", task.id, 0)
    engine = ScriptedEngine(outputs)
    agents = {n: AgentSpec(n, "p", r.parser) for n, r in wf.roles().items()}
    ctx = WorkflowContext(trace, agents, engine, train=True, call_timeout_s=30, tools=tools or {})
    asyncio.run(wf.run(task, ctx))
    trace.metrics.update(wf.score(trace, task))
    return trace, engine

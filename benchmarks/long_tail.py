"""A multi-turn workload with a long tail, for benchmarks/bench_async.py: each episode makes 1 to
``max_turns`` calls of one agent, the count drawn per episode from a geometric law (half stop after
one turn, a few run to the cap), each turn continuing the conversation. A synchronous step waits for
its longest episode; the asynchronous loop does not. With ``long_every`` = k > 0 the calls differ in
length too, as agents' answers do: one call in k (drawn per episode and turn) may run to the agent's
``max_new_tokens``, the others to an eighth of it, so a batch holds short calls beside long ones."""

from __future__ import annotations

import random

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.parsing import ParseResult
from masrl.trace import Trace


def _text(out: str) -> ParseResult:
    return ParseResult(ok=True, score=1.0, fields={"text": out})


class LongTail:
    name = "long_tail"

    def __init__(self, max_turns: int = 8, p_stop: float = 0.5, long_every: int = 0):
        self.max_turns, self.p_stop, self.long_every = max_turns, p_stop, long_every

    def roles(self) -> dict[str, AgentRole]:
        return {"agent": AgentRole("agent", _text, "works on the task turn after turn", 64)}

    def turns(self, seed: int) -> int:
        rng, n = random.Random(seed), 1
        while n < self.max_turns and rng.random() > self.p_stop:
            n += 1
        return n

    async def run(self, task: Task, ctx) -> None:
        messages = [{"role": "user", "content": task.question}]
        rng = random.Random(f"{ctx.seed}-lengths")
        full = ctx.agents["agent"].sampling.max_new_tokens
        for t in range(self.turns(ctx.seed)):
            limit = None
            if self.long_every and rng.randrange(self.long_every):  # a short call
                limit = {"max_new_tokens": max(1, full // 8)}
            out = await ctx.call("agent", messages, turn=t, limit=limit)
            messages += [{"role": "assistant", "content": out.completion[-200:]},
                         {"role": "user", "content": "Go on."}]
        ctx.finish(None)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        return {"outcome": 0.0}

"""No model reply stops a run: every shipped workflow, fed random and adversarial replies by a scripted engine
(wrong JSON types, huge, deeply nested, empty, tags inside tags, tool calls with wrong arguments), finishes
every episode and scores it. A wrong shape is that call's format failure, never an exception.

The draws are fixed in CI (``FUZZ_DERANDOMIZE=1``) and fresh locally; a failure prints its seed
(``FUZZ_SEED=N`` draws it again)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import traceback
from types import SimpleNamespace

import pytest
from tinycfg import tiny_config

from masrl.agents import AgentSpec
from masrl.config import load_config
from masrl.driver.rollout.context import WorkflowContext
from masrl.driver.rollout.services import Services
from masrl.errors import InfraError
from masrl.families import build_tasks, build_workflow, shipped_configs
from masrl.trace import Trace

SEED = int(os.environ.get("FUZZ_SEED", "0" if os.environ.get("FUZZ_DERANDOMIZE") else random.randrange(10**6)))
EPISODES = 6  # per config and draw

NASTY = [
    "", " ", "\n\n", "{", "}", "[]", "{}", "null", "5", "-1e309", "NaN", '"a string"', "true",
    '{"queries": 5}', '{"queries": null}', '{"queries": [1, {"a": 2}, null]}', '{"queries": "one query"}',
    '{"queries": [' + ", ".join(['"q"'] * 500) + "]}", '{"queries": [["nested", ["deeper"]]]}',
    '{"answer": {"x": 1}}', '{"answer": [1, 2]}', '{"expr": 7}', '{"pick": "x"}', '{"pick": -3}', '{"pick": 10**9}',
    "[" * 400 + "]" * 400, "{" * 300, '{"a": ' * 200 + "1" + "}" * 200,
    "<answer></answer>", "<answer><answer>1</answer></answer>", "<answer>" + "9" * 5000 + "</answer>",
    "<expr>1/0</expr>", "<expr>" + "(" * 500 + "1" + ")" * 500 + "</expr>", "<expr>__import__('os')</expr>",
    "<expr>10**10**10</expr>", "<query></query>", "<query>" + "x" * 20000 + "</query>", "<pick>99</pick>",
    "<pick>-1</pick>", "<pick>abc</pick>", "<verdict>maybe</verdict>", "<code></code>",
    "```python\nwhile True: pass\n```", "```python\n" + "x = 1\n" * 2000 + "```", "[4]", "[col 99]", "[]", "[[]]",
    '<tool_call>{"name": "search", "arguments": {"query": 5}}</tool_call>',
    '<tool_call>{"name": "nope", "arguments": []}</tool_call>', '<tool_call>{"name": "search"}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": {"a": 1}}}</tool_call>',
    "<tool_call>not json</tool_call>", '<tool_call>' * 50, "\x00\x01\x02", "\ud800" if False else "\u202e\u2028\u0085",
    "A" * 100_000, "🙂" * 10_000, "nothing useful", "Final answer: 42", "ANSWER: [0] <answer>x</answer> {\"q\": 1}",
]


def reply(rng: random.Random) -> str:
    """An adversarial reply, or a random mix of pieces of them, or random printable noise."""
    pick = rng.random()
    if pick < 0.6:
        return rng.choice(NASTY)
    if pick < 0.85:
        return "".join(rng.choice(NASTY)[: rng.randrange(1, 200)] for _ in range(rng.randrange(2, 5)))
    return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(0, 300)))


class FuzzEngine:
    """Answers every call of every agent with ``fixed``, or else a drawn reply (and counts the calls)."""

    def __init__(self, rng: random.Random, fixed: str | None = None):
        self.rng, self.fixed, self.calls = rng, fixed, 0

    async def __call__(self, agent, gen):
        self.calls += 1
        text = self.fixed if self.fixed is not None else reply(self.rng)
        return SimpleNamespace(text=text, n_prompt_tokens=10, n_completion_tokens=max(1, len(text) // 4),
                               finish_reason=self.rng.choice(["stop", "length"]))


def _configs() -> list[str]:
    return [n for n in shipped_configs() if not n.startswith("games/")] + ["games/tictactoe_selfplay",
                                                                           "games/kuhn_poker_selfplay"]


def _episodes(name: str, seed: int) -> list[str]:
    cfg = load_config(data=tiny_config(name, None))
    wf = build_workflow(cfg.workflow.name, cfg.workflow.options)
    tools = wf.tools(Services(cfg.sandbox, cfg.retriever, cfg.data.world)) if hasattr(wf, "tools") else {}
    train, _ = build_tasks(cfg)
    rng = random.Random(f"{name}-{seed}")
    agents = {n: AgentSpec(n, "p", r.parser) for n, r in wf.roles().items()}
    raised = []
    # every adversarial reply as every call's answer, then random draws and mixes
    for k, fixed in enumerate([*NASTY, *[None] * EPISODES]):
        task = train[k % len(train)]
        trace = Trace(f"t{k}", task.id, k)
        engine = FuzzEngine(rng, fixed)
        ctx = WorkflowContext(trace, agents, engine, train=True, call_timeout_s=30, tools=tools)
        try:
            asyncio.run(asyncio.wait_for(wf.run(task, ctx), timeout=120))
            trace.metrics.update(wf.score(trace, task))
            json.dumps(trace.to_dict(), default=str)
        except InfraError:
            continue  # infrastructure (a tool's outage, a game's engine): counted by the run as a failed trace
        except Exception as exc:  # what the test is looking for
            shown = f"every reply {fixed[:60]!r}" if fixed is not None else f"FUZZ_SEED={seed}"
            raised.append(f"{name} episode {k} ({shown}): {type(exc).__name__}: {str(exc)[:200]}\n"
                          + "".join(traceback.format_exception(exc)[-3:]))
    return raised


@pytest.mark.slow
@pytest.mark.parametrize("name", _configs())
def test_no_reply_raises_out_of_an_episode_of_a_shipped_workflow(name):
    raised = _episodes(name, SEED)
    assert raised == [], "\n".join(raised)

"""Multi-agent environments as workflows: HiddenSum's rewards by hand, turn order and messages."""

import asyncio
import random

import pytest

from masrl.agents import AgentSpec
from masrl.data.tasks import Task
from masrl.driver.rollout.context import WorkflowContext
from masrl.families import build_workflow
from masrl.families.hidden_sum import HiddenSum
from masrl.trace import Trace


class Scripted:
    def __init__(self, outputs):
        self.outputs = {k: list(v) for k, v in outputs.items()}
        self.prompts = []

    async def __call__(self, agent, gen):
        from types import SimpleNamespace

        self.prompts.append((agent, gen.messages[-1]["content"]))
        return SimpleNamespace(text=self.outputs[agent].pop(0), n_prompt_tokens=1, n_completion_tokens=1,
                               finish_reason="stop")


def _episode(wf, seed, outputs):
    trace = Trace("t", "ep", 0)
    engine = Scripted(outputs)
    agents = {n: AgentSpec(n, "p", r.parser) for n, r in wf.roles().items()}
    ctx = WorkflowContext(trace, agents, engine, train=True, call_timeout_s=30)
    asyncio.run(wf.run(Task("ep", "", None, {"seed": seed}), ctx))
    trace.metrics.update(wf.score(trace, Task("ep", "", None, {"seed": seed})))
    return trace, engine


def _xy(seed, max_value=20):
    rng = random.Random(seed)
    return rng.randint(1, max_value), rng.randint(1, max_value)


def test_relay_and_correct_sum_pay_both_agents():
    x, y = _xy(5)
    tr, engine = _episode(build_workflow("env", {"env": "hidden_sum"}), 5, {"scout": [f"<message>It is {x}.</message>"],
                                              "solver": [f"<answer>{x + y}</answer>"]})
    scout, solver = tr.calls
    assert [(c.agent, c.turn) for c in tr.calls] == [("scout", 0), ("solver", 1)]
    assert scout.credit == pytest.approx(0.5 + 1.0) and solver.credit == 1.0  # relay bonus + the team's win
    assert f"Message from the scout: It is {x}." in engine.prompts[1][1] and f"y: {y}" in engine.prompts[1][1]
    assert tr.metrics == {"outcome": 1.0, "relayed": 1.0, "scout/accuracy": 1.0, "solver/accuracy": 1.0, "steps": 2.0}


def test_no_relay_no_bonus_and_a_wrong_sum_pays_nothing():
    x, y = _xy(6)
    tr, _ = _episode(build_workflow("env", {"env": "hidden_sum"}), 6,
                     {"scout": ["<message>hello</message>"], "solver": [f"<answer>{x + y + 1}</answer>"]})
    assert [c.credit for c in tr.calls] == [0.0, 0.0] and tr.metrics["outcome"] == 0.0
    assert "solver/accuracy" not in tr.metrics  # judged only when the number reached it


def test_two_rounds_let_the_solver_ask_back():
    x, y = _xy(7)
    wf = build_workflow("env", {"env": "hidden_sum", "rounds": 2})
    tr, engine = _episode(wf, 7, {"scout": ["<message>ready</message>", f"<message>{x}</message>"],
                                  "solver": ["<message>what is x?</message>", f"<answer>{x + y}</answer>"]})
    assert [c.agent for c in tr.calls] == ["scout", "solver", "scout", "solver"]
    assert "Question from the solver: what is x?" in engine.prompts[2][1]
    assert [c.credit for c in tr.calls] == [0.0, 0.0, 1.5, 1.0]
    assert tr.metrics["steps"] == 4.0


def test_seeded_reset_and_custom_env_errors():
    a, b = HiddenSum(), HiddenSum()
    assert a.reset(3) == b.reset(3) and a.reset(3) != a.reset(4)
    with pytest.raises(Exception, match="workflow.options.env"):
        build_workflow("env", {"env": "nowhere"})
    with pytest.raises(Exception, match=r"workflow.options.env: the env workflow runs an environment; name one: "
                                        r"a family's \(hidden_sum\)"):
        build_workflow("env", {"rounds": 1})  # no default environment: the framework names no family

"""The math team's role credit, by hand: each agent paid for its own job."""

import asyncio

import pytest

from masrl.agents import AgentSpec
from masrl.data.tasks import Task
from masrl.driver.rollout.context import WorkflowContext
from masrl.families.math.team import MathTeam, verdict_credit
from masrl.rewards import CreditReward, combine
from masrl.trace import Trace


class Scripted:
    def __init__(self, outputs):
        self.outputs = dict(outputs)

    async def __call__(self, agent, gen):
        from types import SimpleNamespace

        return SimpleNamespace(text=self.outputs[agent], n_prompt_tokens=10, n_completion_tokens=5,
                               finish_reason="stop")


def run(solver_answer, status, refined_answer, final_answer, role_credit=True):
    wf = MathTeam(role_credit=role_credit)
    agents = {n: AgentSpec(n, "p", r.parser) for n, r in wf.roles().items()}
    outputs = {"solver": f"<solution>work</solution><answer>{solver_answer}</answer>",
               "verifier": f"<status>{status}</status><feedback>ok</feedback>",
               "refiner": f"<solution>so it is {refined_answer}</solution>",
               "finalizer": f"<answer>{final_answer}</answer>"}
    trace = Trace("t", "q1", 0)
    ctx = WorkflowContext(trace, agents, Scripted(outputs), train=True, call_timeout_s=30)
    task = Task("q1", "What is 3 + 4?", "7")
    asyncio.run(wf.run(task, ctx))
    trace.metrics.update(wf.score(trace, task))
    return {c.agent: c.credit for c in trace.calls}, trace, task


@pytest.mark.parametrize("solver, status, refined, final, want", [
    (7, "correct", 7, 7, {"solver": 1.0, "verifier": 1.0, "refiner": 0.0, "finalizer": 1.0}),
    (7, "incorrect", 9, 9, {"solver": 1.0, "verifier": 0.0, "refiner": -1.0, "finalizer": 1.0}),  # broke it
    (5, "incorrect", 7, 7, {"solver": 0.0, "verifier": 1.0, "refiner": 1.0, "finalizer": 1.0}),  # fixed it
    (5, "correct", 5, 7, {"solver": 0.0, "verifier": 0.0, "refiner": 0.0, "finalizer": 0.0}),  # unfaithful report
    (5, "uncertain", 5, 5, {"solver": 0.0, "verifier": 0.25, "refiner": 0.0, "finalizer": 1.0}),
])
def test_each_agent_is_paid_for_its_own_job(solver, status, refined, final, want):
    credit, trace, task = run(solver, status, refined, final)
    assert credit == want
    totals = combine(trace, task, [CreditReward()])
    assert sorted(totals.values()) == sorted(want.values())


def test_without_the_option_no_credit_is_set():
    credit, _, _ = run(7, "correct", 7, 7, role_credit=False)
    assert set(credit.values()) == {None}


def test_an_always_approving_verifier_earns_the_solvers_accuracy():
    # over a solver right half the time, approving everything earns 0.5 a call; judging well earns 1
    approve = [verdict_credit("correct", c) for c in (1.0, 0.0)]
    judge = [verdict_credit(s, c) for s, c in (("correct", 1.0), ("incorrect", 0.0))]
    assert sum(approve) / 2 == 0.5 and sum(judge) / 2 == 1.0

"""Debate: the vote, and credit per call worked out by hand on scripted answers."""

import asyncio
from types import SimpleNamespace

import pytest

from masrl.agents import AgentSpec
from masrl.data.tasks import Task
from masrl.driver.rollout.context import WorkflowContext
from masrl.families.math.debate import Debate, vote
from masrl.rewards import CreditReward, combine
from masrl.trace import Trace


def test_vote_takes_the_most_common_number_and_breaks_ties_by_order():
    assert vote(["7", "8", "7.0"]) == "7"
    assert vote(["8", "7"]) == "8"
    assert vote([None, "5", None]) == "5"
    assert vote([None, None]) is None


def _debate(outputs, **options):
    wf = Debate(**options)
    roles = wf.roles()
    queue = {a: list(v) for a, v in outputs.items()}

    async def submit(agent, gen):
        return SimpleNamespace(text=queue[agent].pop(0), n_prompt_tokens=5, n_completion_tokens=5, finish_reason="stop")

    task = Task("t1", "Ana has 3 pens and buys 4 more. How many?", "7")
    trace = Trace("tr", task.id, 0)
    ctx = WorkflowContext(trace, {a: AgentSpec(a, "p", r.parser) for a, r in roles.items()}, submit, train=True,
                          call_timeout_s=30)
    asyncio.run(wf.run(task, ctx))
    trace.metrics.update(wf.score(trace, task))
    return trace, task


def ans(n):
    return f"<solution>3 + 4 = {n}</solution><answer>{n}</answer>"


def test_credit_is_own_correctness_plus_improvement_plus_the_vote_bonus():
    tr, task = _debate({"debater_0": [ans(7), ans(7)], "debater_1": [ans(8), ans(7)], "debater_2": [ans(9), ans(9)]},
                       improve_weight=0.5, vote_bonus=0.25)
    by = {(c.agent, c.turn): c for c in tr.calls}
    assert [c.turn for c in tr.calls] == [0, 0, 0, 1, 1, 1]
    assert tr.final_answer == "7" and tr.metrics["outcome"] == 1.0
    assert by[("debater_0", 0)].credit == pytest.approx(1.0 + 0.25)
    assert by[("debater_1", 0)].credit == pytest.approx(0.0 + 0.25)
    assert by[("debater_1", 1)].credit == pytest.approx(1.0 + 0.5 * 1 + 0.25)  # fixed its answer
    assert by[("debater_0", 1)].credit == pytest.approx(1.0 + 0.0 + 0.25)
    assert by[("debater_2", 1)].credit == pytest.approx(0.25)
    assert tr.metrics["round0_accuracy"] == pytest.approx(1 / 3) and tr.metrics["final_accuracy"] == pytest.approx(2 / 3)
    assert tr.metrics["agreement"] == pytest.approx(2 / 3)
    assert tr.metrics["debater_1/accuracy"] == 1.0 and tr.metrics["debater_2/accuracy"] == 0.0
    totals = combine(tr, task, [CreditReward()])
    assert totals[by[("debater_1", 1)].call_id] == pytest.approx(1.75)


def test_revisers_see_the_others_answers_not_their_own():
    tr, _ = _debate({"debater_0": [ans(7), ans(7)], "debater_1": [ans(8), ans(8)]}, agents=2)
    revise = [c for c in tr.calls if c.turn == 1]
    assert "(answer 8)" in revise[0].messages[-1]["content"] and "(answer 7)" not in revise[0].messages[-1]["content"]
    assert "(answer 7)" in revise[1].messages[-1]["content"]
    assert tr.final_answer == "7"  # a tie goes to the earliest debater

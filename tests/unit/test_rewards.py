import pytest

from masrl.data.tasks import Task
from masrl.rewards import FormatReward, OutcomeReward, TurnDeltaReward, combine
from masrl.rewards.turn_delta import turn_deltas
from masrl.trace import Call, Trace

TASK = Task("t1", "q", "7")


def make_trace(outcome=1.0):
    tr = Trace("tr1", "t1", 0, metrics={"outcome": outcome})
    for i, (agent, fmt, ts) in enumerate([("solver", 1.0, 0.0), ("verifier", 0.5, None), ("finalizer", 0.0, 1.0)]):
        tr.calls.append(Call(f"c{i}", "tr1", "t1", 0, agent, "p", i, [], format_score=fmt, turn_score=ts))
    return tr


def test_outcome_shared_by_every_call():
    out = OutcomeReward(weight=2.0).allocate(make_trace(1.0), TASK)
    assert [a.reward for a in out] == [2.0, 2.0, 2.0]
    assert [a.reward for a in OutcomeReward().allocate(make_trace(0.0), TASK)] == [0.0, 0.0, 0.0]


def test_format_per_agent_weight_and_penalty():
    out = FormatReward(weight=0.5, per_agent={"verifier": 2.0}, penalty=0.25).allocate(make_trace(), TASK)
    # solver .5*1 ; verifier 2*.5 ; finalizer 0 - penalty
    assert [a.reward for a in out] == [0.5, 1.0, -0.25]


def test_turn_deltas():
    assert turn_deltas([0.0, 1.0, 1.0, 0.0]) == [0.0, 1.0, 0.0, -1.0]
    out = TurnDeltaReward(weight=1.0).allocate(make_trace(), TASK)
    # scored calls: solver 0 (0 - 0), finalizer 1 (1 - 0); verifier unscored
    assert [(a.call_id, a.reward) for a in out] == [("c0", 0.0), ("c2", 1.0)]


def test_combine_sums_parts_and_skips_untrainable():
    tr = make_trace(1.0)
    tr.calls[1].trainable = False
    totals = combine(tr, TASK, [OutcomeReward(1.0), FormatReward(0.5)])
    assert totals == {"c0": 1.5, "c2": 1.0}
    assert tr.calls[1].reward == 1.25  # still recorded for reporting
    assert tr.calls[0].reward_parts == {"outcome": 1.0, "format": 0.5}


def test_combine_rejects_unknown_call_ids():
    from masrl.trace import RewardAssignment

    class Bad:
        name = "bad"

        def allocate(self, trace, task):
            return [RewardAssignment("nope", 1.0, "bad")]

    from masrl.rewards import RewardFailure

    with pytest.raises(RewardFailure, match="reward allocator 'bad' .* 'nope', which is not a call of the trace"):
        combine(make_trace(), TASK, [Bad()])

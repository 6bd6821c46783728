"""Collapse alarms, and the figures they read, worked by hand."""

from masrl.driver.observe.alarms import collapse_alarms, stuck
from masrl.driver.observe.metrics import distinct_n, summarize_traces, zero_variance_groups
from masrl.trace import Call, Trace


def test_a_one_word_answer_is_its_own_gram():
    answers = ["<answer>4</answer>", "<answer>9</answer>", "<answer>4</answer>"]
    assert distinct_n(answers, 2) == 2 / 3  # was 0.0: no bigrams at all
    assert distinct_n(["a b a", "a b c"], 2) == 0.75 and distinct_n([""], 2) == 0.0


def _trace(task, sample, rewards):
    tr = Trace(trace_id=f"t{task}{sample}", task_id=task, sample_idx=sample)
    for turn, (agent, r) in enumerate(rewards):
        tr.calls.append(Call(call_id=f"c{task}{sample}{turn}", trace_id=tr.trace_id, task_id=task, sample_idx=sample,
                             agent=agent, policy="p", turn=turn, messages=[], completion=f"x{sample}", reward=r))
    tr.metrics["outcome"] = 0.0
    return tr


def test_groups_without_reward_variance_are_counted_per_agent():
    traces = [_trace("a", 0, [("solver", 1.0), ("judge", 0.5)]), _trace("a", 1, [("solver", 0.0), ("judge", 0.5)]),
              _trace("b", 0, [("solver", 1.0), ("judge", 0.0)]), _trace("b", 1, [("solver", 1.0), ("judge", 1.0)])]
    assert zero_variance_groups(traces) == {"solver": 0.5, "judge": 0.5}
    traces.append(_trace("c", 0, [("solver", 1.0), ("judge", 1.0)]))  # a group of one teaches nothing either way
    assert zero_variance_groups(traces) == {"solver": 0.5, "judge": 0.5}
    assert summarize_traces(traces)["agents"]["judge"]["zero_var_groups"] == 0.5


def _rec(step, d2, zero_var, entropy):
    return {"step": step, "rollout": {"agents": {"finalizer": {"distinct_2": d2, "zero_var_groups": zero_var}}},
            "policies": {"shared": {"entropy": entropy}}}


def test_collapse_alarms_name_the_agent_the_figure_and_where_it_started():
    first = _rec(1, 0.6, 0.2, 0.30)
    assert collapse_alarms(first, None) == []
    assert collapse_alarms(_rec(5, 0.5, 0.5, 0.25), first) == []
    alarms = collapse_alarms(_rec(30, 0.05, 0.85, 0.02), first)
    assert alarms == ["finalizer: distinct-2 0.05 (was 0.60 at step 1)",
                      "finalizer: 85% of its groups have equal rewards (no advantage)",
                      "[shared] entropy 0.020 (was 0.300 at step 1)"]
    # a policy that starts near-deterministic is not flagged for staying so
    assert collapse_alarms(_rec(30, 0.6, 0.2, 0.015), _rec(1, 0.6, 0.2, 0.02)) == []
    # an update that trained no token measured no entropy: no alarm, whatever its record says
    idle = _rec(31, 0.6, 0.2, 0.0)
    idle["policies"]["shared"]["trained_tokens"] = 0.0
    assert collapse_alarms(idle, first) == []
    trained = _rec(32, 0.6, 0.2, 0.0)
    trained["policies"]["shared"]["trained_tokens"] = 12.0
    assert collapse_alarms(trained, first) == ["[shared] entropy 0.000 (was 0.300 at step 1)"]


def _step(step, outcome, **flat):
    return {"step": step, "rollout": {"outcome": outcome, "agents": {a: {"zero_var_groups": v} for a, v in flat.items()}}}


def test_a_run_is_stuck_only_when_nothing_teaches_and_the_outcome_never_rose():
    first = _step(1, 0.04, reader=0.5, answerer=0.6)
    collapsed = [_step(s, o, reader=r, answerer=a) for s, o, r, a in
                 [(8, 0.0, 1.0, 0.86), (9, 0.02, 0.96, 1.0), (10, 0.0, 1.0, 0.71)]]  # one step below 80% is averaged
    why = stuck(collapsed, first)
    assert why and "last 3 steps" in why and "reader 99%" in why and "answerer 86%" in why and "0.040" in why
    assert stuck([*collapsed[:2], _step(10, 0.05, reader=1.0, answerer=1.0)], first) is None  # it rose above the start
    assert stuck([_step(s, 1.0, solver=1.0) for s in (40, 41)], _step(1, 0.3, solver=0.4)) is None  # solved, not stuck
    assert stuck([_step(s, 0.0, reader=1.0, answerer=0.5) for s in (8, 9)], first) is None  # the answerer still learns
    assert stuck([], first) is None and stuck(collapsed, {"step": 1}) is None


def _updated(step, outcome, tokens, entropy=0.0):
    return {"step": step, "rollout": {"outcome": outcome, "agents": {"player_0": {"zero_var_groups": 1.0}}},
            "policies": {"shared": {"trained_tokens": tokens, "entropy": entropy}}}


def test_a_run_whose_updates_train_nothing_stops_even_when_its_outcome_rose():
    first = _updated(1, 0.5, 1303.0, 0.68)
    collapsed = [_updated(s, 0.6, 0.0) for s in (25, 26, 27)]  # one deterministic self-play game, above the start
    why = stuck(collapsed, first)
    assert why and why.startswith("nothing trained: for the last 3 steps") and "0.600 now" in why
    assert "entropy at most 0.000" in why and "explore_moves" in why
    assert stuck([*collapsed[:2], _updated(27, 0.6, 12.0)], first) is None  # one group still taught something
    frozen_step = {"step": 27, "rollout": {"outcome": 0.6, "agents": {}}, "policies": {}}  # no update: no evidence
    assert stuck([*collapsed[:2], frozen_step], first) is None
    # a frozen opponent's policy carries no update figures and does not count either way
    with_frozen = [{**r, "policies": {**r["policies"], "past_0": {"calls": 8}}} for r in collapsed]
    assert stuck(with_frozen, first).startswith("nothing trained")


def test_flat_groups_do_not_stop_a_run_whose_estimator_still_gives_advantages():
    # RAE's running baseline: every group flat (self-play settled on one game), yet each call is paid against its
    # seat's baseline, so the update still has something to learn; the group baseline's run is stuck
    first = _step(1, 0.97, player_0=0.5, player_1=0.5)

    def step(s, zero_adv):
        return {**_step(s, 0.4, player_0=0.9, player_1=0.95),
                "policies": {"shared": {"n_seqs": 64.0, "zero_adv_seqs": zero_adv, "trained_tokens": 100.0}}}
    assert stuck([step(s, 1.0) for s in (40, 41, 42)], first) is None  # RAE: 63 of 64 sequences taught
    why = stuck([step(s, 56.0) for s in (40, 41, 42)], first)  # GRPO: 8 of 64 taught
    assert why and why.startswith("stuck:")

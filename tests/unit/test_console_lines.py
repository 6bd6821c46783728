"""The console's step line: a game's agent is shown by its own score, not the first seat's; a team's line
wraps one agent, policy or alarm to a line instead of running to 700 characters."""

from masrl.driver.observe.metrics import LINE, comparison_table, step_line


def _rec(agents: dict, policies: dict | None = None, alarms=()):
    return {"rollout_s": 1.0, "update_s": 2.0, "alarms": list(alarms),
            "rollout": {"outcome": 1.0, "reward": 0.5, "agents": agents}, "policies": policies or {}}


def _agent(**extra):
    return {"reward": 0.1, "accuracy": 1.0, "format_rate": 1.0, "tokens": 3.0, **extra}


def test_a_games_agents_show_their_own_score():
    rec = _rec({"player_0": _agent(score=1.0), "player_1": _agent(score=0.0)})
    line = step_line(1, 2, rec)
    assert "player_0: r=0.10 score=1.00" in line and "player_1: r=0.10 score=0.00" in line and "acc=" not in line
    assert "acc=1.00" in step_line(1, 2, _rec({"solver": _agent()}))  # no score of its own: its traces' accuracy
    table = comparison_table({"agents": {"player_1": _agent(score=0.5)}}, {"agents": {"player_1": _agent(score=0.0)}})
    assert table[-1][:2] == ["player_1", "0.500 -> 0.000"]


def test_a_teams_step_line_wraps_per_agent():
    pol = {"loss": 0.0, "kl": 0.0, "grad_norm": 1.0, "skipped_zero_adv": 1, "n_seqs": 8}
    rec = _rec({a: _agent() for a in ("solver", "verifier", "refiner", "finalizer")}, {"shared": pol},
               alarms=["solver: 100% of its groups have equal rewards (no advantage)"])
    lines = step_line(3, 8, rec).split("\n")
    assert lines[0].startswith("step 3/8 | rollout") and "solver" not in lines[0]
    assert [x.split(":")[0].strip() for x in lines[1:5]] == ["solver", "verifier", "refiner", "finalizer"]
    assert lines[5].strip().startswith("[shared] loss") and lines[6].strip().startswith("ALARM solver")
    assert all(len(x) <= LINE for x in lines)
    assert "\n" not in step_line(3, 8, _rec({"solver": _agent()}))  # one agent: one line

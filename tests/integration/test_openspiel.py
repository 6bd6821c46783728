"""OpenSpiel games as a workflow (``workflow: openspiel``) and their exact yardsticks, on the real library."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tinycfg import tiny_config

from masrl.config import load_config
from masrl.driver.checks import check_run
from masrl.errors import ConfigError
from masrl.families.games import spiel, yardsticks
from masrl.families.games.workflow import OpenSpielGame

pytest.importorskip("pyspiel")


def _play(game: str, seed: int, pick) -> spiel.Game:
    g = spiel.Game(game, 2, seed).start()
    while not g.done:
        pid, obs = g.observe()
        g.move(pid, pick(g, pid, obs))
    return g


def test_the_uniform_policy_and_cfr_have_their_known_exploitability():
    """OpenSpiel's own numbers: uniform random Kuhn 0.4583 and Leduc 2.3736; CFR's average policy after 300
    iterations near 0; a policy that always bets is exploitable (well above CFR's)."""
    from open_spiel.python.algorithms import cfr

    assert yardsticks.uniform_exploitability("kuhn_poker") == pytest.approx(0.458333, abs=1e-5)
    assert yardsticks.uniform_exploitability("leduc_poker") == pytest.approx(2.373611, abs=1e-5)
    solver = cfr.CFRSolver(spiel.load("kuhn_poker"))
    for _ in range(300):
        solver.evaluate_and_update_policy()
    avg = solver.average_policy()

    def from_cfr(state, pid, actions):
        d = avg.action_probabilities(state)
        return [d.get(a, 0.0) for a in actions]
    assert yardsticks.exploitability_of("kuhn_poker", from_cfr) < 0.01
    always_bet = yardsticks.exploitability_of("kuhn_poker", lambda s, pid, acts: [float(a == acts[-1]) for a in acts])
    assert always_bet > 0.3
    assert yardsticks.exploitability_of("kuhn_poker", lambda s, pid, acts: [1 / len(acts)] * len(acts)) == \
        pytest.approx(0.458333, abs=1e-5)


def test_normalised_logprobs_are_a_distribution_over_the_legal_moves():
    ps = yardsticks.normalised([-1.0, -3.0, -1000.0])
    assert sum(ps) == pytest.approx(1.0) and ps[0] > ps[1] > ps[2] >= 0.0
    assert ps[0] / ps[1] == pytest.approx(2.718281828 ** 2)


def test_perfect_play_never_loses_at_tic_tac_toe():
    """The minimax player (OpenSpiel's own solver): against itself every game is a draw, and the random player
    never beats it in either seat."""
    def players(seats: tuple[str, str], rng: random.Random):
        return lambda g, pid, obs: spiel.builtin_move(seats[pid], g, obs, rng)

    for seed in range(10):
        g = _play("tic_tac_toe", seed, players(("minimax", "minimax"), random.Random(seed)))
        assert g.rewards == {0: 0.0, 1: 0.0}
    for seed in range(40):
        seats = ("minimax", "minimax@1") if seed % 2 == 0 else ("minimax@1", "minimax")
        g = _play("tic_tac_toe", seed, players(seats, random.Random(seed)))
        assert g.rewards[seed % 2] >= 0.0, (seed, g.state)


def test_a_deal_is_drawn_by_the_seed_and_the_player_sees_its_own_card_only():
    a, b = spiel.Game("kuhn_poker", 2, 7).start(), spiel.Game("kuhn_poker", 2, 7).start()
    assert a.state.history() == b.state.history()
    deals = {tuple(spiel.Game("kuhn_poker", 2, s).start().state.history()) for s in range(30)}
    assert len(deals) == 6  # every deal of 3 cards to 2 players comes up
    pid, obs = a.observe()
    mine, theirs = spiel.KUHN_CARDS[a.state.history()[pid]], spiel.KUHN_CARDS[a.state.history()[1 - pid]]
    assert f"Your card: {mine}" in obs and obs.count(theirs) == (1 if theirs != mine else 2)  # the rules name each
    assert obs.endswith("Available moves: [Pass], [Bet]")


def test_a_move_is_matched_as_written_and_an_invalid_one_twice_loses_the_game():
    g = spiel.Game("tic_tac_toe", 2, 0).start()
    assert g.move(0, "[ X(1,1) ]") is False  # brackets, spaces and case aside
    assert g.move(1, "[o(1,1)]") is True and not g.done  # taken: asked again
    assert g.move(1, "[9]") is True and g.done
    assert g.rewards == {0: 1.0, 1: -1.0} and g.info[1]["invalid_move"]


@pytest.mark.parametrize("options, needle", [
    ({"game": "kuhn_pokr"}, "did you mean kuhn_poker"),
    ({"game": "kuhn_poker", "players": ["a", "b", "c"]}, "kuhn_poker(players=3)"),
    ({"game": "goofspiel"}, "simultaneous-move"),
    ({"game": "kuhn_poker", "players": ["player_0", "minimax"]}, "not a two-player zero-sum game of perfect"),
    ({"game": "connect_four", "players": ["player_0", "minimax@0.5"]}, "too large to solve"),
    ({"game": "tic_tac_toe", "players": ["player_0", "minimax@2"]}, "between 0 and 1"),
])
def test_a_bad_game_or_seat_is_a_config_error_naming_the_fix(options, needle):
    with pytest.raises(ConfigError) as e:
        OpenSpielGame(**{"players": ["player_0", "player_1"], **options})
    assert needle in str(e.value)


def test_minimax_is_refused_in_a_textarena_split_and_checked_in_an_openspiel_one(tmp_path):
    data = tiny_config("games/tictactoe_vs_random", tmp_path, steps=1)
    data["data"]["eval"]["options"] = {"players": ["player_0", "minimax"]}
    with pytest.raises(ConfigError, match="built-in player of OpenSpiel games"):
        check_run(load_config(data=data))
    data = tiny_config("games/spiel_kuhn_poker_selfplay", tmp_path, steps=1)
    data["data"]["eval"]["options"] = {"players": ["player_0", "minimax"], "swap_seats": True}
    with pytest.raises(ConfigError, match=r"data\.eval\.options\.players: the minimax player"):
        check_run(load_config(data=data))


def test_masrl_eval_reports_exploitability_and_the_minimax_ladder(tmp_path):
    """``masrl eval`` on a config (tiny-random): Kuhn Poker's exploitability of the model's own move probabilities,
    beside the uniform policy's; TicTacToe's ladder, per seat, each row a distribution over win/draw/loss."""
    def run(config):
        out = tmp_path / config.split("/")[-1]
        r = subprocess.run([str(Path(sys.executable).parent / "masrl"), "eval", config, "model=tiny-random",
                            "data.eval.n=4", f"output_dir={out}"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads((out / "eval.json").read_text())["yardsticks"], r.stdout + r.stderr

    kuhn, text = run("games/spiel_kuhn_poker_selfplay")
    e = kuhn["exploitability"]
    assert e["uniform"] == pytest.approx(0.458333, abs=1e-5)
    assert 0.0 <= e["policy"] <= 2.0 and e["policy"] != pytest.approx(e["uniform"], abs=1e-6)
    assert "exploitability of player_0" in text and "ladder" not in kuhn
    assert len(e["table"]) == 12 and all(sum(row.values()) == pytest.approx(1.0, abs=1e-3) for row in e["table"].values())
    assert set(e["table"]["0"]) == {"Pass", "Bet"}  # the first player's Jack, before any bet
    ttt, text = run("games/spiel_tic_tac_toe_selfplay")
    rungs = ttt["ladder"]["random_move_probability"]
    assert list(rungs) == ["1", "0.5", "0.2", "0"]
    for seats in rungs.values():
        assert set(seats) == {"seat0", "seat1"}
        for row in seats.values():
            assert row["games"] == 2 and row["win"] + row["draw"] + row["loss"] == pytest.approx(1.0)
    assert "player_0 vs minimax@0.2" in text and "exploitability" not in ttt


def test_rae_trains_a_game_and_its_baselines_survive_a_resume(tmp_path):
    """Self-play with ``algorithm.advantage: rae``: each seat's running baseline is in the checkpoint, and a resumed
    run starts its next update from them."""
    from masrl.driver.run.loop import train

    data = tiny_config("games/spiel_tic_tac_toe_selfplay", tmp_path, steps=2)
    data["algorithm"]["advantage"] = "rae"
    data["workflow"]["options"]["swap_seats"] = True  # each agent moves first in half the games (tiny-random's
    # invalid replies end a game before the second seat moves)
    data["train"].update(save_every=1, eval_every=0)
    data["output_dir"] = str(tmp_path / "run")
    train(load_config(data=data))
    counters = json.loads(next((tmp_path / "run" / "checkpoints" / "step_000002").glob("worker_*.json")).read_text())
    before = counters["estimator_state"]["shared"]["baselines"]
    assert set(before) == {"player_0", "player_1"} and all(b["updates"] >= 1 for b in before.values())
    data["train"]["steps"] = 3
    train(load_config(data=data), resume=True)
    counters = json.loads(next((tmp_path / "run" / "checkpoints" / "step_000003").glob("worker_*.json")).read_text())
    after = counters["estimator_state"]["shared"]["baselines"]
    # counted on from the saved ones (a baseline started afresh would count 1)
    assert all(after[r]["updates"] >= before[r]["updates"] for r in before)
    assert sum(b["updates"] for b in after.values()) > sum(b["updates"] for b in before.values())


def test_moves_from_one_position_share_a_group_across_games(tmp_path):
    """``algorithm.group_key: [agent, state]``: every move made from one position in the step is one GRPO group (a
    turn-level baseline across games). Games open with 0-4 random moves, so the agents' calls answer several
    positions; each position's advantages sum to zero, which grouping by agent alone does not give."""
    import asyncio

    from tinycfg import prepared_trainer

    data = tiny_config("games/spiel_tic_tac_toe_selfplay", tmp_path, steps=1)
    data["algorithm"].update(group_key=["agent", "state"], skip_zero_advantage=False)
    data["data"]["train"]["options"] = {"opening_moves": 4}
    data["rollout"].update(tasks_per_step=6, samples_per_task=4)
    tr, _, _ = prepared_trainer(data, tmp_path)
    asyncio.run(tr.train_step())
    calls = [c for t in tr.last_traces for c in t.calls]
    assert calls and all(c.state for c in calls)
    groups: dict = {}
    for c in calls:
        if c.advantage is not None:
            groups.setdefault((c.agent, c.state), []).append(c.advantage)
    assert len(groups) >= 3 and max(len(a) for a in groups.values()) >= 4  # several positions, each met 4+ times
    assert any(abs(x) > 1e-3 for a in groups.values() for x in a)  # rewards differ (the hash reward)
    assert all(abs(sum(a)) < 1e-4 for a in groups.values())
    asyncio.run(tr.rt.controller.aclose())


def test_masrl_compare_shows_each_arms_yardsticks_over_its_seeds(tmp_path):
    """Two seeds of Kuhn self-play, each evaluated by ``masrl eval RUN``: ``masrl compare`` puts their exploitability
    side by side (mean, range) in its table and its page."""
    from masrl.cli import main
    from masrl.cli.compare import build_compare
    from masrl.driver.run.loop import train

    runs = []
    for seed in (0, 1):
        data = tiny_config("games/spiel_kuhn_poker_selfplay", tmp_path / f"s{seed}", steps=1)
        data.update(seed=seed, output_dir=str(tmp_path / f"s{seed}"))
        train(load_config(data=data))
        assert main(["eval", str(tmp_path / f"s{seed}")]) == 0
        runs.append(tmp_path / f"s{seed}")
    values = [json.loads(next((r / "evals").glob("*.json")).read_text())["yardsticks"]["exploitability"]["policy"]
              for r in runs]
    lines: list[str] = []
    page = build_compare(runs, tmp_path / "compare.html", print_table=lines.append)
    line = next(x for x in lines if x.startswith("yardsticks spiel_kuhn_poker_selfplay"))
    assert f"exploitability {sum(values) / 2:.3f} ({min(values):.3f}-{max(values):.3f})" in line
    assert "(uniform 0.458)" in line and '"exploitability_uniform"' in page.read_text()

"""TextArena games as they are (workflow: textarena): the library's boards, moves, rules and results, each seat an
agent; scripted moves on the real library, and bad input named before any model loads."""

from __future__ import annotations

import random

import pytest

ta = pytest.importorskip("textarena")

from helpers import run_scripted  # noqa: E402

from masrl.data.tasks import Task  # noqa: E402
from masrl.errors import ConfigError  # noqa: E402
from masrl.families import build_workflow  # noqa: E402
from masrl.families.games import arena  # noqa: E402
from masrl.families.games.workflow import TextArenaGame, parse_move  # noqa: E402

GAME = "TicTacToe-v0-train"


def _task(seed: int) -> Task:
    return Task(f"ep-{seed}", f"episode {seed}", None, {"seed": seed})


def test_a_won_game_pays_each_seat_its_result_and_records_the_moves():
    wf = TextArenaGame(GAME, ["player_0", "player_1"], examples=0)
    # the seat that moves first at seed 3 takes the top row; the other plays the middle row's edges
    first = arena.Game(GAME, 2, 3).start().observe()[0]
    moves = {f"player_{first}": ["[0]", "[1]", "[2]"], f"player_{1 - first}": ["[3]", "[5]"]}
    trace, _ = run_scripted(wf, _task(3), moves)
    winner = f"player_{first}"
    assert trace.final_answer == f"Player {first} ({winner}) wins"
    assert [c.credit for c in trace.calls if c.agent == winner] == [1.0, 1.0, 1.0]
    assert [c.credit for c in trace.calls if c.agent != winner] == [-1.0, -1.0]
    m = trace.metrics
    assert m[f"{winner}/score"] == 1.0 and m[f"player_{1 - first}/loss"] == 1.0 and m[f"{winner}/invalid"] == 0.0
    assert m["outcome"] == m["player_0/score"] and m["moves"] == 5.0
    assert [(x["agent"], x["move"]) for x in trace.state["moves"]][:2] == [(winner, "[0]"), (f"player_{1 - first}", "[3]")]
    # GRPO groups by (task, agent, turn): each seat's moves are its own agent's, numbered by its own move count
    assert [c.turn for c in trace.calls if c.agent == winner] == [0, 1, 2]


def test_the_games_own_rule_for_invalid_moves_one_retry_then_the_game_is_lost():
    wf = TextArenaGame(GAME, ["player_0", "player_1"], examples=0)
    first = arena.Game(GAME, 2, 5).start().observe()[0]
    moves = {f"player_{first}": ["I pick the center", "still prose"], f"player_{1 - first}": ["[4]"]}
    trace, _ = run_scripted(wf, _task(5), moves)
    bad = f"player_{first}"
    assert trace.metrics[f"{bad}/invalid"] == 1.0 and trace.metrics[f"{bad}/lost_by_invalid"] == 1.0
    assert trace.metrics[f"player_{1 - first}/win"] == 1.0
    assert [x["invalid"] for x in trace.state["moves"]] == [True, True]
    assert "format" in trace.state["reason"]


def test_the_random_player_moves_among_the_listed_moves_and_seats_swap_every_other_game():
    wf = TextArenaGame(GAME, ["player", "random"], swap_seats=True, examples=0)
    assert wf.seats(4) == ["player", "random"] and wf.seats(7) == ["random", "player"]
    assert set(wf.roles()) == {"player"}
    game = arena.Game(GAME, 2, 1).start()
    obs = game.observe()[1]
    picks = {arena.random_move(game, obs, random.Random(k)) for k in range(60)}
    assert picks == {f"[{i}]" for i in range(9)}
    trace, _ = run_scripted(wf, _task(7), {"player": [f"[{i}]" for i in range(9)]})
    assert trace.metrics["player/seat1_score"] == trace.metrics["player/score"]  # seed 7: the player has seat 1
    assert all(x["agent"] == "random" or x["move"].startswith("[") for x in trace.state["moves"])


def test_a_groups_games_against_the_random_player_differ_though_the_player_plays_the_same_moves():
    """A policy that plays one move per position still meets different games in a group (each sample's random
    player draws its own moves); the first sample, every held-out game's, stays the seed's own game."""
    from masrl.trace import Trace

    wf = TextArenaGame(GAME, ["player", "random"], examples=0)
    script = [f"[{i}]" for i in range(9)]  # the lowest square first: the invalid ones are asked again
    games = []
    for k in range(8):
        trace, _ = run_scripted(wf, _task(4), {"player": script}, trace=Trace(f"t{k}", "ep-4", k))
        games.append(tuple(m["move"] for m in trace.state["moves"] if m["agent"] == "random"))
    assert len(set(games)) >= 4, games
    again, _ = run_scripted(wf, _task(4), {"player": script}, trace=Trace("t", "ep-4", 0))
    assert tuple(m["move"] for m in again.state["moves"] if m["agent"] == "random") == games[0]


def test_a_reply_is_one_bracketed_move():
    assert parse_move("[4]").ok and parse_move("[4]").fields == {"move": "[4]"}
    assert not parse_move("I play [4] now").ok and parse_move("I play [4] now").fields == {"move": "[4]"}
    assert parse_move("the center").score == 0.0


def test_prompts_show_worked_turns_from_the_game_itself():
    wf = TextArenaGame(GAME, ["player_0", "player_1"], examples=2)
    assert len(wf.shots) == 2
    for obs, move in wf.shots:
        assert "Available Moves" in obs and move in obs


@pytest.mark.parametrize("game, move", [("ConnectFour-v0", "[col "), ("Nim-v0", "[")])
def test_games_whose_screen_lists_no_moves_get_them_from_their_state(game, move):
    """ConnectFour and Nim list no moves on their screen: the random player, the openings and the worked turns
    read them from the game's own state, and every move drawn is one the library accepts."""
    wf = TextArenaGame(game, ["player", "random"], examples=2)
    assert len(wf.shots) == 2 and all(m.startswith(move) for _, m in wf.shots)
    for seed in range(3):  # random against random, to the end: the library never refuses a drawn move
        g, rng = arena.Game(game, 2, seed).start(), random.Random(seed)
        while not g.done:
            pid, obs = g.observe()
            assert not g.move(pid, arena.random_move(g, obs, rng))
        assert g.rewards
    trace, _ = run_scripted(wf, _task(3), {"player": ["[col 0]", "[0 1]"] * 40})
    assert trace.error is None and trace.state["rewards"]


def test_a_game_whose_moves_are_unknown_is_refused_for_random_moves_and_worked_turns():
    game = "Othello-v0"  # lists no moves, and masrl does not read its state
    with pytest.raises(ConfigError, match="examples shows 2 worked turns.*lists no moves.*examples: 0"):
        TextArenaGame(game, ["a", "b"])
    with pytest.raises(ConfigError, match="players seats the random player.*lists no moves"):
        TextArenaGame(game, ["a", "random"], examples=0)
    TextArenaGame(game, ["a", "b"], examples=0)  # agents in every seat, no worked turns: playable


def test_bad_games_and_seatings_are_refused_before_any_model_loads():
    with pytest.raises(ConfigError, match="no game 'TicTacToe-v9'; did you mean TicTacToe-v0"):
        build_workflow("textarena", {"game": "TicTacToe-v9"})
    with pytest.raises(ConfigError, match="does not start with 3 players.*has to be 2"):
        build_workflow("textarena", {"game": GAME, "players": ["a", "b", "c"]})
    with pytest.raises(ConfigError, match="one agent two seats"):
        build_workflow("textarena", {"game": GAME, "players": ["a", "a"]})
    with pytest.raises(ConfigError, match="needs an agent"):
        build_workflow("textarena", {"game": GAME, "players": ["random", "random"]})


def test_a_split_plays_its_games_with_its_own_seating_and_bad_seatings_are_named():
    from masrl.config import DataSourceConfig
    from masrl.data.sources import SOURCES, check_source, load_tasks

    wf = TextArenaGame(GAME, ["player_0", "player_1"], examples=0)
    held_out = DataSourceConfig(source="episodes", n=6, seed=2, options={"players": ["player_0", "random"],
                                                                           "swap_seats": True})
    check_source(held_out, "data.eval", SOURCES)
    wf.check_split(held_out, "data.eval")
    tasks = load_tasks(held_out, sources=SOURCES)
    seatings = [wf.seats(t.meta["seed"], t.meta) for t in tasks]
    assert seatings.count(["player_0", "random"]) == seatings.count(["random", "player_0"]) == 3  # half and half
    assert wf.seats(tasks[0].meta["seed"]) == ["player_0", "player_1"]  # training games keep the workflow's seats
    odd = tasks[1]
    trace, _ = run_scripted(wf, odd, {"player_0": [f"[{i}]" for i in range(9)]})
    assert trace.state["seats"] == ["random", "player_0"] and "player_1/score" not in trace.metrics
    assert trace.metrics["outcome"] == trace.metrics["player_0/score"] == trace.metrics["player_0/seat1_score"]
    for options, match in [({"players": ["player_0", "nobody"]}, "no agent 'nobody'"),
                           ({"players": ["player_0"]}, "1 seats, but the game is played with 2"),
                           ({"players": ["random", "random"]}, "needs an agent")]:
        with pytest.raises(ConfigError, match=match):
            wf.check_split(DataSourceConfig(source="episodes", options=options), "data.eval")
    with pytest.raises(ConfigError, match="takes players, swap_seats .*, opening_moves and explore_moves, not seats"):
        wf.check_split(DataSourceConfig(source="episodes", options={"seats": ["a"]}), "data.eval")


def test_a_split_with_random_openings_starts_each_game_after_its_seeds_moves_and_trains_no_call_on_them():
    from masrl.config import DataSourceConfig
    from masrl.data.sources import SOURCES, check_source, load_tasks

    wf = TextArenaGame(GAME, ["player_0", "player_1"], examples=0)
    split = DataSourceConfig(source="episodes", n=12, seed=1, options={"opening_moves": 3})
    check_source(split, "data.train", SOURCES)
    tasks = load_tasks(split, sources=SOURCES)
    openings = []
    for t in tasks:
        script = {a: [f"[{i}]" for i in range(9)] for a in ("player_0", "player_1")}
        trace, _ = run_scripted(wf, t, script)
        opening = [m for m in trace.state["moves"] if m["agent"] == "opening"]
        assert trace.state["moves"][: len(opening)] == opening and len(opening) <= 3
        assert len(trace.calls) == len(trace.state["moves"]) - len(opening)  # the opening's moves are no calls
        again, _ = run_scripted(wf, t, {a: [f"[{i}]" for i in range(9)] for a in ("player_0", "player_1")})
        assert [m for m in again.state["moves"] if m["agent"] == "opening"] == opening  # a seed's opening is fixed
        openings.append(tuple(m["move"] for m in opening))
    assert len({len(o) for o in openings}) > 1 and len(set(openings)) > 3  # 0 to 3 moves, many different ones
    plain, _ = run_scripted(wf, _task(tasks[0].meta["seed"]), {a: [f"[{i}]" for i in range(9)]
                                                             for a in ("player_0", "player_1")})
    assert all(m["agent"] != "opening" for m in plain.state["moves"])  # a split without the option: none
    wf.check_split(split, "data.train")
    for bad in (-1, 21, "2", True):
        with pytest.raises(ConfigError, match="opening_moves"):
            wf.check_split(DataSourceConfig(source="episodes", options={"opening_moves": bad}), "data.train")


def test_explore_moves_play_some_of_an_agents_moves_at_random_differently_in_each_sample_and_train_none():
    from masrl.config import DataSourceConfig
    from masrl.trace import Trace

    wf = TextArenaGame(GAME, ["player_0", "player_1"], examples=0)
    task = Task("ep-9", "episode 9", None, {"seed": 9, "explore_moves": 0.5})
    script = {a: [f"[{i}]" for i in range(9)] for a in ("player_0", "player_1")}  # the same moves in every sample
    games, explored = set(), 0
    for k in range(6):
        trace, _ = run_scripted(wf, task, script, trace=Trace(f"t{k}", task.id, k))
        moves = trace.state["moves"]
        mine = [m for m in moves if m["agent"] == "explore"]
        explored += len(mine)
        assert len(trace.calls) == len(moves) - len(mine)  # an explored move is no call
        assert not any(m["invalid"] for m in mine)  # drawn among the listed moves
        games.add(tuple(m["move"] for m in moves))
    assert explored > 0 and len(games) >= 3
    plain, _ = run_scripted(wf, _task(9), script)
    assert all(m["agent"] != "explore" for m in plain.state["moves"])  # a split without the option: none
    wf.check_split(DataSourceConfig(source="episodes", options={"explore_moves": 0.1}), "data.train")
    for bad in (-0.1, 1, 1.5, "0.1", True):
        with pytest.raises(ConfigError, match="explore_moves"):
            wf.check_split(DataSourceConfig(source="episodes", options={"explore_moves": bad}), "data.train")


def test_the_outcome_of_a_pooled_first_seat_is_the_score_of_the_agent_that_played():
    wf = TextArenaGame(GAME, ["player_0", "player_1"], examples=0)
    meta = {"players": ["player_0|player_1", "random"], "swap_seats": True}
    for seed in (s for s in range(60) if "player_1" in wf.seats(s, meta)):  # a game player_1 played and did not lose
        trace, _ = run_scripted(wf, Task("ep", "episode", None, {"seed": seed, **meta}),
                                {"player_1": [f"[{i}]" for i in range(9)]})
        if trace.metrics["player_1/score"] > 0:
            break
    assert "player_0/score" not in trace.metrics and trace.metrics["player_1/score"] > 0
    assert trace.metrics["outcome"] == trace.metrics["player_1/score"]

"""PettingZoo's AEC games as a workflow (``workflow: pettingzoo``), on the real library."""

import random

import pytest
from tinycfg import tiny_config

from masrl.config import load_config
from masrl.driver.checks import check_run
from masrl.errors import ConfigError
from masrl.families.games import zoo
from masrl.families.games.workflow import PettingZooGame

pytest.importorskip("pettingzoo")


def _play(game: str, moves: list[int]) -> zoo.Game:
    g = zoo.Game(game, 2, 0).start()
    for i, a in enumerate(moves):
        pid, _ = g.observe()
        assert pid == i % 2
        assert g.move(pid, f"[{a}]") is False
    return g


def test_the_environments_own_rewards_end_a_game_won_drawn_or_lost():
    won = _play("tictactoe_v3", [0, 3, 1, 4, 2])
    assert won.done and won.rewards == {0: 1.0, 1: -1.0}
    drawn = _play("tictactoe_v3", [0, 4, 8, 2, 6, 3, 1, 7, 5])
    assert drawn.done and drawn.rewards == {0: 0.0, 1: 0.0}
    c4 = _play("connect_four_v3", [0, 1, 0, 1, 0, 1, 0])  # four in column 0
    assert c4.done and c4.rewards == {0: 1.0, 1: -1.0}


def test_the_player_sees_the_board_and_the_masks_open_actions():
    g = _play("tictactoe_v3", [4])
    pid, obs = g.observe()
    assert pid == 1 and "You play O" in obs and "3 | X | 5" in obs
    assert obs.endswith("Available moves: [0], [1], [2], [3], [5], [6], [7], [8]")
    assert g.moves() == [f"[{a}]" for a in (0, 1, 2, 3, 5, 6, 7, 8)]


def test_an_action_the_mask_refuses_is_asked_again_once_then_loses():
    g = _play("tictactoe_v3", [4])
    assert g.move(1, "[4]") is True and not g.done  # taken
    assert g.move(1, "four") is True and g.done
    assert g.rewards == {0: 1.0, 1: -1.0} and g.info[1]["invalid_move"]


def test_random_games_end_with_rewards_that_sum_to_zero():
    for seed in range(20):
        for game in ("tictactoe_v3", "connect_four_v3"):
            g, rng = zoo.Game(game, 2, seed).start(), random.Random(seed)
            while not g.done:
                pid, obs = g.observe()
                g.move(pid, zoo.random_move(g, obs, rng))
            assert sum(g.rewards.values()) == 0.0 and set(g.rewards) == {0, 1}


@pytest.mark.parametrize("options, needle", [
    ({"game": "tictactoe_v2"}, "did you mean tictactoe_v3"),
    ({"game": "tictactoe_v3", "players": ["a", "b", "c"]}, "is played by 2 agents"),
    ({"game": "leduc_holdem_v4"}, "cannot import"),  # rlcard is not installed: the game's own dependency
    ({"game": "json.decoder"}, "has no env() factory"),
    ({"game": "tictactoe_v3", "players": ["player_0", "minimax"]}, "built-in player of OpenSpiel games"),
])
def test_a_bad_game_or_seat_is_a_config_error_naming_the_fix(options, needle):
    with pytest.raises(ConfigError) as e:
        PettingZooGame(**{"players": ["player_0", "player_1"], **options})
    assert needle in str(e.value)


def test_a_tiny_step_trains_on_the_shipped_config(tmp_path):
    import asyncio

    from tinycfg import prepared_trainer

    data = tiny_config("games/zoo_tictactoe_selfplay", tmp_path, steps=1)
    check_run(load_config(data=data))
    tr, _, _ = prepared_trainer(data, tmp_path)
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["failed"] == 0 and rec["rollout"]["traces"] == 6
    assert all(t.calls and t.state.get("rewards") for t in tr.last_traces)
    asyncio.run(tr.rt.controller.aclose())

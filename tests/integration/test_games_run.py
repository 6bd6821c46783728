"""A TextArena game whose environment raises fails that episode alone: the others train (a game registered in
the real library the way a user registers one)."""

from __future__ import annotations

import asyncio

import pytest

ta = pytest.importorskip("textarena")
from textarena.envs.TicTacToe.env import TicTacToeEnv  # noqa: E402
from tinycfg import tiny_config  # noqa: E402

from masrl.config import load_config  # noqa: E402
from masrl.driver.run.loop import Trainer  # noqa: E402


class FlakyTicTacToe(TicTacToeEnv):
    """TicTacToe whose move breaks on odd seeds (a bug in a game's own code)."""

    def reset(self, num_players, seed=None):
        self.flaky_seed = seed
        return super().reset(num_players=num_players, seed=seed)

    def step(self, action):
        if self.flaky_seed % 2:
            raise RuntimeError("the board went away")
        return super().step(action)


def test_a_game_that_raises_fails_its_episode_alone(tmp_path):
    from masrl.families.games.arena import library

    registry = library().envs.registration.ENV_REGISTRY
    if "FlakyTicTacToe-v0" not in registry:
        library().envs.registration.register(id="FlakyTicTacToe-v0", entry_point=FlakyTicTacToe)
    data = tiny_config("games/tictactoe_selfplay", tmp_path, steps=1)
    data["workflow"]["options"].update(game="FlakyTicTacToe-v0", examples=0)
    data["rollout"].update(tasks_per_step=8, samples_per_task=2, max_failed_fraction=0.95)
    tr = Trainer(load_config(data=data), run_dir=tmp_path)
    tr.prepare(resume=False)
    rec = asyncio.run(tr.train_step())
    traces = tr.last_traces
    failed = [t for t in traces if t.failed]
    assert failed and len(failed) < len(traces)  # some seeds are odd, some even
    assert all("FlakyTicTacToe-v0" in t.error and "the board went away" in t.error for t in failed)
    assert rec["rollout"]["failed"] == len(failed)
    assert rec["policies"]["shared"]["trained_tokens"] > 0  # the other episodes trained
    asyncio.run(tr.rt.controller.aclose())

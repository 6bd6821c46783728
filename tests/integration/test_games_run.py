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


def test_an_opponent_pool_takes_turns_receiving_the_players_weights_and_a_resume_keeps_it(tmp_path):
    data = tiny_config("games/tictactoe_pool", tmp_path, steps=3)
    for name in ("past_0", "past_1", "past_2"):
        data["policies"][name]["snapshot_every"] = 1
    data["workflow"]["options"]["examples"] = 0
    tr = Trainer(load_config(data=data), run_dir=tmp_path)
    tr.prepare(resume=False)
    host = {p: w for w in tr.rt.workers for p in w.policy_names}
    start = host["past_0"].fingerprint("past_0")
    assert host["past_1"].fingerprint("past_1") == start == host["past_2"].fingerprint("past_2")  # the untrained model
    seen = []
    for _ in range(2):
        asyncio.run(tr.train_step())
        asyncio.run(tr._after_step(_Quiet()))
        seen.append(host["player"].fingerprint("player"))
    assert seen[0] != seen[1] != start  # the player trained
    assert host["past_0"].fingerprint("past_0") == seen[0]  # step 1: the first member took the player's weights
    assert host["past_1"].fingerprint("past_1") == seen[1]  # step 2: the next one
    assert host["past_2"].fingerprint("past_2") == start  # not its turn yet
    tr.save_checkpoint()
    asyncio.run(tr.rt.controller.aclose())

    again = Trainer(load_config(data=data), run_dir=tmp_path)
    again.prepare(resume=True)
    host = {p: w for w in again.rt.workers for p in w.policy_names}
    assert host["past_0"].fingerprint("past_0") == seen[0] and host["past_1"].fingerprint("past_1") == seen[1]
    assert host["past_2"].fingerprint("past_2") == start
    asyncio.run(again.rt.controller.aclose())


class _Quiet:
    def log_step(self, step, rec):
        pass


def test_a_pool_member_must_be_a_frozen_copy_of_a_trained_policy(tmp_path):
    from masrl.driver.checks import check_run
    from masrl.errors import ConfigError

    data = tiny_config("games/tictactoe_pool", tmp_path, steps=1)
    data["policies"]["past_0"]["frozen"] = False
    with pytest.raises(ConfigError, match="policies.past_0.snapshot_of: .*set policies.past_0.frozen: true"):
        check_run(load_config(data=data))
    data["policies"]["past_0"].update(frozen=True, snapshot_of="playr")
    with pytest.raises(ConfigError, match="no policy 'playr'"):
        check_run(load_config(data=data))


def test_checkpoints_play_each_other_in_a_head_to_head_table(tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path

    from masrl.cli import main

    root = Path(__file__).resolve().parents[2]
    folders = {}
    for name, seed in (("A", 0), ("B", 1)):
        run = tmp_path / name
        args = ["train", "games/tictactoe_vs_frozen", "model=tiny-random", "train.steps=1", "train.eval_before=false",
                "train.eval_after=false", "train.save_every=1", "rollout.tasks_per_step=2", f"seed={seed}",
                "workflow.options.examples=0", f"output_dir={run}"]
        assert main(args) == 0
        folders[name] = run / "checkpoints" / "step_000001" / "player"
    cmd = [sys.executable, str(root / "scripts" / "head_to_head.py"), "games/tictactoe_vs_frozen",
           *(f"{k}={v}" for k, v in folders.items()), "U=untrained", "--games", "4", "model=tiny-random",
           "workflow.options.examples=0"]
    # 9 evaluations in child processes: ~2 min alone on 2 cores, several times that on a busy machine
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = dict(re.findall(r"^\| (A|B|U) \| ([\d. |]+) \|$", out.stdout, re.M))
    assert set(rows) == {"A", "B", "U"}, out.stdout
    cells = {r: [float(x) for x in v.split(" | ")] for r, v in rows.items()}
    assert all(len(v) == 3 and all(0.0 <= x <= 1.0 for x in v) for v in cells.values())
    ratings = dict(re.findall(r"(A|B|U) (\d+)", out.stdout.split("Elo (fitted to the table):")[1]))
    assert set(ratings) == {"A", "B", "U"} and abs(sum(map(int, ratings.values())) / 3 - 1000) <= 1


def test_compare_plays_self_play_runs_head_to_head_with_an_elo_table(tmp_path, capsys):
    """masrl compare --head-to-head: two self-play runs' latest checkpoints and the untrained model play each other
    (the second seat given a policy of its own), the table and the Elo ratings printed and on the page."""
    import re

    pytest.importorskip("pyspiel")
    from masrl.cli import main

    runs = []
    for seed in (0, 1):
        run = tmp_path / f"ttt-seed{seed}"
        assert main(["train", "games/spiel_tic_tac_toe_selfplay", "model=tiny-random", "train.steps=1",
                     "train.eval_before=false", "train.eval_after=false", "train.save_every=1",
                     "rollout.tasks_per_step=2", f"seed={seed}", f"output_dir={run}"]) == 0
        runs.append(str(run))
    capsys.readouterr()
    page = tmp_path / "c.html"
    assert main(["compare", *runs, "--out", str(page), "--head-to-head", "4", "--set", "model=tiny-random"]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^\| (untrained|ttt-seed0|ttt-seed1) \| ([\d. |]+) \|$", out, re.M))
    assert set(rows) == {"untrained", "ttt-seed0", "ttt-seed1"}, out
    assert all(len(v.split(" | ")) == 3 for v in rows.values())
    ratings = dict(re.findall(r"(untrained|ttt-seed\d) (\d+)", out.split("Elo (fitted to the table):")[1]))
    assert abs(sum(map(int, ratings.values())) / 3 - 1000) <= 1
    text = page.read_text()
    assert "Head to head" in text and '"head_to_head"' in text and '"ttt-seed1"' in text


def test_a_self_play_checkpoint_is_scored_on_a_reasoning_set_beside_the_untrained_model(tmp_path, capsys):
    """games.sh's TRANSFER: a games checkpoint evaluated under reasoning-gym's solver config (its policy starting from
    the checkpoint), and scripts/transfer_table.py's table of the two evaluations, untrained first."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("reasoning_gym")
    from masrl.cli import main

    root = Path(__file__).resolve().parents[2]
    run = tmp_path / "ttt"
    assert main(["train", "games/tictactoe_selfplay", "model=tiny-random", "train.steps=1", "train.eval_before=false",
                 "train.eval_after=false", "train.save_every=1", "rollout.tasks_per_step=2",
                 "rollout.samples_per_task=2", f"output_dir={run}"]) == 0
    ckpt = run / "checkpoints" / "step_000001" / "shared"
    common = ["model=tiny-random", "data.eval.n=7"]
    assert main(["eval", "reasoning_gym/solver", *common, f"output_dir={tmp_path / 'transfer-untrained'}"]) == 0
    capsys.readouterr()
    assert main(["eval", "reasoning_gym/solver", *common, f"policies.solver.init_from={ckpt}",
                 f"output_dir={tmp_path / 'transfer-ttt_selfplay-seed0'}"]) == 0
    assert f"solver starts from {ckpt}" in capsys.readouterr().out
    (tmp_path / "transfer-ttt_open-seed0").mkdir()  # an evaluation that failed: warned of, left out
    out = subprocess.run([sys.executable, str(root / "scripts" / "transfer_table.py"),
                          *sorted(str(p) for p in tmp_path.glob("transfer-*"))], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| arm", "| untrained", "| ttt_selfplay"]
    assert all(r.split(" | ")[1:3] == ["1", "7"] for r in rows[1:])  # one run each, the 7 held-out problems
    assert "transfer-ttt_open-seed0/eval.json is missing" in out.stderr


def test_a_greedy_self_play_group_has_nothing_to_learn_until_explore_moves_part_its_games(tmp_path):
    """A policy that plays one move per position (greedy here, collapsed in a long run) plays the same game in every
    sample of a group: each group's rewards are equal. With explore_moves the group's games part and it trains."""

    def step(explore: float, sub: str) -> dict:
        data = tiny_config("games/tictactoe_selfplay", tmp_path / sub, steps=1)
        for seat in ("player_0", "player_1"):
            data["agents"][seat]["temperature"] = 0.0
        data["rollout"].update(tasks_per_step=4, samples_per_task=4)
        data["data"]["train"]["options"] = {"explore_moves": explore} if explore else {}
        tr = Trainer(load_config(data=data), run_dir=tmp_path / sub)
        tr.prepare(resume=False)
        rec = asyncio.run(tr.train_step())
        asyncio.run(tr.rt.controller.aclose())
        return rec

    plain, explored = step(0.0, "plain"), step(0.3, "explore")
    zero = {k: a["zero_var_groups"] for k, a in plain["rollout"]["agents"].items()}
    assert zero and set(zero.values()) == {1.0}, zero
    assert plain["policies"]["shared"]["trained_tokens"] == 0
    assert min(a["zero_var_groups"] for a in explored["rollout"]["agents"].values()) < 1.0
    assert explored["policies"]["shared"]["trained_tokens"] > 0

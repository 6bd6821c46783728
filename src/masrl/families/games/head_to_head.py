"""Checkpoints of a game against each other, both seats, and an Elo rating fitted to the table
(``masrl compare RUN... --head-to-head``; ``scripts/head_to_head.py`` for any policy folders).

Each pair plays the held-out games of one config (its own seeds, seats swapped every other game) with the row's
weights in the first seat agent's policy and the column's in the second's (``init_from`` on both, the second
frozen; a self-play config's second seat is given a policy of its own), through ``masrl eval`` in a child
process; a cell is the row's score (win 1, draw 0.5, loss 0) over the games. ``untrained`` is the config's model as
it loads. The diagonal is a player against itself. The Elo ratings
are the logistic model's (400 points a factor of ten in odds) fitted to the off-diagonal cells, the mean at 1000,
so that checkpoints of several runs and setups read as one scale.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from masrl.errors import MasrlError

UNTRAINED = "untrained"  # a player with no checkpoint: the config's model as it loads
OPPONENT = "h2h_opponent"  # the second seat's policy where both seats share one (self-play)


def seat_policies(config_file: Path) -> tuple[str, str, str]:
    """The first seat's agent, and the policies of the first two seats' agents, of a game config."""
    data = yaml.safe_load(Path(config_file).read_text())
    players = (data.get("workflow", {}).get("options") or {}).get("players")
    if not isinstance(players, list) or len(players) < 2:
        raise MasrlError(f"{config_file}: head-to-head plays two seats; its workflow.options.players has no two")
    first, second = players[0], players[1].split("|")[0]
    return first, data["agents"][first]["policy"], data["agents"][second]["policy"]


def score(config_file: Path, row: str, col: str, games: int, overrides: list[str]) -> float:
    """The row player's score against the column player over ``games`` held-out games, both seats."""
    _, p_row, p_col = seat_policies(config_file)
    seat = []
    if p_col == p_row:  # self-play: the second seat gets a policy of its own for the column's weights
        second = yaml.safe_load(Path(config_file).read_text())["workflow"]["options"]["players"][1].split("|")[0]
        p_col, seat = OPPONENT, [f"agents.{second}.policy={OPPONENT}"]
    with tempfile.TemporaryDirectory() as out:
        start = [f"policies.{p}.init_from={folder}" for p, folder in ((p_row, row), (p_col, col)) if folder != UNTRAINED]
        cmd = [sys.executable, "-m", "masrl.cli", "eval", str(config_file), f"data.eval.n={games}",
               "workflow.options.swap_seats=true", *seat, *start, f"policies.{p_col}.frozen=true",
               f"output_dir={out}", *overrides]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise MasrlError(f"head-to-head {row} against {col}: masrl eval failed: "
                             + " | ".join(done.stderr.strip().splitlines()[-3:]))
        summary = json.loads((Path(out) / "eval.json").read_text())
    # the first seat's agent's score over every game (``outcome``), also where it never moved
    return float(summary["outcome"])


def elo(names: list[str], cells: dict[tuple[str, str], float], iters: int = 2000) -> dict[str, float]:
    """Ratings whose expected scores best fit ``cells`` (row's score against column): gradient ascent on the
    log-likelihood of the logistic model, the mean held at 1000, each clipped to +-800 around it (a player who won
    or lost everything ends far from the others, at a finite rating)."""
    r = {n: 0.0 for n in names}
    pairs = [(a, b) for a in names for b in names if a != b and (a, b) in cells]
    for _ in range(iters):
        grad = {n: 0.0 for n in names}
        for a, b in pairs:
            expected = 1.0 / (1.0 + 10 ** ((r[b] - r[a]) / 400.0))
            grad[a] += cells[(a, b)] - expected
            grad[b] -= cells[(a, b)] - expected
        for n in names:
            r[n] = max(-800.0, min(800.0, r[n] + 20.0 * grad[n]))
        mean = sum(r.values()) / len(r)
        r = {n: v - mean for n, v in r.items()}
    return {n: 1000.0 + v for n, v in r.items()}


def head_to_head(config_file: Path, players: dict[str, str], games: int, overrides: list[str] | None = None,
                 log=None) -> dict:
    """Every ordered pair of ``players`` (name -> policy folder or ``untrained``): the table and the ratings."""
    names = list(players)
    table: dict[tuple[str, str], float] = {}
    for r in names:
        for c in names:
            table[(r, c)] = score(config_file, players[r], players[c], games, list(overrides or []))
        if log is not None:
            log(f"[masrl] head-to-head: {r} played every column")
    return {"names": names, "games": games, "table": {r: {c: table[(r, c)] for c in names} for r in names},
            "elo": elo(names, table) if len(names) > 1 else {names[0]: 1000.0}}


def runs_head_to_head(runs: list[tuple[str, Path, Path]], games: int, overrides: list[str] | None = None,
                      log=None) -> dict:
    """Game runs' latest checkpoints (each run's first seat's policy) and the untrained model against each other,
    on the first run's config (``masrl compare RUN... --head-to-head N``)."""
    players = {UNTRAINED: UNTRAINED}
    for name, config_file, checkpoint in runs:
        _, policy, _ = seat_policies(config_file)
        folder = Path(checkpoint) / policy
        if not folder.is_dir():
            raise MasrlError(f"{name}: its latest checkpoint has no policy folder {policy} (the first seat's)")
        players[name] = str(folder)
    return head_to_head(runs[0][1], players, games, overrides, log=log)


def table_lines(h2h: dict) -> list[str]:
    names = h2h["names"]
    out = [f"head-to-head: row's score against column (win 1, draw 0.5), {h2h['games']} held-out games, both seats",
           "| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    out += [f"| {r} | " + " | ".join(f"{h2h['table'][r][c]:.3f}" for c in names) + " |" for r in names]
    out.append("Elo (fitted to the table): " + ", ".join(f"{n} {h2h['elo'][n]:.0f}" for n in names))
    return out

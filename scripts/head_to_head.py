"""Checkpoints of a game against each other, both seats: a table of each row's score against each column.

    .venv/bin/python scripts/head_to_head.py games/tictactoe_vs_frozen A=runs/x/checkpoints/best/player \\
        B=runs/y/checkpoints/step_000040/player C=untrained [--games 64] [KEY=VALUE ...]

Each pair plays the held-out games of the config (new seeds, seats swapped every other game: ``swap_seats``) with
the row's weights in the config's first seat agent's policy and the column's in the second's (``init_from`` on
both, the second frozen), through ``masrl eval``; a cell is the row's score (win 1, draw 0.5, loss 0), averaged
over the games. ``NAME=untrained`` is the config's model as it loads, with no checkpoint. The diagonal is a policy
against itself. Below the table, an Elo rating per player fitted to the off-diagonal cells (logistic, 400 points
a factor of ten in odds, the mean at 1000), so that a longer list of checkpoints reads as one scale. KEY=VALUE
overrides go to every evaluation (e.g. ``model=tiny-random``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
UNTRAINED = "untrained"  # a player with no checkpoint: the config's model as it loads


def seat_policies(config: str) -> tuple[str, str, str]:
    """The first seat's agent, and the policies of the first two seats' agents."""
    from masrl.families import config_path

    data = yaml.safe_load(config_path(config).read_text())
    players = data["workflow"]["options"]["players"]
    first, second = players[0], players[1].split("|")[0]
    return first, data["agents"][first]["policy"], data["agents"][second]["policy"]


def score(config: str, row: str, col: str, games: int, overrides: list[str]) -> float:
    _, p_row, p_col = seat_policies(config)
    with tempfile.TemporaryDirectory() as out:
        start = [f"policies.{p}.init_from={folder}" for p, folder in ((p_row, row), (p_col, col)) if folder != UNTRAINED]
        cmd = [sys.executable, "-m", "masrl.cli", "eval", config, f"data.eval.n={games}",
               "workflow.options.swap_seats=true", *start, f"policies.{p_col}.frozen=true", f"output_dir={out}",
               *overrides]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
        summary = json.loads((Path(out) / "eval.json").read_text())
    # the first seat's agent's score over every game (``outcome``): also where it never moved (an opponent that
    # opened with two invalid moves), which leaves it out of the per-agent figures
    return float(summary["outcome"])


def elo(names: list[str], cells: dict[tuple[str, str], float], iters: int = 2000) -> dict[str, float]:
    """Ratings whose expected scores best fit ``cells`` (row's score against column, both seats): gradient ascent on
    the log-likelihood of the logistic model, the mean held at 1000. Each step clips the ratings to +-800 around the
    mean, so a player who won or lost everything ends far from the others but at a finite rating."""
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("players", nargs="+", help="NAME=FOLDER: a policy's folder in a checkpoint, or KEY=VALUE overrides")
    ap.add_argument("--games", type=int, default=64)
    a = ap.parse_intermixed_args()
    named = {k: v for k, v in (x.split("=", 1) for x in a.players) if v == UNTRAINED or Path(v).is_dir()}
    overrides = [x for x in a.players if x.split("=", 1)[0] not in named]
    names = list(named)
    print(f"{a.config}: row's score against column (win 1, draw 0.5), {a.games} held-out games, both seats\n")
    print("| | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    table: dict[tuple[str, str], float] = {}
    for r in names:
        for c in names:
            table[(r, c)] = score(a.config, named[r], named[c], a.games, overrides)
        print(f"| {r} | " + " | ".join(f"{table[(r, c)]:.3f}" for c in names) + " |", flush=True)
    if len(names) > 1:
        ratings = elo(names, table)
        print("\nElo (fitted to the table): " + ", ".join(f"{n} {ratings[n]:.0f}" for n in names))


if __name__ == "__main__":
    main()

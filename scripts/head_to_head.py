"""Checkpoints of a game against each other, both seats: a table of each row's score against each column.

    .venv/bin/python scripts/head_to_head.py games/tictactoe_vs_frozen A=runs/x/checkpoints/best/player \\
        B=runs/y/checkpoints/step_000040/player C=untrained [--games 64] [KEY=VALUE ...]

Each pair plays the held-out games of the config (new seeds, seats swapped every other game: ``swap_seats``) with
the row's weights in the config's first seat agent's policy and the column's in the second's (``init_from`` on
both, the second frozen), through ``masrl eval``; a cell is the row's score (win 1, draw 0.5, loss 0), averaged
over the games. ``NAME=untrained`` is the config's model as it loads, with no checkpoint. The diagonal is a policy
against itself. KEY=VALUE overrides go to every evaluation (e.g.
``model=tiny-random``).
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
    for r in names:
        cells = [f"{score(a.config, named[r], named[c], a.games, overrides):.3f}" for c in names]
        print(f"| {r} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

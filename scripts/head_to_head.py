"""Policy folders of a game against each other, both seats: a table of each row's score against each column, and an
Elo rating fitted to it (``masrl.families.games.head_to_head``; ``masrl compare RUN... --head-to-head N`` does the
same for runs' latest checkpoints).

    .venv/bin/python scripts/head_to_head.py games/tictactoe_vs_frozen A=runs/x/checkpoints/best/player \\
        B=runs/y/checkpoints/step_000040/player C=untrained [--games 64] [KEY=VALUE ...]

``NAME=untrained`` is the config's model as it loads, with no checkpoint; KEY=VALUE overrides go to every evaluation
(e.g. ``model=tiny-random``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from masrl.families import config_path
from masrl.families.games.head_to_head import UNTRAINED, head_to_head, table_lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("players", nargs="+", help="NAME=FOLDER: a policy's folder in a checkpoint, or KEY=VALUE overrides")
    ap.add_argument("--games", type=int, default=64)
    a = ap.parse_intermixed_args()
    named = {k: v for k, v in (x.split("=", 1) for x in a.players) if v == UNTRAINED or Path(v).is_dir()}
    overrides = [x for x in a.players if x.split("=", 1)[0] not in named]
    for line in table_lines(head_to_head(config_path(a.config), named, a.games, overrides, log=print)):
        print(line)


if __name__ == "__main__":
    main()

"""Does training on games move a reasoning score? The held-out figures of ``masrl eval`` runs (each folder's
eval.json), grouped by arm, as a markdown table: the accuracy (mean and range over seeds) overall and per data
source, the untrained model's first. scripts/experiments/games.sh (TRANSFER=...) writes the folders as
``transfer-ARM-seedS`` and ``transfer-untrained``.

    python3 scripts/transfer_table.py runs/games-*/transfer-*
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def accuracy(summary: dict) -> float:
    """The mean accuracy over the run's agents (one agent in the single-agent configs it is meant for)."""
    agents = summary.get("agents") or {}
    vals = [a["accuracy"] for a in agents.values() if "accuracy" in a]
    return sum(vals) / len(vals) if vals else float(summary.get("outcome", 0.0))


def arm_of(folder: Path) -> str:
    m = re.fullmatch(r"transfer-(.+?)(?:-seed\d+)?", folder.name)
    return m.group(1) if m else folder.name


def table(folders: list[Path]) -> str:
    arms: dict[str, list[dict]] = {}
    for f in folders:
        path = f / "eval.json"
        if not path.is_file():
            print(f"warning: {path} is missing (that evaluation failed: see {f}.log)", file=sys.stderr)
            continue
        arms.setdefault(arm_of(f), []).append(json.loads(path.read_text()))
    if not arms:
        raise SystemExit("no eval.json in the folders given")
    sources = sorted({s for runs in arms.values() for r in runs for s in r.get("by_source", {})})

    def cell(vals: list[float]) -> str:
        mean = sum(vals) / len(vals)
        return f"{mean:.3f}" if len(vals) == 1 else f"{mean:.3f} ({min(vals):.3f}-{max(vals):.3f})"

    lines = ["| arm | runs | held-out problems | accuracy | " + " | ".join(sources) + " |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in sources) + " |"]
    for arm in sorted(arms, key=lambda a: (a != "untrained", a)):
        runs = arms[arm]
        per = [cell([accuracy(r["by_source"][s]) for r in runs if s in r.get("by_source", {})] or [0.0])
               for s in sources]
        lines.append(f"| {arm} | {len(runs)} | {runs[0].get('traces', 0)} | {cell([accuracy(r) for r in runs])} | "
                     + " | ".join(per) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table([Path(a) for a in sys.argv[1:]]))

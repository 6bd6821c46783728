"""Commands a task family adds to the CLI without the CLI knowing the family: data commands (its ``DATA_COMMANDS``:
``masrl data NAME --out ...`` writes that family's generated tasks or world to files) and comparisons (its
``COMPARISONS``: ``masrl compare RUN... --head-to-head N`` has the runs' checkpoints play each other)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from masrl.errors import MasrlError


@dataclass(frozen=True)
class DataCommand:
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]  # adds the command's options to its parser
    run: Callable[[argparse.Namespace], int]  # does it; the command's exit status


@dataclass(frozen=True)
class Comparison:
    """A table ``masrl compare`` adds over the runs it compares: ``run(runs, n, overrides, log)``, ``runs`` each run's
    ``(name, config file, latest checkpoint folder)``, gives its data (kept in the page); ``lines(data)`` its text
    table (the page's notes and the terminal's)."""

    run: Callable[[list[tuple[str, Path, Path]], int, list[str], Callable | None], dict]
    lines: Callable[[dict], list[str]]


def output_file(path: str, what: str) -> Path:
    """``path`` as a Path whose folder exists (created when missing); refused when it is a folder."""
    p = Path(path)
    if p.is_dir():
        raise MasrlError(f"{what} {path}: that is a directory; give a file name, e.g. {p / 'tasks.jsonl'}")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p

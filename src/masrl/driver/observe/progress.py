"""Progress of a rollout or an evaluation: a live bar on a terminal; in a log file (a GPU job,
``nohup``, a scheduler), where a live bar draws nothing, a plain line every ``every_s`` seconds so a
long evaluation shows it is alive and how far it got."""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def _clock_text(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


class LineProgress:
    """Counts finished items and prints ``label: done/total after XmYYs`` at most every ``every_s``."""

    def __init__(self, console: Console, label: str, total: int, every_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.console, self.label, self.total, self.every_s, self.clock = console, label, total, every_s, clock
        self.done = 0
        self.start = self.last = clock()

    def advance(self) -> None:
        self.done += 1
        self.tick()

    def tick(self) -> None:
        """Print a line if ``every_s`` has passed since the last one (also called with no new item)."""
        now = self.clock()
        if now - self.last >= self.every_s and self.done < self.total:
            self.last = now
            self.console.print(f"  {self.label}: {self.done}/{self.total} done after {_clock_text(now - self.start)}",
                               markup=False, highlight=False)


@contextmanager
def progress(console: Console, label: str, total: int, every_s: float = 60.0) -> Iterator[Callable[[], None]]:
    """Yields ``advance()``, to call once per finished item. A terminal gets a transient bar; anything
    else gets ``LineProgress`` lines (and one more each ``every_s`` while nothing finishes)."""
    if console.is_terminal:
        with Progress(TextColumn(f"  {label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as prog:
            bar = prog.add_task(label, total=total)
            yield lambda: prog.advance(bar)
        return
    lines = LineProgress(console, label, total, every_s)

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(min(every_s, 5.0))
            lines.tick()

    beat = asyncio.get_running_loop().create_task(heartbeat())  # rollouts run in the event loop
    try:
        yield lines.advance
    finally:
        beat.cancel()

"""Progress lines where no live bar can be drawn (output to a file): at most one per interval, with
the count and the time, and none once everything finished."""

from __future__ import annotations

import asyncio
import io

from rich.console import Console

from masrl.driver.observe.progress import LineProgress, progress


def test_lines_come_at_most_once_an_interval_with_the_count_and_the_time():
    out = io.StringIO()
    console = Console(file=out, width=200)
    now = [0.0]
    lines = LineProgress(console, "eval", 4, every_s=60.0, clock=lambda: now[0])
    now[0] = 30.0
    lines.advance()  # 30 s: too soon
    now[0] = 61.0
    lines.advance()  # 61 s: a line
    now[0] = 90.0
    lines.tick()  # 29 s after the last line: none
    now[0] = 125.0
    lines.tick()  # a minute with nothing finished still prints (the run is alive)
    now[0] = 400.0
    lines.advance()
    lines.advance()  # all done: no line for the finished count
    assert out.getvalue().splitlines() == ["  eval: 2/4 done after 1m01s", "  eval: 2/4 done after 2m05s",
                                           "  eval: 3/4 done after 6m40s"]


def test_a_file_console_gets_heartbeat_lines_while_nothing_finishes():
    out = io.StringIO()
    console = Console(file=out, width=200)
    assert not console.is_terminal

    async def slow_rollout():
        with progress(console, "rollout", 2, every_s=0.05) as advance:
            await asyncio.sleep(0.3)  # one long engine batch: nothing finishes for a while
            advance()
            advance()

    asyncio.run(slow_rollout())
    lines = out.getvalue().splitlines()
    assert lines and all(line.startswith("  rollout: 0/2 done after 0m00s") for line in lines)

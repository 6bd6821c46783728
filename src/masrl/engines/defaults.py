"""What an engine declares when it has none of the optional capabilities of the ``Engine`` protocol (engines/base.py).

Its own module: base.py's ``make_engine`` imports every engine, so the engines cannot import base.py back.
"""

from __future__ import annotations

from typing import Callable


class EngineDefaults:
    """The capabilities an engine without them declares: no joined batches, no mid-call weight swaps, no counters.
    Such an engine runs a batch to its end (its ``_generate``) and then tells ``on_done`` of each row."""

    joins_running_decode = False
    swaps_between_steps = False

    def generate(self, requests: list, on_done: Callable | None = None) -> list:
        outputs = self._generate(requests)
        for i, o in enumerate(outputs if on_done is not None else []):
            on_done(i, o)
        return outputs

    def at_boundary(self, fn: Callable[[], None]) -> None:
        fn()

    def take_counters(self) -> dict[str, float]:
        return {}

    def stale_weights(self) -> list[str]:
        """An engine that reads the live parameters holds no copy that can go stale."""
        return []

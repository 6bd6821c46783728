"""Named points where the fault tests kill a run (``kill -9``) to check that a resume loses at most a
step. Inert unless ``MASRL_FAULT_POINT`` names the point (e.g. ``update:3``): then the process writes
``MASRL_FAULT_MARKER`` and waits to be killed."""

from __future__ import annotations

import os
import time


def point(name: str) -> None:
    if os.environ.get("MASRL_FAULT_POINT") != name:
        return
    marker = os.environ.get("MASRL_FAULT_MARKER")
    if marker:
        with open(marker, "w") as f:
            f.write(name)
    time.sleep(120)

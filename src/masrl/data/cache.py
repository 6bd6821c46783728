"""masrl's cache folder, one root for everything it writes once and reuses: converted models and
tokenizers (``models``), the QA world and its BM25 index (``data``), the sandbox's files (``tools``).
Import it from here."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$MASRL_CACHE_DIR``, else ``$XDG_CACHE_HOME/masrl`` (``~/.cache/masrl``)."""
    root = os.environ.get("MASRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "masrl"
    )
    return Path(root)

"""The ``masrl`` command: ``main`` parses the arguments and runs a subcommand (``main.py``);
``tools`` holds the data and sandbox helpers, ``report`` and ``compare`` write HTML pages through
one page helper (``page``)."""

from masrl.cli.main import main

__all__ = ["main"]

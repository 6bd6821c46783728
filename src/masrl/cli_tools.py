"""CLI commands for tools and data (retriever server, generators). Filled in by the tools issue."""

from __future__ import annotations


def add_commands(sub) -> None:
    return None

"""Games between policies: TextArena's two- and multi-player games as they are (``workflow: textarena``), each
seat an agent mapped to a policy: self-play on one policy, two policies against each other, one against a frozen
copy of the untrained model or a random-legal-move player (docs/games.md)."""

from __future__ import annotations

from masrl.families.games.workflow import OpenSpielGame, TextArenaGame

WORKFLOWS = {"textarena": TextArenaGame, "openspiel": OpenSpielGame}

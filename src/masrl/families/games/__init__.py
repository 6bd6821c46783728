"""Games between policies: TextArena's, OpenSpiel's and PettingZoo's games as they are (``workflow: textarena``,
``openspiel``, ``pettingzoo``), each seat an agent mapped to a policy: self-play on one policy, two policies against
each other, one against a frozen copy of the untrained model or a random-legal-move player (docs/games.md)."""

from __future__ import annotations

from masrl.families.games.workflow import OpenSpielGame, PettingZooGame, TextArenaGame

WORKFLOWS = {"textarena": TextArenaGame, "openspiel": OpenSpielGame, "pettingzoo": PettingZooGame}

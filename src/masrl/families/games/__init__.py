"""Games between policies: TextArena's, OpenSpiel's and PettingZoo's games as they are (``workflow: textarena``,
``openspiel``, ``pettingzoo``), each seat an agent mapped to a policy: self-play on one policy, two policies against
each other, one against a frozen copy of the untrained model or a random-legal-move player (docs/games.md)."""

from __future__ import annotations

from masrl.data.commands import Comparison
from masrl.families.games.head_to_head import runs_head_to_head, table_lines
from masrl.families.games.workflow import OpenSpielGame, PettingZooGame, TextArenaGame

WORKFLOWS = {"textarena": TextArenaGame, "openspiel": OpenSpielGame, "pettingzoo": PettingZooGame}
COMPARISONS = {"head_to_head": Comparison(runs_head_to_head, table_lines)}  # masrl compare --head-to-head N

"""PettingZoo's AEC games, as they are: any environment of its Agent Environment Cycle API (``agent_iter``,
``last``, ``step``, action masks) by name (``tictactoe_v3``, ``connect_four_v3``: PettingZoo's classic games) or as
``package.module`` (any module with an ``env()`` factory, yours included) (``pettingzoo==1.27.0``).

The same face as ``arena`` and ``spiel``, so that one game workflow plays it: seat i is the environment's i-th
``possible_agents`` entry; a player sees the board (for tictactoe and connect_four a grid written from the
environment's own board, each open cell or column named by its action number; for any other game its observation
array as numbers) and the legal moves, the action mask's open actions, each in brackets (``[4]``). The
environment's rewards are summed over the game per agent. A move the mask does not allow is asked for again once; a
second one ends the game lost by that player (-1; the other +1 in a two-player game, else 0).
Environments that take a seed are reset with the episode's seed.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import random
import re
from dataclasses import dataclass, field

from masrl.errors import ConfigError, InfraError

VERSION = "1.27.0"
EXAMPLE_SEED = 90_210


class ZooError(InfraError):
    """The library raised inside an episode: that episode fails (dropped, counted), the run goes on."""


ArenaError = ZooError


def library():
    try:
        import pettingzoo
    except ImportError:
        raise ConfigError(f"workflow 'pettingzoo' needs PettingZoo: pip install 'pettingzoo=={VERSION}' pygame (or "
                          f"the package's extra: pip install -e '.[games]')") from None
    return pettingzoo


def classic_names() -> list[str]:
    import pkgutil

    library()
    import pettingzoo.classic as classic

    return sorted(m.name for m in pkgutil.iter_modules(classic.__path__) if re.search(r"_v\d+$", m.name))


@functools.lru_cache(maxsize=32)
def factory(game: str):
    """The ``env()`` factory of ``game``: a PettingZoo classic name or a ``package.module``."""
    path = game if "." in game else f"pettingzoo.classic.{game}"
    if "." not in game and game not in classic_names():
        close = difflib.get_close_matches(game, classic_names(), n=4, cutoff=0.5)
        raise ConfigError(f"workflow.options.game: PettingZoo {VERSION} has no classic game '{game}'"
                          + (f"; did you mean {', '.join(close)}?" if close else "")
                          + f" (classic: {', '.join(classic_names())}; or a module with an env() factory)")
    try:
        module = importlib.import_module(path)
    except Exception as exc:  # a missing dependency of the game (pygame, chess, rlcard) or your module's own error
        raise ConfigError(f"workflow.options.game: cannot import '{path}': {type(exc).__name__}: {str(exc)[:300]}"
                          ) from None
    if not callable(getattr(module, "env", None)):
        raise ConfigError(f"workflow.options.game: '{path}' has no env() factory (a PettingZoo AEC environment)")
    return module.env


def check_game(game: str, players: int, key: str = "workflow.options.game") -> None:
    g = Game(game, players, 0)
    try:
        g.start()
    except ZooError as exc:
        raise ConfigError(f"{key}: '{game}' does not start: {exc}") from None
    n = len(g.agents)
    if n != players:
        raise ConfigError(f"{key}: '{game}' is played by {n} agents ({', '.join(g.agents)}), but "
                          f"workflow.options.players lists {players} seats; give one agent per seat")
    if g.mask() is None:
        raise ConfigError(f"{key}: '{game}' gives no action mask (observation['action_mask'] or "
                          f"info['action_mask']); masrl shows the legal moves from it")


def moves_known(game: str, players: int) -> bool:
    return True


@dataclass
class Game:
    """One episode of a PettingZoo AEC environment."""

    game: str
    players: int
    seed: int
    env: object = None
    agents: list[str] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    rewards: dict[int, float] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    done: bool = False
    errors: dict[int, int] = field(default_factory=dict)

    def _guard(self, what: str, fn, *args):
        try:
            return fn(*args)
        except (ZooError, ConfigError):
            raise
        except Exception as exc:
            raise ZooError(f"PettingZoo '{self.game}' (seed {self.seed}) raised in {what}: {type(exc).__name__}: "
                           f"{str(exc)[:300]}") from exc

    def start(self) -> "Game":
        self.env = self._guard("env", factory(self.game))
        self._guard("reset", lambda: self.env.reset(seed=self.seed % 2**31))
        self.agents = list(self.env.possible_agents)
        self.totals = {a: 0.0 for a in self.agents}
        self._collect()
        self._settle()
        return self

    def _collect(self) -> None:
        for a, r in (getattr(self.env, "rewards", None) or {}).items():
            self.totals[a] = self.totals.get(a, 0.0) + float(r)

    def _settle(self) -> None:
        """Step the agents whose game is over (``step(None)``, as the AEC loop asks) until one is to move."""
        for _ in range(10 * max(1, len(self.agents))):
            if not self.env.agents:
                return self.finish()
            a = self.env.agent_selection
            if not (self.env.terminations.get(a) or self.env.truncations.get(a)):
                return
            self._guard("step(None)", self.env.step, None)
            self._collect()
        self.finish()

    def observe(self) -> tuple[int, str]:
        a = self.env.agent_selection
        pid = self.agents.index(a)
        return pid, self._guard("observe", render, self, pid)

    def mask(self) -> list[int] | None:
        a = self.env.agent_selection
        obs = self.env.observe(a)
        m = obs.get("action_mask") if isinstance(obs, dict) else None
        if m is None:
            m = (self.env.infos.get(a) or {}).get("action_mask")
        return None if m is None else [int(i) for i, ok in enumerate(m) if ok]

    def moves(self) -> list[str]:
        return [f"[{a}]" for a in (self.mask() or [])]

    def move(self, pid: int, action: str) -> bool:
        m = re.fullmatch(r"\s*\[?\s*(\d{1,6})\s*\]?\s*", action or "")
        legal = self.mask() or []
        if m and int(m.group(1)) in legal:
            self._guard("step", self.env.step, int(m.group(1)))
            self._collect()
            self._settle()
            return False
        self.errors[pid] = self.errors.get(pid, 0) + 1
        if self.errors[pid] >= 2:
            self.rewards = {i: (-1.0 if i == pid else (1.0 if len(self.agents) == 2 else 0.0))
                            for i in range(len(self.agents))}
            self.info = {pid: {"invalid_move": True, "reason": f"Player {pid} made an invalid move twice "
                                                              f"({str(action)[:60]!r})"}}
            self.done = True
        return True

    def finish(self) -> None:
        if self.done:
            return
        self.rewards = {i: self.totals.get(a, 0.0) for i, a in enumerate(self.agents)}
        self.info = {"reason": "the game ended"}
        self.done = True


def legal_moves(game: Game, observation: str, *, strict: bool = True) -> list[str]:
    return game.moves()


def random_move(game: Game, observation: str, rng: random.Random) -> str:
    return rng.choice(game.moves())


# -- what a player sees ------------------------------------------------------------------------------------------

def render(game: Game, pid: int) -> str:
    base = game.env.unwrapped
    name = type(base).__module__.split(".")[-1]
    writer = {"tictactoe": _tictactoe, "connect_four": _connect_four}.get(name)
    body = writer(base, pid) if writer else _numbers(game)
    return f"You are Player {pid}.\n{body}\nAvailable moves: {', '.join(game.moves())}"


def _tictactoe(base, pid: int) -> str:
    """The board from the environment's own squares (0 empty, 1 first player, 2 second), open cells by action."""
    marks = {1: "X", 2: "O"}
    cells = [marks.get(v, str(i)) for i, v in enumerate(base.board.squares)]
    rows = [" | ".join(cells[r * 3:(r + 1) * 3]) for r in range(3)]
    return f"You play {'X' if pid == 0 else 'O'}. Board (a number is an open cell: play it as [number]):\n" + \
        "\n".join(rows)


def _connect_four(base, pid: int) -> str:
    marks = {0: ".", 1: "X", 2: "O"}
    board = list(base.board)
    rows = ["".join(marks.get(int(v), "?") for v in board[r * 7:(r + 1) * 7]) for r in range(6)]
    return (f"You play {'X' if pid == 0 else 'O'}. Board, top row first; play a column as [0] to [6]:\n"
            + "\n".join(rows) + "\n0123456")


def _numbers(game: Game) -> str:
    """Any other game: its observation for the player to move, as numbers."""
    import numpy as np

    obs = game.env.observe(game.env.agent_selection)
    arr = obs.get("observation") if isinstance(obs, dict) else obs
    return "Observation: " + np.array2string(np.asarray(arr), threshold=2000, max_line_width=200)

"""TextArena, as it is: its games by id, its observations, moves, rules and outcomes (``textarena==0.7.4``).

masrl adds nothing to a game. ``make(game, players, seed)`` starts the library's environment; ``Game`` wraps one
episode: whose turn it is and what that player observes (``get_observation``), a move (``step``: the library
judges it, and its own rule for invalid moves applies, by default one retry and then the game is lost), and the
end (``close``: each player's reward, +1 / -1 / 0 in the two-player games, and the library's account of why).
Any exception the library raises is an ``ArenaError`` naming the game and the seed, so that one broken episode
fails alone.

``legal_moves(game, observation)``: the moves the observation lists (``Available Moves: '[0]', '[1]'`` in
TicTacToe, ``Your available actions are: '[check]', '[bet]'`` in Kuhn Poker), or, for a game whose screen lists
none, read from the game's own state where masrl knows how (``STATE_MOVES``: ConnectFour's open columns, Nim's
removals). The random player, the openings, ``explore_moves`` and the prompt's worked turns draw from them; a
game with neither (``moves_known``) is refused for those before any model loads, naming why.
"""

from __future__ import annotations

import difflib
import random
import re
from dataclasses import dataclass, field

from masrl.errors import ConfigError, InfraError

VERSION = "0.7.4"
_LISTED = re.compile(r"available (?:moves|actions)[^\n]*", re.I)
_MOVE = re.compile(r"'(\[[^\[\]']{1,60}\])'")


class ArenaError(InfraError):
    """The library raised inside an episode: that episode fails (dropped, counted), the run goes on."""


def library():
    try:
        import textarena
    except ImportError:
        raise ConfigError(f"workflow 'textarena' needs the TextArena library: pip install 'textarena=={VERSION}' (or "
                          f"the package's extra: pip install -e '.[games]')") from None
    return textarena


def game_ids() -> list[str]:
    return sorted(library().envs.registration.ENV_REGISTRY)


def check_game(game: str, players: int, key: str = "workflow.options.game") -> None:
    """The game exists and takes ``players`` players (both checked before any model loads)."""
    ids = game_ids()
    if game not in ids:
        close = difflib.get_close_matches(game, ids, n=4, cutoff=0.6)
        raise ConfigError(f"{key}: TextArena {VERSION} has no game '{game}'"
                          + (f"; did you mean {', '.join(close)}?" if close else "")
                          + f" ({len(ids)} ids: textarena.envs.registration.ENV_REGISTRY; '-train' ids show the "
                            f"board and the last messages rather than the whole history)")
    try:
        env = library().make(game)
        env.reset(num_players=players, seed=0)
    except Exception as exc:  # the library's own refusal, e.g. "The number of players has to be 2"
        raise ConfigError(f"{key}: '{game}' does not start with {players} players (workflow.options.players lists "
                          f"one agent per seat): {type(exc).__name__}: {str(exc)[:300]}") from None


def listed_moves(observation: str) -> list[str]:
    """The moves the latest 'available moves' line of ``observation`` lists (none when it lists none)."""
    lines = _LISTED.findall(observation)
    return _MOVE.findall(lines[-1]) if lines else []


def _connect_four(state: dict) -> list[str]:
    return [f"[col {c}]" for c, cell in enumerate(state["board"][0]) if cell == "."]


def _nim(state: dict) -> list[str]:
    return [f"[{i} {q}]" for i, n in enumerate(state["piles"]) for q in range(1, int(n) + 1)]


# games whose screen lists no moves: their legal moves read from the library's own game state (by env class)
STATE_MOVES = {"ConnectFourEnv": _connect_four, "NimEnv": _nim}


def _base_env(env):
    """The library's environment under its wrappers (each keeps the one it wraps as ``env``)."""
    seen = 0
    while hasattr(env, "env") and type(env).__name__ not in STATE_MOVES and seen < 20:
        env, seen = env.env, seen + 1
    return env


def moves_known(game: str, players: int) -> bool:
    """Whether masrl can tell this game's legal moves: its opening screen lists them, or its state does."""
    g = Game(game, players, 0).start()
    return bool(legal_moves(g, g.observe()[1], strict=False))


def legal_moves(game: "Game", observation: str, *, strict: bool = True) -> list[str]:
    """The moves of the player to move: those ``observation`` lists, else those the game's state allows."""
    moves = listed_moves(observation)
    if moves:
        return moves
    base = _base_env(game.env)
    reader = STATE_MOVES.get(type(base).__name__)
    if reader is not None:
        moves = game._guard("its state", lambda: reader(base.state.game_state))
    if not moves and strict:
        raise ArenaError(f"no legal moves known in {game.game} (seed {game.seed}): its screen lists none and masrl "
                         f"reads the state of {', '.join(sorted(STATE_MOVES))} only")
    return moves


def random_move(game: "Game", observation: str, rng: random.Random) -> str:
    """A move chosen at random among the legal ones."""
    return rng.choice(legal_moves(game, observation))


EXAMPLE_SEED = 90_210  # the worked turns' games: seeds no split draws (episodes' seeds are 48-bit draws)


@dataclass
class Game:
    """One episode of a TextArena game."""

    game: str
    players: int
    seed: int
    env: object = None
    rewards: dict[int, float] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    done: bool = False

    def _guard(self, what: str, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            raise ArenaError(f"TextArena '{self.game}' (seed {self.seed}) raised in {what}: {type(exc).__name__}: "
                             f"{str(exc)[:300]}") from exc

    def start(self) -> "Game":
        self.env = self._guard("make", library().make, self.game)
        self._guard("reset", lambda: self.env.reset(num_players=self.players, seed=self.seed))
        return self

    def observe(self) -> tuple[int, str]:
        """Whose turn it is, and what that player sees."""
        pid, obs = self._guard("get_observation", self.env.get_observation)
        return int(pid), obs if isinstance(obs, str) else str(obs)

    def move(self, pid: int, action: str) -> bool:
        """Play ``action`` for player ``pid`` (whose turn it is); whether the library judged it invalid: it asked
        for the move again (its error count is up), or, out of retries, the game ended lost for that reason."""
        done, _ = self._guard("step", self.env.step, action)
        if done:
            self.finish()
            return bool((self.info.get(pid) or {}).get("invalid_move"))
        return int(getattr(getattr(self.env, "state", None), "error_count", 0) or 0) > 0

    def finish(self) -> None:
        if self.done:
            return
        rewards, info = self._guard("close", self.env.close)
        self.rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
        self.info = info if isinstance(info, dict) else {}
        self.done = True

"""OpenSpiel, as it is: its games by name (``kuhn_poker``, ``leduc_poker``, ``tic_tac_toe``, ``connect_four``,
``liars_dice``, ``name(param=value)``), their rules, legal actions and returns (``open-spiel==2.0.2``).

The same face as ``arena`` (TextArena), so that one game workflow plays either library: ``Game(game, players,
seed).start()`` is one episode, ``observe()`` says whose turn it is and what that player sees, ``move(pid, text)``
plays a move written as the library writes its action (``[Bet]``, ``[x(1,1)]``: brackets and case aside), and
``rewards`` are the library's returns at the end. Chance (the deal, a die) is drawn from the episode's seed, so the
samples of one seed (a GRPO group) share it. A move that is not legal is asked for again once; a second one ends
the game, lost by that player (its game's lowest return, the others' highest in a two-player zero-sum game, else 0).

What the player sees: for Kuhn and Leduc Poker a sentence per fact (its card, the bets so far, the pot), written
from the library's own state; for any other game the library's observation string (the board), or its
information-state string where a game has no observation; then the legal moves, each in brackets.

Built-in players beside ``random``: ``minimax`` (perfect play from OpenSpiel's own ``MinimaxSolver``, for small
two-player zero-sum games of perfect information such as tic_tac_toe) and ``minimax@p`` (a random legal move with
probability p, else perfect): the yardstick ladder of docs/games.md.
"""

from __future__ import annotations

import difflib
import functools
import random
import re
from dataclasses import dataclass, field

from masrl.errors import ConfigError, InfraError

VERSION = "2.0.2"
MINIMAX = "minimax"
SOLVER_STATES = 200_000  # a game whose minimax table would hold more states is refused for the minimax player


class SpielError(InfraError):
    """The library raised inside an episode: that episode fails (dropped, counted), the run goes on."""


ArenaError = SpielError  # the name the game workflow catches, for either library


def library():
    try:
        import pyspiel
    except ImportError:
        raise ConfigError(f"workflow 'openspiel' needs OpenSpiel: pip install 'open-spiel=={VERSION}' (or the "
                          f"package's extra: pip install -e '.[games]')") from None
    return pyspiel


@functools.lru_cache(maxsize=64)
def load(game: str):
    return library().load_game(game)


def check_game(game: str, players: int, key: str = "workflow.options.game") -> None:
    """The game exists, is played in turns, shows each player something, and takes ``players`` players."""
    pyspiel = library()
    name = game.split("(")[0]
    names = pyspiel.registered_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=4, cutoff=0.6)
        raise ConfigError(f"{key}: OpenSpiel {VERSION} has no game '{name}'"
                          + (f"; did you mean {', '.join(close)}?" if close else "")
                          + f" ({len(names)} games: pyspiel.registered_names())")
    try:
        g = load(game)
    except Exception as exc:  # the library's own refusal, e.g. an unknown parameter
        raise ConfigError(f"{key}: OpenSpiel cannot load '{game}': {str(exc)[:300]}") from None
    t = g.get_type()
    if t.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        raise ConfigError(f"{key}: '{game}' is a simultaneous-move game; masrl plays games in turns (one call per "
                          f"move)")
    if not (t.provides_observation_string or t.provides_information_state_string):
        raise ConfigError(f"{key}: '{game}' gives no text a player sees (no observation or information-state "
                          f"string)")
    if g.num_players() != players:
        raise ConfigError(f"{key}: '{game}' is played by {g.num_players()} players, but workflow.options.players "
                          f"lists {players} seats; give one agent per seat"
                          + (f" (or load it with '{name}(players={players})')" if "players" in g.get_parameters()
                             else ""))


def moves_known(game: str, players: int) -> bool:
    """OpenSpiel always knows a state's legal actions."""
    return True


def minimax_ok(game: str) -> str | None:
    """Why the minimax player cannot play ``game`` (None when it can)."""
    pyspiel = library()
    t = load(game).get_type()
    if (load(game).num_players() != 2 or t.utility != pyspiel.GameType.Utility.ZERO_SUM
            or t.information != pyspiel.GameType.Information.PERFECT_INFORMATION):
        return f"'{game}' is not a two-player zero-sum game of perfect information"
    if t.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC:
        return f"'{game}' has chance moves"
    if game.split("(")[0] not in SOLVABLE:
        return (f"'{game}' is too large to solve exactly here (games the minimax player plays: "
                f"{', '.join(sorted(SOLVABLE))})")
    return None


SOLVABLE = {"tic_tac_toe"}  # solved in well under a second (4,520 states); connect_four would take days


@functools.lru_cache(maxsize=4)
def minimax_table(game: str) -> dict:
    """OpenSpiel's own minimax solution of ``game``: each state's value of every action for the player to move."""
    from open_spiel.python.algorithms.minimax_solver import MinimaxSolver

    return MinimaxSolver(game).solve()


def parse_builtin(agent: str) -> float | None:
    """The random-move probability of a minimax player (``minimax`` 0.0, ``minimax@0.2`` 0.2), else None."""
    if agent == MINIMAX:
        return 0.0
    m = re.fullmatch(r"minimax@([0-9.]+)", agent)
    if not m:
        return None
    p = float(m.group(1))
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"'{agent}': the random-move probability of a minimax player is between 0 and 1")
    return p


def bracket(text: str) -> str:
    return f"[{text}]"


def _key(text: str) -> str:
    return re.sub(r"\s+", "", text.strip().strip("[]")).lower()


@dataclass
class Game:
    """One episode of an OpenSpiel game."""

    game: str
    players: int
    seed: int
    state: object = None
    rewards: dict[int, float] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    done: bool = False
    errors: dict[int, int] = field(default_factory=dict)
    chance: random.Random = None

    def _guard(self, what: str, fn, *args):
        try:
            return fn(*args)
        except (SpielError, ConfigError):
            raise
        except Exception as exc:
            raise SpielError(f"OpenSpiel '{self.game}' (seed {self.seed}) raised in {what}: {type(exc).__name__}: "
                             f"{str(exc)[:300]}") from exc

    def start(self) -> "Game":
        self.chance = random.Random(f"openspiel-chance-{self.seed}")
        self.state = self._guard("new_initial_state", load(self.game).new_initial_state)
        self._settle()
        return self

    def _settle(self) -> None:
        """Play chance's moves (drawn by the seed) until a player is to move or the game is over."""
        while self.state.is_chance_node():
            outcomes = self.state.chance_outcomes()
            actions, probs = zip(*outcomes)
            self.state.apply_action(self.chance.choices(actions, probs)[0])
        if self.state.is_terminal():
            self.finish()

    def observe(self) -> tuple[int, str]:
        pid = int(self.state.current_player())
        return pid, self._guard("observe", render, self.state, pid, self.game)

    def legal(self) -> dict[str, int]:
        """The legal actions of the player to move, by their key (their text without brackets, spaces, case)."""
        pid = self.state.current_player()
        return {_key(self.state.action_to_string(pid, a)): a for a in self.state.legal_actions()}

    def moves(self) -> list[str]:
        pid = self.state.current_player()
        return [bracket(self.state.action_to_string(pid, a)) for a in self.state.legal_actions()]

    def move(self, pid: int, action: str) -> bool:
        """Play ``action`` for ``pid``; whether it was not legal (once: asked again; twice: the game is lost)."""
        legal = self.legal()
        if _key(action) in legal:
            self._guard("apply_action", self.state.apply_action, legal[_key(action)])
            self._guard("chance", self._settle)
            return False
        self.errors[pid] = self.errors.get(pid, 0) + 1
        if self.errors[pid] >= 2:
            self._lose(pid, f"Player {pid} made an invalid move twice ({action[:60]!r})")
        return True

    def _lose(self, pid: int, reason: str) -> None:
        g = load(self.game)
        pyspiel = library()
        zero_sum = g.num_players() == 2 and g.get_type().utility == pyspiel.GameType.Utility.ZERO_SUM
        self.rewards = {p: g.min_utility() if p == pid else (g.max_utility() if zero_sum else 0.0)
                        for p in range(g.num_players())}
        self.info = {pid: {"invalid_move": True, "reason": reason}}
        self.done = True

    def finish(self) -> None:
        if self.done:
            return
        self.rewards = {p: float(r) for p, r in enumerate(self.state.returns())}
        self.info = {"reason": "the game ended"}
        self.done = True

    def best_moves(self) -> list[str]:
        """The moves perfect play allows here (``minimax_table``)."""
        entry = minimax_table(self.game)[str(self.state)]
        pid = self.state.current_player()
        best = max(entry.action_values[a] for a in self.state.legal_actions())
        return [bracket(self.state.action_to_string(pid, a)) for a in self.state.legal_actions()
                if entry.action_values[a] >= best - 1e-6]


def legal_moves(game: Game, observation: str, *, strict: bool = True) -> list[str]:
    return game.moves()


def random_move(game: Game, observation: str, rng: random.Random) -> str:
    return rng.choice(game.moves())


def builtin_move(agent: str, game: Game, observation: str, rng: random.Random) -> str:
    """The move of a built-in player other than ``random``: ``minimax`` / ``minimax@p``."""
    p = parse_builtin(agent)
    if p and rng.random() < p:
        return random_move(game, observation, rng)
    return rng.choice(game.best_moves())


EXAMPLE_SEED = 90_210


# -- what a player sees ------------------------------------------------------------------------------------------

KUHN_CARDS = ["Jack", "Queen", "King"]
LEDUC_RANKS = ["Jack", "Queen", "King"]


def render(state, pid: int, game: str) -> str:
    """The text ``pid`` sees: the game's facts, then its legal moves."""
    name = game.split("(")[0]
    writer = {"kuhn_poker": _kuhn, "leduc_poker": _leduc}.get(name)
    if writer is not None and load(game).num_players() == 2:
        body = writer(state, pid)
    else:
        t = load(game).get_type()
        body = state.observation_string(pid) if t.provides_observation_string else state.information_state_string(pid)
        body = f"You are Player {pid}.\n{body}".rstrip()
    moves = ", ".join(bracket(state.action_to_string(pid, a)) for a in state.legal_actions())
    return f"{body}\nAvailable moves: {moves}"


def _kuhn(state, pid: int) -> str:
    """Kuhn Poker from ``pid``'s side: its card, and each bet so far (the library's history: deal, then moves)."""
    history = state.history()
    card = KUHN_CARDS[history[pid]]
    said = [f"Player {i % 2} {'bet' if a == 1 else 'passed'}" for i, a in enumerate(history[2:])]
    pot = 2 + sum(history[2:])
    return (f"Kuhn Poker, three cards (Jack < Queen < King), one each; each player put 1 chip in the pot. "
            f"You are Player {pid}. Your card: {card}. "
            + (f"So far: {', '.join(said)}. " if said else "No one has acted yet. ")
            + f"Pot: {pot} chips. Pass to check or fold, Bet to bet or call one chip; the higher card wins at a "
              f"showdown.")


def _leduc(state, pid: int) -> str:
    """Leduc Poker from ``pid``'s side, read from the library's information-state string."""
    info = state.information_state_string(pid)
    fields = dict(re.findall(r"\[([A-Za-z0-9 ]+): ([^\]]*)\]", info))
    private = int(fields.get("Private", "-1"))
    public = int(fields.get("Public", "-1")) if "Public" in fields else -1
    card = LEDUC_RANKS[private // 2] if private >= 0 else "none"
    board = LEDUC_RANKS[public // 2] if public >= 0 else "not yet shown"
    rounds = [fields.get("Round1", "").split(), fields.get("Round2", "").split()]
    now = re.search(r"\[Round (\d)\]", info)
    names = {"0": "folded", "1": "called", "2": "raised"}  # the library's action ids in its betting sequences

    def said(seq: list[str]) -> str:
        return ", ".join(f"Player {i % 2} {names.get(a, a)}"  # each round opens with Player 0
                         for i, a in enumerate(seq)) or "nothing yet"
    return (f"Leduc Poker, six cards (two each of Jack < Queen < King), two betting rounds, one public card after "
            f"the first. You are Player {pid}. Your card: {card}. Public card: {board}. Round "
            f"{now.group(1) if now else '?'}. First round: {said(rounds[0])}. Second round: {said(rounds[1])}. "
            f"Pot: {fields.get('Pot', '?').strip()} chips. A pair with the public card wins, else the higher card.")

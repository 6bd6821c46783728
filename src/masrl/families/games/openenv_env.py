"""masrl's games served as OpenEnv environments, so that other trainers (TRL's OpenEnv path, OpenEnv's own clients)
play them: any game of the three libraries the games workflow reads (``textarena``, ``openspiel``, ``pettingzoo``),
one seat for the client and masrl's built-in players in the others.

    from masrl.families.games.openenv_env import GameEnvironment, GameAction, GameObservation
    env = GameEnvironment(library="openspiel", game="tic_tac_toe", opponent="minimax@0.5")
    obs = env.reset(seed=7)             # obs.prompt: what the seat sees, obs.legal_moves: ["[x(0,0)]", ...]
    obs = env.step(GameAction(message="[x(1,1)]"))   # the opponent answers before the observation comes back

    # or over OpenEnv's HTTP server (fastapi + uvicorn):
    from openenv.core.env_server.http_server import create_fastapi_app
    app = create_fastapi_app(lambda: GameEnvironment(game="kuhn_poker", library="openspiel"), GameAction,
                             GameObservation, max_concurrent_envs=64)

The client plays ``seat`` (default 0); every other seat is ``opponent``: ``random`` or, for OpenSpiel games it
solves, ``minimax`` / ``minimax@p``. The reward is 0 until the game ends, then the client's own result from the
library (+1 / -1 / 0 in the two-player games; chips in poker); a move the game refuses is asked again once, then
the game is lost, as in training. Needs ``openenv-core`` (``pip install -e '.[openenv]'``).
"""

from __future__ import annotations

import random
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from masrl.errors import ConfigError
from masrl.families.games import arena, spiel, zoo

LIBRARIES = {"textarena": arena, "openspiel": spiel, "pettingzoo": zoo}


class GameAction(Action):
    message: str = Field(description="the move, as the game writes it in brackets (e.g. [4], [Bet])")


class GameObservation(Observation):
    prompt: str = Field(default="", description="what the client's seat sees, ending with the legal moves")
    legal_moves: list[str] = Field(default_factory=list)
    invalid: bool = Field(default=False, description="the last move was refused (once: asked again)")


class GameEnvironment(Environment[GameAction, GameObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, game: str = "tic_tac_toe", library: str = "openspiel", players: int = 2, seat: int = 0,
                 opponent: str = "random"):
        super().__init__()
        if library not in LIBRARIES:
            raise ConfigError(f"library: one of {', '.join(LIBRARIES)}, not {library!r}")
        if not 0 <= seat < players:
            raise ConfigError(f"seat: 0 to {players - 1}")
        self.lib, self.game_name, self.players, self.seat, self.opponent = LIBRARIES[library], game, players, seat, \
            opponent
        self.lib.check_game(game, players)
        if opponent != "random":
            if self.lib is not spiel or spiel.parse_builtin(opponent) is None:
                raise ConfigError(f"opponent: 'random', or 'minimax' / 'minimax@p' in an OpenSpiel game, not "
                                  f"{opponent!r}")
            why = spiel.minimax_ok(game)
            if why:
                raise ConfigError(f"opponent '{opponent}' cannot play: {why}")
        self.game, self.rng, self._state = None, random.Random(0), State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GameObservation:
        seed = 0 if seed is None else int(seed)
        self.game = self.lib.Game(self.game_name, self.players, seed).start()
        self.rng = random.Random(f"openenv-opponent-{seed}")
        self._state = State(episode_id=episode_id, step_count=0)
        return self._after(invalid=False)

    def step(self, action: GameAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GameObservation:
        if self.game is None or self.game.done:
            raise RuntimeError("the game is over: reset() starts another")
        self._state.step_count += 1
        pid, _ = self.game.observe()
        invalid = self.game.move(pid, action.message)
        return self._after(invalid=invalid)

    def _after(self, invalid: bool) -> GameObservation:
        """The opponents move until it is the client's turn or the game ends; the client's view of that."""
        while not self.game.done:
            pid, obs = self.game.observe()
            if pid == self.seat:
                return GameObservation(prompt=obs, legal_moves=self.lib.legal_moves(self.game, obs, strict=False),
                                       invalid=invalid, reward=0.0, done=False)
            if self.opponent == "random":
                move = self.lib.random_move(self.game, obs, self.rng)
            else:
                move = spiel.builtin_move(self.opponent, self.game, obs, self.rng)
            self.game.move(pid, move)
        return GameObservation(prompt="The game is over.", legal_moves=[], invalid=invalid,
                               reward=float(self.game.rewards.get(self.seat, 0.0)), done=True,
                               metadata={"rewards": {str(k): v for k, v in self.game.rewards.items()}})

    @property
    def state(self) -> State:
        return self._state

"""An OpenEnv environment written against OpenEnv's own base classes, for the openenv workflow's tests: guess a
digit drawn by the seed; a wrong guess costs 0.1 and says higher or lower, the right one pays 1 and ends the
episode, and it ends after ``max_steps`` guesses. ``python -m openenv_envs PORT`` serves it with OpenEnv's own
HTTP server on 127.0.0.1."""

import random
import sys
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    prompt: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_steps: int = 3):
        super().__init__()
        self.max_steps, self.secret, self._state = max_steps, 0, State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self.secret = random.Random(seed).randrange(10)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(prompt="Guess my digit, 0 to 9. Reply with the digit.", reward=0.0, done=False)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        g = action.guess.strip()
        if g == str(self.secret):
            return GuessObservation(prompt="Right.", reward=1.0, done=True)
        hint = "not a digit" if not (len(g) == 1 and g.isdigit()) else ("higher" if int(g) < self.secret else "lower")
        return GuessObservation(prompt=f"Wrong: {hint}. Guess again.", reward=-0.1,
                                done=self._state.step_count >= self.max_steps)

    @property
    def state(self) -> State:
        return self._state


if __name__ == "__main__":
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app

    app = create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=4)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")

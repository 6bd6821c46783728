"""An environment written for OpenEnv (``openenv-core``'s own ``Environment`` base class), trained unchanged by
``workflow: openenv`` (examples/openenv_guess.yaml): guess a digit drawn by the seed in up to four tries; a wrong
guess costs 0.1 and says higher or lower, the right one pays 1. Halving the range each time always finds it in four;
four distinct random digits find it 40% of the time."""

import random
import re
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    prompt: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_steps: int = 4):
        super().__init__()
        self.max_steps, self.secret, self._state = max_steps, 0, State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self.secret = random.Random(seed).randrange(10)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(prompt=f"I picked a digit from 0 to 9. You have {self.max_steps} guesses; after each "
                                       f"wrong one I say higher or lower. Reply with one digit.", reward=0.0, done=False)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        digits = re.findall(r"\d", action.guess)
        left = self.max_steps - self._state.step_count
        if digits and int(digits[0]) == self.secret:
            return GuessObservation(prompt="Right.", reward=1.0, done=True)
        hint = ("not a digit" if not digits else "higher" if int(digits[0]) < self.secret else "lower")
        return GuessObservation(prompt=f"Wrong: {hint}. {left} guesses left.", reward=-0.1, done=left <= 0)

    @property
    def state(self) -> State:
        return self._state

"""An OpenEnv environment whose reward comes from a ``Rubric``."""

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.rubrics import Rubric


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    hint: str = ""


class Closeness(Rubric):
    """1 for the target, less the further the guess."""

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target

    def forward(self, action, observation) -> float:
        return 1.0 / (1 + abs(action.guess - self.target))


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__(rubric=Closeness(target=7))
        self._state = State(episode_id="guess", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._reset_rubric()
        self._state = State(episode_id=episode_id or "guess", step_count=0)
        return GuessObservation(hint="between 0 and 10")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        target = self.rubric.target
        hint = "higher" if action.guess < target else "lower" if action.guess > target else "yes"
        observation = GuessObservation(hint=hint, done=hint == "yes")
        observation.reward = self._apply_rubric(action, observation)
        return observation

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=4)

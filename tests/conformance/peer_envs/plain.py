"""A plain OpenEnv environment whose ``reset`` takes no arguments at all (no seed)."""

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class PlainAction(Action):
    message: str = Field(min_length=1)


class PlainObservation(Observation):
    echoed: str = ""
    length: int = 0


class PlainEnv(Environment[PlainAction, PlainObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="plain", step_count=0)

    def reset(self) -> PlainObservation:
        self._state = State(episode_id="plain", step_count=0)
        return PlainObservation(echoed="ready", metadata={"phase": "reset"})

    def step(self, action: PlainAction) -> PlainObservation:  # type: ignore[override]
        if action.message == "boom":
            raise ValueError("kaboom")
        self._state.step_count += 1
        return PlainObservation(
            echoed=action.message,
            length=len(action.message),
            reward=len(action.message) / 10,
            done=action.message == "bye",
            metadata={"step": self._state.step_count},
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(PlainEnv, PlainAction, PlainObservation, env_name="plain", max_concurrent_envs=4)

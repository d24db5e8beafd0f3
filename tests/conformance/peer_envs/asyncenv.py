"""An OpenEnv environment that overrides ``reset_async`` / ``step_async``."""

import asyncio

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class CountAction(Action):
    amount: int


class CountObservation(Observation):
    total: int = 0


class AsyncCountEnv(Environment[CountAction, CountObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="async", step_count=0)
        self.total = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        raise AssertionError("the async twin must be used")

    def step(self, action, timeout_s=None, **kwargs):
        raise AssertionError("the async twin must be used")

    async def reset_async(self, seed=None, episode_id=None, start: int = 0, **kwargs):
        await asyncio.sleep(0)
        self.total = start
        self._state = State(episode_id=episode_id or "async", step_count=0)
        return CountObservation(total=start, metadata={"seed": seed})

    async def step_async(self, action, timeout_s=None, **kwargs):
        await asyncio.sleep(0)
        if action.amount < 0:
            raise ValueError("negative amounts are not allowed")
        self.total += action.amount
        self._state.step_count += 1
        return CountObservation(
            total=self.total, reward=float(action.amount), done=self.total >= 10
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    AsyncCountEnv, CountAction, CountObservation, env_name="async", max_concurrent_envs=4
)

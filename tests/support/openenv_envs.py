"""Environments written for OpenEnv (``openenv-core``), unchanged, for the compat tests.

``CountEnv`` is served by a real openenv-core server (``openenv_peer_app``) and, through
corral's adapter, by a corral server; ``AsyncCountEnv`` overrides the async twins.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field, field_validator


class CountAction(Action):
    """Add ``amount``; ``sleep`` seconds first; ``amount == 13`` fails a custom validator."""

    amount: int = Field(ge=0, le=100)
    sleep: float = Field(default=0.0, ge=0, le=10)

    @field_validator("amount")
    @classmethod
    def _not_thirteen(cls, value: int) -> int:
        if value == 13:
            raise ValueError("13 is unlucky")
        return value


class CountObservation(Observation):
    total: int = 0
    note: str = ""


class CountState(State):
    total: int = 0


class CountEnv(Environment[CountAction, CountObservation, CountState]):
    """Sums amounts; done at 10; ``amount == 7`` raises inside step."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = CountState(episode_id=str(uuid.uuid4()))

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, start: int = 0, **kw: Any
    ) -> CountObservation:
        self._state = CountState(episode_id=episode_id or str(uuid.uuid4()), total=start)
        return CountObservation(total=start, note=f"seed={seed}", metadata={"seed": seed})

    def step(self, action: CountAction, timeout_s: float | None = None, **kw: Any) -> Any:
        if action.sleep:
            time.sleep(action.sleep)
        if action.amount == 7:
            raise RuntimeError("seven is not allowed")
        self._state.step_count += 1
        self._state.total += action.amount
        return CountObservation(
            total=self._state.total, reward=float(action.amount), done=self._state.total >= 10
        )

    @property
    def state(self) -> CountState:
        return self._state


class StrictCountEnv(Environment):  # type: ignore[type-arg]
    """No generic parameters: the adapter reads the models from the annotations."""

    def __init__(self) -> None:
        super().__init__()
        self._state = CountState()

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> CountObservation:
        self._state = CountState(episode_id=episode_id)
        return CountObservation()

    def step(self, action: CountAction, timeout_s: float | None = None) -> CountObservation:
        self._state.total += action.amount
        return CountObservation(total=self._state.total)

    @property
    def state(self) -> CountState:
        return self._state


class AsyncCountEnv(CountEnv):
    """Overrides the async twins, which OpenEnv (and the adapter) await."""

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kw: Any
    ) -> CountObservation:
        await asyncio.sleep(0)
        return self.reset(seed=seed, episode_id=episode_id, **kw)

    async def step_async(
        self, action: CountAction, timeout_s: float | None = None, **kw: Any
    ) -> CountObservation:
        await asyncio.sleep(0)
        result: CountObservation = self.step(action)
        return result


class UntypedEnv(Environment):  # type: ignore[type-arg]
    """Declares its models nowhere: the adapter needs them as arguments."""

    def reset(self, seed: Any = None, episode_id: Any = None, **kw: Any) -> Any:
        return CountObservation()

    def step(self, action: Any, timeout_s: Any = None, **kw: Any) -> Any:
        return CountObservation()

    @property
    def state(self) -> Any:
        return State()

"""Small environments that exercise the server's edge cases."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime
from typing import Any

from pydantic import Field, field_validator

from corral.contract import Action, Environment, Observation, State


class CountAction(Action):
    """Add ``amount``; ``sleep`` seconds first; ``fail`` raises inside the env."""

    amount: int = 1
    sleep: float = Field(default=0.0, ge=0, le=30)
    fail: bool = False
    note: str | None = None

    @field_validator("note")
    @classmethod
    def _no_shouting(cls, value: str | None) -> str | None:
        if value is not None and value.isupper():
            raise ValueError("custom validator: no shouting")
        return value


class Nested(Observation):
    """Used inside CountObservation to check nesting."""


class Point(Action):
    x: float = 0.0
    y: float = 0.0


class CountObservation(Observation):
    total: int = 0
    label: str | None = None
    blob: bytes = b""
    when: datetime | None = None
    points: list[Point] = Field(default_factory=list)
    tags: dict[str, int] = Field(default_factory=dict)


class CountState(State):
    total: int = 0
    history: list[int] = Field(default_factory=list)


class CounterEnv(Environment[CountAction, CountObservation, CountState]):
    """Sums amounts; the episode ends when the total reaches ``limit`` (reset option)."""

    name = "counter"

    def __init__(self) -> None:
        self._state = CountState()
        self.limit = 10

    def reset(self, seed: int | None = None, limit: int = 10, label: str | None = None) -> Any:
        self.limit = limit
        self._state = CountState(episode_id=f"seed-{seed}", extra_field="kept")  # type: ignore[call-arg]
        return CountObservation(
            label=label,
            blob=bytes(range(256)),
            when=datetime(2026, 1, 2, 3, 4, 5),
            points=[Point(x=1.5, y=-2.0)],
            tags={"ü": 1},
            metadata={"seed": seed},
        )

    def step(self, action: CountAction) -> CountObservation:
        if action.sleep:
            time.sleep(action.sleep)
        if action.fail:
            raise RuntimeError("the env failed on purpose")
        self._state.total += action.amount
        self._state.step_count += 1
        self._state.history.append(action.amount)
        return CountObservation(
            total=self._state.total,
            reward=float(action.amount),
            done=self._state.total >= self.limit,
        )

    def state(self) -> CountState:
        return self._state


class AsyncCounterEnv(Environment[CountAction, CountObservation, CountState]):
    """The async flavour: awaited on the loop."""

    def __init__(self) -> None:
        self._state = CountState()
        self.thread = threading.get_ident()

    async def reset(self, seed: int | None = None, **options: Any) -> CountObservation:
        self._state = CountState(episode_id=str(seed))
        return CountObservation()

    async def step(self, action: CountAction) -> CountObservation:
        await asyncio.sleep(action.sleep)
        self._state.total += action.amount
        return CountObservation(total=self._state.total, reward=1.0)

    async def state(self) -> CountState:
        return self._state


class AutoResetEnv(CounterEnv):
    auto_reset = True


class BadObsEnv(CounterEnv):
    """Returns the wrong type from step."""

    def step(self, action: CountAction) -> Any:
        return {"not": "an observation"}


class BrokenFactoryEnv(CounterEnv):
    def __init__(self) -> None:
        raise RuntimeError("cannot build")

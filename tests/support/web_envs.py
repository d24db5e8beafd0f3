"""Environments for the web UI tests: a contract with every kind of field, an image
observation, tools, a deliberately non-deterministic env and broken view hooks."""

from __future__ import annotations

import random
from enum import StrEnum
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from corral.contract import Action, Environment, Observation, State
from corral.contract.arrays import Array
from corral.contract.tools import tool
from corral.envs.wordle import WordleEnv


class Colour(StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Point(BaseModel):
    x: int = 0
    y: int = 0


class Circle(BaseModel):
    kind: Literal["circle"] = "circle"
    radius: float = 1.0


class Square(BaseModel):
    kind: Literal["square"] = "square"
    side: float = 1.0


class SinkAction(Action):
    """Every kind of field the form builder knows."""

    colour: Colour = Colour.RED
    flag: bool = False
    level: int = Field(default=3, ge=0, le=10)
    ratio: float = 0.5
    name: str = Field(default="", max_length=20)
    code: str = Field(default="", max_length=10_000)
    api_key: str = ""
    mode: Literal["fast", "slow"] = "fast"
    where: Point = Field(default_factory=Point)
    tags: list[int] = Field(default_factory=list)
    limit: int | None = None
    shape: Annotated[Circle | Square, Field(discriminator="kind")] = Field(default_factory=Circle)
    grid: Array(dtype="uint8", shape=(2, 2)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: np.zeros((2, 2), dtype=np.uint8)
    )


IMAGE = np.zeros((4, 4, 3), dtype=np.uint8)
IMAGE[0, 0] = (255, 0, 0)
IMAGE[1, 2] = (0, 255, 0)
IMAGE[3, 3] = (0, 0, 255)


class SinkObservation(Observation):
    echo: dict[str, Any] = Field(default_factory=dict)
    image: Array(dtype="uint8", shape=(4, 4, 3)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: IMAGE.copy()
    )
    text: str = ""


class SinkState(State):
    last: dict[str, Any] = Field(default_factory=dict)


class SinkEnv(Environment[SinkAction, SinkObservation, SinkState]):
    """Echoes each action (as JSON) and always shows the same 4x4 image."""

    name = "sink"

    def __init__(self) -> None:
        self._state = SinkState()

    def reset(self, seed: int | None = None, **options: Any) -> SinkObservation:
        self._state = SinkState()
        return SinkObservation(text="line one\nline two\n" + "x" * 100)

    def step(self, action: SinkAction) -> SinkObservation:
        echo = action.model_dump(mode="json")
        self._state.step_count += 1
        self._state.last = echo
        return SinkObservation(echo=echo, reward=float(action.level))

    def state(self) -> SinkState:
        return self._state


class CoinAction(Action):
    call: Literal["heads", "tails"]


class CoinObservation(Observation):
    coin: str = ""
    roll: float = 0.0


class FlakyCoinEnv(Environment[CoinAction, CoinObservation, State]):
    """Ignores its seed: the same episode replayed gives other observations."""

    name = "flaky-coin"

    def __init__(self) -> None:
        self._state = State()
        self._rng = random.Random()

    def reset(self, seed: int | None = None, **options: Any) -> CoinObservation:
        self._state = State()
        return CoinObservation()

    def step(self, action: CoinAction) -> CoinObservation:
        self._state.step_count += 1
        coin = self._rng.choice(["heads", "tails"])
        return CoinObservation(
            coin=coin,
            roll=self._rng.random(),
            reward=1.0 if coin == action.call else 0.0,
            done=self._state.step_count >= 3,
        )

    def state(self) -> State:
        return self._state


class CalcAction(Action):
    value: float


class CalcObservation(Observation):
    total: float = 0.0


class CalcEnv(Environment[CalcAction, CalcObservation, State]):
    """Adds up values; tools divide and read the total."""

    name = "calc"

    def __init__(self) -> None:
        self.total = 0.0

    def reset(self, seed: int | None = None, **options: Any) -> CalcObservation:
        self.total = 0.0
        return CalcObservation()

    def step(self, action: CalcAction) -> CalcObservation:
        self.total += action.value
        return CalcObservation(total=self.total, reward=action.value)

    def state(self) -> State:
        return State()

    @tool
    def divide(self, a: float, b: float) -> float:
        """a / b (b must not be 0)."""
        return a / b

    @tool
    def bump(self, by: int = 1) -> float:
        """Add to this instance's running total and return it."""
        self.total += by
        return self.total


class BrokenViewEnv(CalcEnv):
    """Its view hooks fail or return the wrong things."""

    name = "broken-view"

    def render_html(self, observation: CalcObservation) -> str | None:
        if observation.total < 0:
            return 42  # type: ignore[return-value]
        raise RuntimeError("no view today")

    def web_actions(self, observation: CalcObservation) -> list[tuple[str, CalcAction]]:
        return [("bad", {"value": "not a number"})]  # type: ignore[list-item]


class ReplayOnlyWordle(WordleEnv):
    """Wordle that declares no snapshot: the web UI restores its episodes by replay."""

    snapshot = Environment.snapshot  # type: ignore[assignment]
    restore = Environment.restore  # type: ignore[assignment]

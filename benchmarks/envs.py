"""The environments every contender serves: echo (sync and async), an 84x84x3 image, and a
sleeping environment whose step awaits a fixed delay (the slow-sessions section).

The corral and openenv-core versions do the same work per step: validate a ~100-byte
action, build the observation, return it. The image environments return one fixed
random 84x84x3 uint8 frame per step, in each framework's natural field type (corral: an
``Array`` field, openenv-core: nested lists, as its pydantic models carry no arrays).
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from typing import Any

import numpy as np

from corral.contract import Action, Environment, Observation, State
from corral.contract.arrays import Array
from corral.envs.echo import EchoAction, EchoEnv, EchoObservation

MESSAGE = "x" * 64
"""The echoed message: the action and observation frames are about 100 bytes."""

FRAME_SHAPE = (84, 84, 3)


def frame() -> np.ndarray[Any, Any]:
    """The image every step returns (the same pixels for both frameworks)."""
    return np.random.default_rng(84).integers(0, 256, FRAME_SHAPE, dtype=np.uint8)


class AsyncEchoEnv(EchoEnv):
    """corral's echo with ``async def`` methods: awaited on the loop, no thread hop."""

    async def reset(self, seed: int | None = None, **options: Any) -> EchoObservation:  # type: ignore[override]
        return EchoEnv.reset(self, seed, **options)

    async def step(self, action: EchoAction) -> EchoObservation:  # type: ignore[override]
        return EchoEnv.step(self, action)


SLEEP_DELAY_S = 1.0
"""The sleeping environment's default delay."""
DELAY_VARIABLE = "CORRAL_BENCH_DELAY"
"""The environment variable that sets it in a server process (both frameworks')."""


class SleepEnv(EchoEnv):
    """Each step awaits ``delay`` seconds, then echoes: a session that is slow for reasons
    outside the server (a simulator, a tool, a remote service), as in OpenEnv's scaling
    experiment. Reset answers at once."""

    name = "sleep"

    def __init__(self, delay: float | None = None) -> None:
        super().__init__()
        self.delay = float(
            os.environ.get(DELAY_VARIABLE, SLEEP_DELAY_S) if delay is None else delay
        )

    async def reset(self, seed: int | None = None, **options: Any) -> EchoObservation:  # type: ignore[override]
        return EchoEnv.reset(self, seed, **options)

    async def step(self, action: EchoAction) -> EchoObservation:  # type: ignore[override]
        await asyncio.sleep(self.delay)
        return EchoEnv.step(self, action)


class TickAction(Action):
    """Advance the image environment by one tick."""

    tick: int = 1


class ImageObservation(Observation):
    """One 84x84x3 uint8 frame."""

    pixels: Array(dtype="uint8", shape=FRAME_SHAPE)  # type: ignore[valid-type]
    ticks: int = 0


class ImageEnv(Environment[TickAction, ImageObservation, State]):
    """Returns an 84x84x3 frame on every step."""

    name = "image"

    def __init__(self) -> None:
        self.pixels = frame()
        self.ticks = 0

    def reset(self, seed: int | None = None, **options: Any) -> ImageObservation:
        self.ticks = 0
        return ImageObservation(pixels=self.pixels)

    def step(self, action: TickAction) -> ImageObservation:
        self.ticks += action.tick
        return ImageObservation(pixels=self.pixels, ticks=self.ticks, reward=0.0)

    def state(self) -> State:
        return State(episode_id=str(uuid.uuid4()), step_count=self.ticks)


@functools.cache
def openenv_models() -> dict[str, Any]:
    """openenv-core's echo and image environments, actions, observations and clients.

    Imported on demand (and once): openenv-core is optional for the benchmark (its rows
    are skipped when it is missing), and importing it takes seconds.
    """
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.interfaces import Environment as OEEnvironment
    from openenv.core.env_server.types import Action as OEAction
    from openenv.core.env_server.types import Observation as OEObservation
    from openenv.core.env_server.types import State as OEState

    class OEEchoAction(OEAction):  # type: ignore[misc]
        message: str

    class OEEchoObservation(OEObservation):  # type: ignore[misc]
        echoed_message: str = ""
        message_length: int = 0

    class OEEchoEnv(OEEnvironment):  # type: ignore[misc]
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = OEState(episode_id=str(uuid.uuid4()), step_count=0)
            self.total_length = 0

        def reset(
            self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
        ) -> Any:
            self._state = OEState(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
            self.total_length = 0
            return OEEchoObservation(echoed_message="ready", metadata={"seed": seed})

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            self._state.step_count += 1
            self.total_length += len(action.message)
            return OEEchoObservation(
                echoed_message=action.message,
                message_length=len(action.message),
                reward=0.1 * len(action.message),
                done=action.message == "bye",
            )

        @property
        def state(self) -> Any:
            return self._state

    class OEAsyncEchoEnv(OEEchoEnv):
        async def reset_async(
            self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
        ) -> Any:
            return self.reset(seed, episode_id, **kwargs)

        async def step_async(
            self, action: Any, timeout_s: float | None = None, **kwargs: Any
        ) -> Any:
            return self.step(action, timeout_s, **kwargs)

    class OESleepEnv(OEEchoEnv):
        """The sleeping environment: each step awaits the delay in ``$CORRAL_BENCH_DELAY``."""

        def __init__(self) -> None:
            super().__init__()
            self.delay = float(os.environ.get(DELAY_VARIABLE, SLEEP_DELAY_S))

        async def reset_async(
            self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
        ) -> Any:
            return self.reset(seed, episode_id, **kwargs)

        async def step_async(
            self, action: Any, timeout_s: float | None = None, **kwargs: Any
        ) -> Any:
            await asyncio.sleep(self.delay)
            return self.step(action, timeout_s, **kwargs)

    class OETickAction(OEAction):  # type: ignore[misc]
        tick: int = 1

    class OEImageObservation(OEObservation):  # type: ignore[misc]
        pixels: list[list[list[int]]]
        ticks: int = 0

    class OEImageEnv(OEEnvironment):  # type: ignore[misc]
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self.pixels = frame().tolist()
            self.ticks = 0

        def reset(
            self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
        ) -> Any:
            self.ticks = 0
            return OEImageObservation(pixels=self.pixels)

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            self.ticks += action.tick
            return OEImageObservation(pixels=self.pixels, ticks=self.ticks, reward=0.0)

        @property
        def state(self) -> Any:
            return OEState(step_count=self.ticks)

    def client_class(observation: type[Any]) -> type[Any]:
        class Client(EnvClient):  # type: ignore[misc,type-arg]
            """A typed openenv-core client, written the way its docs show."""

            def _step_payload(self, action: Any) -> dict[str, Any]:
                payload: dict[str, Any] = action.model_dump(exclude={"metadata"})
                return payload

            def _parse_result(self, payload: dict[str, Any]) -> Any:
                obs = observation(
                    **payload.get("observation", {}),
                    done=payload.get("done", False),
                    reward=payload.get("reward"),
                )
                return StepResult(observation=obs, reward=obs.reward, done=obs.done)

            def _parse_state(self, payload: dict[str, Any]) -> Any:
                return OEState(**payload)

        return Client

    return {
        "echo": (OEEchoEnv, OEEchoAction, OEEchoObservation),
        "async-echo": (OEAsyncEchoEnv, OEEchoAction, OEEchoObservation),
        "sleep": (OESleepEnv, OEEchoAction, OEEchoObservation),
        "image": (OEImageEnv, OETickAction, OEImageObservation),
        "EchoAction": OEEchoAction,
        "TickAction": OETickAction,
        "EchoClient": client_class(OEEchoObservation),
        "ImageClient": client_class(OEImageObservation),
    }


class CountAction(Action):
    """Add ``amount`` to the count."""

    amount: int = 1


class CountObservation(Observation):
    count: int = 0


class CountEnv(Environment[CountAction, CountObservation, State]):
    """A count, and no snapshot: a session of it moves, or forks, by replay only."""

    name = "count"

    def __init__(self) -> None:
        self.count = 0

    def reset(self, seed: int | None = None, **options: Any) -> CountObservation:
        self.count = 0
        return CountObservation()

    def step(self, action: CountAction) -> CountObservation:
        self.count += action.amount
        return CountObservation(count=self.count, reward=float(action.amount))

    def state(self) -> State:
        return State(step_count=self.count)

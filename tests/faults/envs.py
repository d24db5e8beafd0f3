"""Environments for the fault suites, importable by server subprocesses.

``RecordingEnv`` records every action it applies, so a step applied twice or never shows
up in its state; ``RaisingEnv`` raises from whichever method it is told to.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pydantic import Field, field_validator

from corral.contract import Action, Environment, Observation, State


class RecAction(Action):
    """Carries the client's sequence number of this step; ``sleep`` slows the step."""

    seq: int
    sleep: float = Field(default=0.0, ge=0, le=60)


class RecObservation(Observation):
    seq: int = -1
    applied: int = 0


class RecState(State):
    applied: list[int] = Field(default_factory=list)


class RecordingEnv(Environment[RecAction, RecObservation, RecState]):
    """Appends each step's ``seq`` to its state; episodes never end on their own."""

    name = "recording"

    def __init__(self) -> None:
        self._state = RecState()

    def reset(self, seed: int | None = None) -> RecObservation:
        self._state = RecState(episode_id=f"seed-{seed}")
        return RecObservation()

    def step(self, action: RecAction) -> RecObservation:
        if action.sleep:
            time.sleep(action.sleep)
        self._state.applied.append(action.seq)
        self._state.step_count += 1
        return RecObservation(seq=action.seq, applied=len(self._state.applied))

    def state(self) -> RecState:
        return self._state


class RaiseAction(Action):
    """``raise_in`` names the exception the step raises (``""``: none)."""

    raise_in: str = ""
    note: str = ""

    @field_validator("note")
    @classmethod
    def _validated(cls, value: str) -> str:
        if value == "invalid":
            raise ValueError("custom validator rejects 'invalid'")
        return value


class RaiseObservation(Observation):
    ok: bool = True


class RaiseState(State):
    failing: list[str] = Field(default_factory=list)


_EXCEPTIONS: dict[str, type[BaseException]] = {
    "runtime": RuntimeError,
    "value": ValueError,
    "keyboard": KeyboardInterrupt,
    "exit": SystemExit,
    "recursion": RecursionError,
    "memory": MemoryError,
}


def _raise(kind: str, where: str) -> None:
    if kind:
        raise _EXCEPTIONS[kind](f"{where} raised on purpose")


class RaisingEnv(Environment[RaiseAction, RaiseObservation, RaiseState]):
    """Raises from ``reset``/``state``/``close`` as ``reset(fail=...)`` asks, from ``step``
    as the action asks. ``fail`` maps a method name to an exception kind."""

    name = "raising"

    def __init__(self) -> None:
        self._fail: dict[str, str] = {}

    def reset(self, seed: int | None = None, fail: dict[str, str] | None = None) -> Any:
        if fail is not None:
            self._fail = dict(fail)
            _raise(self._fail.get("reset", ""), "reset")
        return RaiseObservation()

    def step(self, action: RaiseAction) -> RaiseObservation:
        _raise(action.raise_in, "step")
        return RaiseObservation()

    def state(self) -> RaiseState:
        _raise(self._fail.get("state", ""), "state")
        return RaiseState(failing=sorted(self._fail))

    def close(self) -> None:
        _raise(self._fail.get("close", ""), "close")


class AsyncRaisingEnv(RaisingEnv):
    """The same, with async methods (run on the server's event loop)."""

    async def reset(self, seed: int | None = None, fail: dict[str, str] | None = None) -> Any:  # type: ignore[override]
        return RaisingEnv.reset(self, seed, fail)

    async def step(self, action: RaiseAction) -> RaiseObservation:  # type: ignore[override]
        return RaisingEnv.step(self, action)

    async def state(self) -> RaiseState:  # type: ignore[override]
        return RaisingEnv.state(self)

    async def close(self) -> None:  # type: ignore[override]
        RaisingEnv.close(self)


class ExplodingEnv(RecordingEnv):
    """Cannot be built: its constructor raises ``SystemExit``."""

    def __init__(self) -> None:
        raise SystemExit("the constructor exits on purpose")


RELEASE = threading.Event()
"""Lets every ``HardAction(block=True)`` step return (in-process servers)."""


class HardAction(Action):
    """What the next step returns or does: a reward (as text: ``"nan"``, ``"inf"``...), an
    object no codec can carry in ``metadata``, an observation of ``size`` bytes, or a
    ``sleep`` (a hung call when longer than the step timeout)."""

    reward: str = "1.0"
    unencodable: bool = False
    block: bool = False
    size: int = Field(default=0, ge=0, le=64 * 1024 * 1024)
    sleep: float = Field(default=0.0, ge=0, le=60)


class HardObservation(Observation):
    payload: bytes = b""
    steps: int = 0


class HardState(State):
    pass


class HardEnv(Environment[HardAction, HardObservation, HardState]):
    """Returns what its action asks for (non-finite rewards, unencodable metadata, huge
    observations) or hangs; every other step is ordinary."""

    def __init__(self) -> None:
        self._state = HardState()

    def reset(self, seed: int | None = None, **options: Any) -> HardObservation:
        self._state = HardState()
        return HardObservation()

    def step(self, action: HardAction) -> HardObservation:
        if action.sleep:
            time.sleep(action.sleep)
        if action.block:
            RELEASE.wait(60)  # hung until the test lets go (bounded)
        self._state.step_count += 1
        metadata: dict[str, Any] = {"thing": object()} if action.unencodable else {}
        return HardObservation(
            reward=float(action.reward),
            payload=b"x" * action.size,
            steps=self._state.step_count,
            metadata=metadata,
        )

    def state(self) -> HardState:
        return self._state

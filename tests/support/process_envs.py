"""Environments for tests that run servers in other processes (workers, the pool)."""

from __future__ import annotations

import os
import time
from typing import Any

from corral.contract import Action, Environment, Observation, State


class PidAction(Action):
    """``sleep`` seconds, ``fail`` raises, ``spin`` burns CPU for that many seconds."""

    sleep: float = 0.0
    spin: float = 0.0
    fail: bool = False


class PidObservation(Observation):
    pid: int
    steps: int = 0


class PidEnv(Environment[PidAction, PidObservation, State]):
    """Reports the process it runs in."""

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, seed: int | None = None, **options: Any) -> PidObservation:
        self.steps = 0
        return PidObservation(pid=os.getpid())

    def step(self, action: PidAction) -> PidObservation:
        if action.fail:
            raise ValueError("failed on purpose")
        time.sleep(action.sleep)
        deadline = time.process_time() + action.spin
        while time.process_time() < deadline:
            pass
        self.steps += 1
        return PidObservation(pid=os.getpid(), steps=self.steps)

    def state(self) -> State:
        return State(step_count=self.steps)


class AsyncPidEnv(PidEnv):
    """The async flavour, awaited on the worker's loop."""

    async def reset(self, seed: int | None = None, **options: Any) -> PidObservation:  # type: ignore[override]
        return PidEnv.reset(self, seed, **options)

    async def step(self, action: PidAction) -> PidObservation:  # type: ignore[override]
        return PidEnv.step(self, action)

"""Environments for replay tests: one whose second step is not determined by the seed,
and one whose steps take a while.

The "randomness" is a process-wide call counter, so two runs always differ (a random
draw could repeat and make a test flaky).
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

from corral.contract import Action, Environment, Observation, State

_CALLS = itertools.count(1)


class Move(Action):
    n: int = 1


class Noisy(Observation):
    n: int = 0
    noise: float = 0.0


class FlakyEnv(Environment[Move, Noisy, State]):
    """Deterministic from the seed, except ``metadata["calls"]`` on every step and
    ``noise`` on step 2."""

    name = "flaky"

    def __init__(self) -> None:
        self._state = State()
        self._rng = random.Random(0)

    def reset(self, seed: int | None = None, **options: Any) -> Noisy:
        self._rng = random.Random(seed)
        self._state = State(episode_id="e", step_count=0)
        return Noisy(n=self._rng.randint(0, 100))

    def step(self, action: Move) -> Noisy:
        self._state.step_count += 1
        count = self._state.step_count
        noise = float(next(_CALLS)) if count == 2 else 0.0
        return Noisy(
            n=self._rng.randint(0, 100) + action.n,
            noise=noise,
            reward=1.0,
            done=count >= 4,
            metadata={"calls": next(_CALLS)},
        )

    def state(self) -> State:
        return self._state


class SlowEnv(FlakyEnv):
    """Steps sleep half a second (for step-timeout tests)."""

    name = "slow"

    def step(self, action: Move) -> Noisy:
        time.sleep(0.5)
        return super().step(action)

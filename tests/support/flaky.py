"""Environments for replay tests: one whose second step is not determined by the seed,
and one whose steps take a while.

The "randomness" is a process-wide call counter, so two runs always differ (a random
draw could repeat and make a test flaky).
"""

from __future__ import annotations

import itertools
import os
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


_SEEN: set[int] = set()


class FragileEnv(FlakyEnv):
    """Three steps of reward 1 (success), except: seeds ``7k+3`` raise on every step
    (``ENV_ERROR`` each attempt), seeds ``7k+5`` raise the first time this server sees
    them only. Each step sleeps ``$FRAGILE_DELAY`` seconds (default 0)."""

    name = "fragile"

    def reset(self, seed: int | None = None, **options: Any) -> Noisy:
        self._seed = seed
        return super().reset(seed)

    def step(self, action: Move) -> Noisy:
        time.sleep(float(os.environ.get("FRAGILE_DELAY", "0")))
        seed = self._seed or 0
        if seed % 7 == 3:
            raise RuntimeError(f"seed {seed} always breaks")
        if seed % 7 == 5 and seed not in _SEEN:
            _SEEN.add(seed)
            raise RuntimeError(f"seed {seed} breaks once")
        self._state.step_count += 1
        done = self._state.step_count >= 3
        return Noisy(
            n=self._state.step_count,
            reward=1.0,
            done=done,
            metadata={"success": True} if done else {},
        )

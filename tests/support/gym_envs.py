"""A Gymnasium environment using every space kind the adapter maps, with numpy infos.

Importing this module registers ``Fancy-v0``; ``gymnasium.make("tests.support.gym_envs:
Fancy-v0")`` (and ``corral serve gym:tests.support.gym_envs:Fancy-v0``) import it first.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

FANCY_ID = "tests.support.gym_envs:Fancy-v0"


class FancyEnv(gymnasium.Env[dict[str, Any], dict[str, Any]]):
    """A point pushed around a plane; every observation and action space kind.

    Reset options: ``start`` (two floats) and ``limit`` (steps before truncation).
    Terminates when the point leaves the square of side 18 around the origin.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.action_space = spaces.Dict(
            {
                "move": spaces.Discrete(3, start=-1),
                "force": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "buttons": spaces.MultiBinary(3),
                "gear": spaces.MultiDiscrete([3, 2]),
                "say": spaces.Text(8, min_length=0, charset="abc "),
            }
        )
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-10.0, 10.0, (2,), np.float64),
                "grid": spaces.Box(0, 255, (3, 3), np.uint8),
                "flags": spaces.MultiBinary(2),
                "counts": spaces.MultiDiscrete([4, 5], start=[1, 0]),
                "last": spaces.Text(8, min_length=0, charset="abc "),
                "pair": spaces.Tuple((spaces.Discrete(5), spaces.Box(-1.0, 1.0, (), np.float32))),
                "trail": spaces.Sequence(spaces.Discrete(3)),
            }
        )
        self._pos = np.zeros(2)
        self._steps = 0
        self._limit = 50
        self._trail: list[int] = []
        self._said = ""

    def _obs(self) -> dict[str, Any]:
        grid = self.np_random.integers(0, 256, (3, 3), dtype=np.uint8)
        return {
            "pos": self._pos.copy(),
            "grid": grid,
            "flags": (self._pos > 0).astype(np.int8),
            "counts": np.array([1 + self._steps % 4, len(self._trail) % 5], dtype=np.int64),
            "last": self._said,
            "pair": (
                np.int64(self._steps % 5),
                np.array(np.tanh(self._pos[0]), dtype=np.float32),
            ),
            "trail": tuple(np.int64(t) for t in self._trail[-4:]),
        }

    def _info(self) -> dict[str, Any]:
        return {
            "step": np.int64(self._steps),
            "pos_copy": self._pos.copy(),
            "nested": {"scale": np.float32(1.5), "ids": np.arange(3, dtype=np.int16)},
            "pair": (1, "two"),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        start = options.get("start")
        self._pos = (
            np.asarray(start, dtype=np.float64)
            if start is not None
            else self.np_random.uniform(-1, 1, 2)
        )
        self._limit = int(options.get("limit", 50))
        self._steps = 0
        self._trail = []
        self._said = ""
        return self._obs(), self._info()

    def step(
        self, action: dict[str, Any]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self._steps += 1
        push = np.asarray(action["force"], dtype=np.float64) * (1 + int(action["gear"][0]))
        self._pos = self._pos + push + int(action["move"]) + 0.1 * action["buttons"][:2]
        self._trail.append(int(action["move"]) + 1)
        self._said = str(action["say"])
        terminated = bool(np.any(np.abs(self._pos) >= 9.0))
        if terminated:
            self._pos = np.clip(self._pos, -10.0, 10.0)
        truncated = not terminated and self._steps >= self._limit
        reward = float(-np.linalg.norm(self._pos))
        return self._obs(), reward, terminated, truncated, self._info()


if "Fancy-v0" not in gymnasium.registry:
    gymnasium.register(id="Fancy-v0", entry_point=FancyEnv)


PAINTED_ID = "tests.support.gym_envs:Painted-v0"


class PaintedEnv(gymnasium.Env[np.ndarray, np.int64]):
    """A counter that renders ``rgb_array`` frames: an 8x8 image whose red channel is the
    count (and whose green channel is ``shade``, a ``gymnasium.make`` keyword)."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = None, shade: int = 0) -> None:
        self.render_mode = render_mode
        self.shade = shade
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(0.0, 100.0, (1,), np.float32)
        self._count = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._count = int(self.np_random.integers(0, 3))
        return np.array([self._count], dtype=np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._count += int(action)
        done = self._count >= 20
        return np.array([self._count], dtype=np.float32), float(action), done, False, {}

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        frame = np.zeros((8, 8, 3), dtype=np.uint8)
        frame[..., 0] = self._count
        frame[..., 1] = self.shade
        return frame


if "Painted-v0" not in gymnasium.registry:
    gymnasium.register(id="Painted-v0", entry_point=PaintedEnv, max_episode_steps=30)

"""Flat spaces for SB3: Dict actions as MultiDiscrete or Box, Dict observations as a Box."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from corral.adapters.gymnasium import SpaceConversionError
from corral.adapters.gymnasium.flat import FlatActions, FlatObservations, FlattenAction


def test_integer_fields_become_one_multi_discrete() -> None:
    original = spaces.Dict(
        {
            "row": spaces.Discrete(3),
            "die": spaces.Discrete(6, start=1),
            "pair": spaces.Tuple([spaces.Discrete(2), spaces.MultiDiscrete([4, 5], start=[1, 0])]),
            "bits": spaces.MultiBinary(2),
        },
        sort_keys=False,
    )
    flat = FlatActions.of(original)
    assert flat.space == spaces.MultiDiscrete([3, 6, 2, 4, 5, 2, 2])
    sample = flat.to_original(np.array([2, 0, 1, 3, 4, 1, 0]))
    assert sample["row"] == 2 and sample["die"] == 1  # the start is added back
    assert sample["pair"][0] == 1 and sample["pair"][1].tolist() == [4, 4]
    assert sample["bits"].tolist() == [1, 0]
    assert original.contains(sample)
    flat.space.seed(0)
    for _ in range(50):  # every learner sample is a valid original sample
        assert original.contains(flat.to_original(flat.space.sample()))


def test_float_fields_become_one_float32_box() -> None:
    original = spaces.Dict(
        {"x": spaces.Box(-1.0, 1.0, shape=(), dtype=np.float64), "v": spaces.Box(0, 2, (2,))},
        sort_keys=False,
    )
    flat = FlatActions.of(original)
    assert flat.space == spaces.Box(np.array([-1, 0, 0]), np.array([1, 2, 2]), dtype=np.float32)
    sample = flat.to_original(np.array([0.5, 1.0, 1.5], dtype=np.float32))
    assert float(sample["x"]) == 0.5 and sample["v"].tolist() == [1.0, 1.5]


def test_single_spaces_only_lose_their_start() -> None:
    die = FlatActions.of(spaces.Discrete(6, start=1))
    assert die.space == spaces.Discrete(6) and die.to_original(np.int64(0)) == 1
    dice = FlatActions.of(spaces.MultiDiscrete([6, 6], start=[1, 1]))
    assert dice.space == spaces.MultiDiscrete([6, 6]) and dice.to_original([0, 5]).tolist() == [
        1,
        6,
    ]
    for same in (spaces.Discrete(2), spaces.Box(0, 1, (3,)), spaces.Text(5)):
        assert FlatActions.of(same).identity


def test_what_sb3_cannot_take_is_refused_by_name() -> None:
    mixed = spaces.Dict({"row": spaces.Discrete(3), "speed": spaces.Box(0, 1, ())})
    with pytest.raises(SpaceConversionError, match=r"integer fields \['row'\].*\['speed'\]"):
        FlatActions.of(mixed)
    with pytest.raises(SpaceConversionError, match=r"\['name'\] have no flat form"):
        FlatActions.of(spaces.Dict({"name": spaces.Text(5), "n": spaces.Discrete(2)}))


def test_observations_flatten_with_gymnasiums_own_flatten() -> None:
    original = spaces.Dict(
        {"board": spaces.Box(-1, 1, (3, 3), dtype=np.int8), "moves": spaces.Discrete(10)}
    )
    flat = FlatObservations.of(original)
    assert flat is not None and flat.space.shape == (19,) and flat.space.dtype == np.float32
    board = np.eye(3, dtype=np.int8)
    vector = flat.flatten({"board": board, "moves": np.int64(3)})
    assert vector.dtype == np.float32 and vector[:9].tolist() == board.reshape(-1).tolist()
    assert vector[9:].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]  # one-hot
    assert FlatObservations.of(spaces.Box(0, 1, (4,))) is None
    with pytest.raises(SpaceConversionError, match="observation_fields"):
        FlatObservations.of(spaces.Dict({"log": spaces.Sequence(spaces.Discrete(2))}))


class Grid(gymnasium.Env[Any, Any]):
    """A 3x3 grid: move to (row, col); reward 1 for the centre."""

    action_space = spaces.Dict({"row": spaces.Discrete(3), "col": spaces.Discrete(3)})
    observation_space = spaces.Dict(
        {"cell": spaces.Box(0, 2, (2,), dtype=np.int64), "steps": spaces.Discrete(5)}
    )

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        return {"cell": np.zeros(2, dtype=np.int64), "steps": 0}, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        cell = np.array([action["row"], action["col"]], dtype=np.int64)
        reward = float(cell.tolist() == [1, 1])
        return {"cell": cell, "steps": self.steps}, reward, self.steps >= 4, False, {}


def test_a_wrapped_env_passes_sb3s_check() -> None:
    from gymnasium.wrappers import FlattenObservation
    from stable_baselines3.common.env_checker import check_env

    env = FlattenObservation(FlattenAction(Grid()))
    assert env.action_space == spaces.MultiDiscrete([3, 3])
    check_env(env)
    env.reset(seed=0)
    observation, reward, *_ = env.step(np.array([1, 1]))
    assert reward == 1.0 and observation[:2].tolist() == [1, 1]

"""Serving Gymnasium environments: models, seeds, options, termination, info on the wire."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import typer
from pydantic import ValidationError
from tests.support.gym_envs import FANCY_ID

from corral.adapters.gymnasium import GymEnvironment, GymState, SpaceConversionError, serve_target
from corral.adapters.gymnasium.remote import info_of
from corral.blocking import run_blocking
from corral.cli.serve import resolve_serve_target
from corral.client import AsyncEnvClient, SyncEnvClient
from corral.client.local_server import LocalServer
from corral.errors import InvalidAction
from corral.testing import InProcessServer


def test_for_id_builds_typed_models() -> None:
    env_class = GymEnvironment.for_id("CartPole-v1")
    assert env_class.name == "gym:CartPole-v1"
    assert "at most 500 steps" in env_class.description
    action = env_class.action_type.model_json_schema()["properties"]["action"]
    assert (action["minimum"], action["maximum"]) == (0, 1)
    obs = env_class.observation_type.model_json_schema()["properties"]["observation"]
    assert obs["x-corral-ndarray"] == {"dtype": "<f4", "shape": [4]}
    assert obs["x-gym-space"]["type"] == "Box"
    assert env_class.state_type is GymState


def test_in_process_episode_matches_gymnasium() -> None:
    env = GymEnvironment.for_id("CartPole-v1")()
    reference = gymnasium.make("CartPole-v1")
    obs = env.reset(seed=11)
    ref_obs, _ = reference.reset(seed=11)
    np.testing.assert_array_equal(obs.observation, ref_obs)  # type: ignore[attr-defined]
    assert obs.reward is None and not obs.done
    action_type = type(env).action_type
    for step in range(1, 200):
        obs = env.step(action_type(action=step % 2))
        ref_obs, reward, terminated, truncated, _ = reference.step(step % 2)
        np.testing.assert_array_equal(obs.observation, ref_obs)  # type: ignore[attr-defined]
        assert obs.reward == reward
        assert obs.done == (terminated or truncated) and obs.truncated == truncated
        if obs.done:
            break
    state = env.state()
    assert state.terminated and state.step_count == step and state.episode_return == step
    assert state.seed == 11 and state.env_id == "CartPole-v1"
    env.close()


def test_truncation_is_not_termination() -> None:
    env = GymEnvironment.for_id("CartPole-v1", max_episode_steps=3)()
    env.reset(seed=0)
    action_type = type(env).action_type
    results = [env.step(action_type(action=i % 2)) for i in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].truncated and not env.state().terminated and env.state().truncated


def test_actions_outside_the_space_are_refused_by_validation() -> None:
    env_class = GymEnvironment.for_id(FANCY_ID)
    good = {"move": 0, "force": [0.5, -0.5], "buttons": [1, 0, 1], "gear": [2, 1], "say": "ab"}
    env_class.action_type(action=good)
    with pytest.raises(ValueError, match="not in the action space"):
        env_class.action_type(action={**good, "force": [2.0, 0.0]})
    with pytest.raises(ValueError, match="not in the action space"):
        env_class.action_type(action={**good, "say": "xyz"})
    with pytest.raises(ValueError, match="less than or equal to 1"):
        env_class.action_type(action={**good, "move": 2})


@pytest.mark.parametrize("codec", ["msgpack", "json"])
@pytest.mark.parametrize("models", ["static", "from-schema"])
def test_seeds_options_and_numpy_info_cross_the_wire(codec: str, models: str) -> None:
    env_class = GymEnvironment.for_id(FANCY_ID)
    reference = gymnasium.make(FANCY_ID)
    with InProcessServer(env_class) as server:
        env = env_class if models == "static" else None
        client = SyncEnvClient(
            AsyncEnvClient(server.url, dialer=server.dialer, codec=codec, env=env)
        )
        with client:
            result = client.reset(seed=5, start=[1.0, -2.0], limit=2)
            ref_obs, ref_info = reference.reset(seed=5, options={"start": [1.0, -2.0], "limit": 2})
            obs = result.observation.observation
            np.testing.assert_array_equal(obs.pos, ref_obs["pos"])
            np.testing.assert_array_equal(obs.grid, ref_obs["grid"])
            info = info_of(result)  # what RemoteEnv returns, whichever models decoded it
            if models == "static":
                assert isinstance(result.info["pos_copy"], np.ndarray)
            assert info["step"] == 0 and type(info["step"]) is np.int64
            assert info["pair"] == [1, "two"]  # tuples come back as lists
            assert isinstance(info["pos_copy"], np.ndarray)
            np.testing.assert_array_equal(info["pos_copy"], ref_info["pos_copy"])
            nested = info["nested"]
            assert nested["scale"] == 1.5 and type(nested["scale"]) is np.float32
            assert nested["ids"].dtype == np.int16 and nested["ids"].tolist() == [0, 1, 2]
            action = {"move": 1, "force": [0.1, 0.2], "buttons": [0, 1, 1], "gear": [1, 0]}
            action["say"] = "cab"
            first = client.step({"action": action})
            with pytest.raises(InvalidAction) as refused:
                client.step({"action": {**action, "gear": [3, 0]}})
            assert "not in the action space" in str(refused.value.details["errors"])
            second = client.step({"action": action})
            assert not first.done and second.truncated and not second.terminated
            assert first.observation.observation.last == "cab"
            assert info_of(second)["step"] == 2


def test_unknown_ids_and_bad_targets_are_explained() -> None:
    with pytest.raises(ValueError, match="unknown Gymnasium environment 'NoSuchEnv-v0'"):
        GymEnvironment.for_id("NoSuchEnv-v0")
    with pytest.raises(ValueError, match="importing 'no_such_module' failed"):
        GymEnvironment.for_id("no_such_module:Thing-v0")
    with pytest.raises(ValueError, match="looks like 'gym:CartPole-v1'"):
        serve_target("gym:")
    with pytest.raises(typer.BadParameter, match="NoSuchEnv-v0"):
        resolve_serve_target("gym:NoSuchEnv-v0")
    assert resolve_serve_target("gym:CartPole-v1").name == "gym:CartPole-v1"


def test_the_template_cannot_be_served_directly() -> None:
    with pytest.raises(TypeError, match=r"GymEnvironment.for_id"):
        GymEnvironment()


def test_a_factory_must_keep_its_spaces() -> None:
    sizes = iter([2, 3])

    def make() -> gymnasium.Env[Any, Any]:
        env = gymnasium.make("CartPole-v1")
        env.action_space = gymnasium.spaces.Discrete(next(sizes))
        return env

    env_class = GymEnvironment.for_factory(make, name="shifty")
    with pytest.raises(SpaceConversionError, match="spaces differ"):
        env_class()


def test_corral_serve_gym_target_in_a_subprocess() -> None:
    server = LocalServer(f"gym:{FANCY_ID}")
    url = run_blocking(server.start(), 60)
    try:
        with SyncEnvClient(AsyncEnvClient(url)) as client:
            assert client.server_info["env"]["name"] == f"gym:{FANCY_ID}"
            result = client.reset(seed=1, start=[0.0, 0.0])
            np.testing.assert_array_equal(result.observation.observation.pos, [0.0, 0.0])
            assert client.state().seed == 1
    finally:
        server.stop_now()


def test_state_counts_the_episode_and_discrete_actions_keep_their_bounds() -> None:
    env_class = GymEnvironment.for_id("CartPole-v1")
    env = env_class()
    assert env.state() == GymState(env_id="CartPole-v1")
    env.reset(seed=4)
    first = env.state()
    rewards = [env.step(env_class.action_type(action=k % 2)).reward for k in range(3)]
    state = env.state()
    assert (state.seed, state.step_count, state.episode_return) == (4, 3, sum(rewards))
    assert state.episode_id == first.episode_id and not (state.terminated or state.truncated)
    assert env.state() is not state  # a fresh model every time: callers may keep it
    env.reset()
    assert env.state().step_count == 0 and env.state().episode_id != first.episode_id
    with pytest.raises(ValueError, match="less than or equal to 1"):
        env_class.action_type(action=2)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        env_class.action_type(action=-1)


class _LooseBox(gymnasium.Env[np.ndarray, np.int64]):
    """A Box of float32 whose environment hands out float64 observations and numpy info
    (and, for action 0, an observation of the wrong shape)."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(2), {"depth": np.int16(3), "where": np.ones(2, np.uint8)}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        # Action 0 breaks the space: an observation of the wrong shape.
        return np.full(2 if action else 3, 0.5), 1.0, False, True, {}


def _validated(model: Any, observation: Any) -> Any:
    """``observation`` built again by pydantic's validation, from the same values."""
    fields = {name: getattr(observation, name) for name in observation.model_fields_set}
    return model(**fields)


def _same_dump(fast: dict[str, Any], slow: dict[str, Any]) -> None:
    assert list(fast) == list(slow)  # same keys, same order
    for key, value in slow.items():
        if isinstance(value, np.ndarray):
            assert fast[key].dtype == value.dtype and np.array_equal(fast[key], value)
        else:
            assert fast[key] == value and type(fast[key]) is type(value)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "FrozenLake-v1", "loose"])
def test_plain_observations_are_built_and_dumped_as_pydantic_would(env_id: str) -> None:
    from corral.protocol.codecs import PYTHON_DUMP, MsgpackCodec

    if env_id == "loose":
        env_class = GymEnvironment.for_factory(_LooseBox, name="Loose-v0")
    else:
        env_class = GymEnvironment.for_id(env_id)
    model: Any = env_class.observation_type
    assert env_class.plain_observation is not None and PYTHON_DUMP in vars(model)
    env = env_class()
    action = env_class.action_type(action=1)  # type: ignore[call-arg]
    observations = [env.reset(seed=3), env.step(action), env.step(action)]
    codec = MsgpackCodec()
    for observation in observations:
        slow = _validated(model, observation)
        assert observation == slow and observation.model_fields_set == slow.model_fields_set
        assert type(observation.observation) is np.ndarray or env_id == "FrozenLake-v1"
        pydantic_dump = model.__pydantic_serializer__.to_python(slow, mode="python")
        _same_dump(codec.dump(observation), pydantic_dump)
        _same_dump(codec.dump_many(model, [observation])[0], pydantic_dump)
        # Validated assignment keeps the fast dump right (and empty components out).
        observation.reward_components = {"shape": 0.5}
        slow = model.__pydantic_serializer__.to_python(observation, mode="python")
        assert "reward_components" in slow
        _same_dump(codec.dump(observation), slow)
    if env_id == "loose":
        assert observations[1].observation.dtype == np.float32  # the binding cast it
        assert observations[0].metadata["where"].dtype == np.uint8
        # A sample validation would refuse is still refused: it goes through validation.
        with pytest.raises(ValidationError, match="expected shape"):
            env.step(env_class.action_type(action=0))  # type: ignore[call-arg]
    env.close()


def test_structured_observations_keep_pydantic_throughout() -> None:
    from corral.protocol.codecs import PYTHON_DUMP

    env_class = GymEnvironment.for_id(FANCY_ID)
    assert env_class.plain_observation is None
    assert PYTHON_DUMP not in vars(env_class.observation_type)

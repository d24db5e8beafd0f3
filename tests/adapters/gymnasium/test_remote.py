"""A remote session as a ``gymnasium.Env``, proven by Gymnasium's own checkers."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.utils.env_match import check_environments_match
from tests.support.gym_envs import FANCY_ID

from corral.adapters.gymnasium import GymEnvironment, RemoteEnv, as_gymnasium
from corral.client import AsyncEnvClient, SyncEnvClient
from corral.envs.wordle import WordleEnv
from corral.testing import InProcessServer


def _warnings_of(check: Callable[[], None]) -> set[str]:
    """The warnings ``check`` gives, but the collector's: a ``ResourceWarning`` is raised
    for whatever object the garbage collector happens to free meanwhile (an earlier
    test's, in the same worker), not by the check."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check()
    return {str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)}


@pytest.fixture(scope="module")
def cartpole() -> Iterator[RemoteEnv]:
    """CartPole served by ``corral serve gym:CartPole-v1`` in its own process."""
    env = RemoteEnv.from_env("gym:CartPole-v1")
    yield env
    env.close()


def test_check_env_passes_for_served_cartpole(cartpole: RemoteEnv) -> None:
    remote = _warnings_of(lambda: check_env(cartpole, skip_render_check=True))
    local = _warnings_of(
        lambda: check_env(gymnasium.make("CartPole-v1").unwrapped, skip_render_check=True)
    )
    # CartPole's own infinite observation bounds warn; the adapter adds no warning.
    assert remote <= local, remote - local


def test_served_cartpole_matches_the_local_one(cartpole: RemoteEnv) -> None:
    assert cartpole.action_space == gymnasium.spaces.Discrete(2)
    check_environments_match(gymnasium.make("CartPole-v1"), cartpole, num_steps=300, seed=4)


def test_check_env_passes_for_the_wordle_text_game() -> None:
    with InProcessServer(WordleEnv) as server:
        env = as_gymnasium(SyncEnvClient(AsyncEnvClient(server.url, dialer=server.dialer)))
        try:
            assert _warnings_of(lambda: check_env(env, skip_render_check=True)) == set()
            letters = gymnasium.spaces.Text(5, min_length=5, charset=_ascii_letters())
            assert env.action_space == letters
            assert isinstance(env.observation_space, gymnasium.spaces.Dict)
            obs, info = env.reset(seed=7, options={"max_guesses": 3})
            assert obs["guesses_left"] == 3 and info == {}
            assert obs["turns_left"] == (0, np.array(20))
            obs, reward, _terminated, truncated, _ = env.step("CRANE")
            assert obs["guess"] == "crane" and obs["guesses_left"] in (2, 3)
            assert isinstance(reward, float) and not truncated
            state = env.state()  # typed from the server's schema
            assert type(state).__name__ == "WordleState" and state.step_count == 1
            assert state.model_dump()["guesses"] == ["crane"]
        finally:
            env.close()
            env.close()  # idempotent


def _ascii_letters() -> str:
    import string

    return string.ascii_letters


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_every_space_kind_passes_check_env_remotely(codec: str) -> None:
    with InProcessServer(GymEnvironment.for_id(FANCY_ID)) as server:
        env = RemoteEnv.from_url(server.url, dialer=server.dialer, codec=codec)
        try:
            assert env.observation_space == gymnasium.make(FANCY_ID).observation_space
            assert env.action_space == gymnasium.make(FANCY_ID).action_space
            assert _warnings_of(lambda: check_env(env, skip_render_check=True)) == set()
            check_environments_match(
                gymnasium.make(FANCY_ID), env, num_steps=60, seed=2, info_comparison="skip"
            )
            _, info = env.reset(seed=3)
            assert info["pos_copy"].dtype == np.float64 and info["pos_copy"].flags.writeable
            assert info["nested"]["ids"].tolist() == [0, 1, 2]
        finally:
            env.close()


def test_observation_fields_select_what_has_a_space() -> None:
    with InProcessServer(WordleEnv) as server:
        env = RemoteEnv.from_url(
            server.url, dialer=server.dialer, observation_fields=["guesses_left"]
        )
        try:
            obs, _ = env.reset(seed=1)
            assert obs == np.array(6) and env.observation_space.contains(obs)
        finally:
            env.close()


def test_keeping_the_client_open() -> None:
    with InProcessServer(WordleEnv) as server:
        client: SyncEnvClient[Any, Any, Any] = SyncEnvClient(
            AsyncEnvClient(server.url, dialer=server.dialer)
        )
        env = RemoteEnv(client, close_client=False)
        env.reset(seed=1)
        env.close()
        assert client.reset(seed=2).observation.guesses_left == 6
        client.close()

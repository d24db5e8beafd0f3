"""N remote sessions as a VectorEnv: step-for-step equal to a local SyncVectorEnv (without
recovery, whose seeded autoresets differ from a local env's unseeded ones by design)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium
import httpx
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from tests.support.gym_envs import FANCY_ID

from corral.adapters.gymnasium import (
    ClientSessions,
    GymEnvironment,
    PoolSessions,
    RemoteVectorEnv,
)
from corral.adapters.gymnasium.vector import autoreset
from corral.blocking import run_blocking
from corral.client import AsyncEnvClient
from corral.testing import InProcessNetwork, InProcessServer

NUM_ENVS = 4
STEPS = 300


@pytest.fixture(scope="module")
def cartpole_server() -> Iterator[InProcessServer]:
    with InProcessServer(GymEnvironment.for_id("CartPole-v1")) as server:
        yield server


def _without_tuples(info: Any) -> Any:
    """Drop FancyEnv's tuple-valued ``pair`` key: tuples in infos come back as lists."""
    if isinstance(info, dict):
        return {k: _without_tuples(v) for k, v in info.items() if k not in ("pair", "_pair")}
    if isinstance(info, np.ndarray) and info.dtype == object:
        return np.array([_without_tuples(v) for v in info], dtype=object)
    return info


def _assert_same(remote: tuple[Any, ...], local: tuple[Any, ...], where: str) -> None:
    names = ("observations", "rewards", "terminations", "truncations", "infos")
    if len(remote) == 2:
        names = ("observations", "infos")
    for name, a, b in zip(names, remote, local, strict=True):
        if name == "infos":
            a, b = _without_tuples(a), _without_tuples(b)
        assert data_equivalence(a, b, exact=True), f"{where}: {name} differ: {a!r} != {b!r}"


def _drive(remote: Any, local: Any, mode: AutoresetMode, steps: int, seed: int) -> tuple[int, int]:
    """Step both with the same actions; return (episodes ended, autoresets seen)."""
    _assert_same(remote.reset(seed=seed), local.reset(seed=seed), "reset")
    local.action_space.seed(seed)
    ended = 0
    for step in range(steps):
        actions = local.action_space.sample()
        result = remote.step(actions)
        _assert_same(result, local.step(actions), f"step {step}")
        done = np.logical_or(result[2], result[3])
        ended += int(done.sum())
        if mode is AutoresetMode.DISABLED and done.any():
            options = {"reset_mask": done}
            _assert_same(
                remote.reset(options=dict(options)),
                local.reset(options=dict(options)),
                f"masked reset after step {step}",
            )
    return ended, step + 1


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_equivalent_to_sync_vector_env_on_cartpole(
    cartpole_server: InProcessServer, mode: AutoresetMode
) -> None:
    remote = RemoteVectorEnv.from_url(
        cartpole_server.url,
        NUM_ENVS,
        dialer=cartpole_server.dialer,
        autoreset_mode=mode,
        recover=False,
    )
    local = SyncVectorEnv(
        [lambda: gymnasium.make("CartPole-v1") for _ in range(NUM_ENVS)], autoreset_mode=mode
    )
    try:
        assert remote.single_action_space == local.single_action_space
        assert remote.single_observation_space == local.single_observation_space
        assert remote.action_space == local.action_space
        assert remote.observation_space == local.observation_space
        assert remote.metadata["autoreset_mode"] is mode
        ended, steps = _drive(remote, local, mode, STEPS, seed=9)
        assert steps == STEPS and ended > 20, "the run must cross many episode boundaries"
    finally:
        remote.close()
        local.close()


def test_equivalent_with_dict_spaces_options_and_infos() -> None:
    mode = AutoresetMode.SAME_STEP
    with InProcessServer(GymEnvironment.for_id(FANCY_ID)) as server:
        remote = RemoteVectorEnv.from_url(
            server.url, 3, dialer=server.dialer, autoreset_mode=mode, recover=False
        )
        local = SyncVectorEnv(
            [lambda: gymnasium.make(FANCY_ID) for _ in range(3)], autoreset_mode=mode
        )
        try:
            options = {"limit": 5}
            _assert_same(
                remote.reset(seed=[1, 2, 3], options=options),
                local.reset(seed=[1, 2, 3], options=options),
                "reset",
            )
            ended, _ = _drive(remote, local, mode, 40, seed=1)
            assert ended > 0
        finally:
            remote.close()
            local.close()


def test_one_local_server_for_all_sessions_in_a_pool() -> None:
    envs = RemoteVectorEnv.from_env("gym:CartPole-v1", 3, autoreset_mode="same_step")
    try:
        assert isinstance(envs.sessions, PoolSessions)
        (url,) = envs.sessions.async_pool.server_urls
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (3, 4) and envs.autoreset_mode is AutoresetMode.SAME_STEP
        envs.step(np.array([0, 1, 0]))
    finally:
        envs.close()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=2)


def test_disabled_mode_refuses_to_step_an_ended_session(cartpole_server: InProcessServer) -> None:
    envs = RemoteVectorEnv.from_url(
        cartpole_server.url, 2, dialer=cartpole_server.dialer, autoreset_mode=AutoresetMode.DISABLED
    )
    try:
        envs.reset(seed=0)
        done = np.zeros(2, dtype=bool)
        while not done.any():
            _, _, terminated, truncated, _ = envs.step(np.array([0, 0]))
            done = terminated | truncated
        with pytest.raises(RuntimeError, match=r"ended and autoreset_mode is DISABLED"):
            envs.step(np.array([0, 0]))
    finally:
        envs.close()


def test_bad_seeds_masks_and_modes_are_refused(cartpole_server: InProcessServer) -> None:
    clients = [AsyncEnvClient(cartpole_server.url, dialer=cartpole_server.dialer) for _ in range(2)]
    envs = RemoteVectorEnv(clients)
    try:
        with pytest.raises(ValueError, match="length must match num_envs=2"):
            envs.reset(seed=[1, 2, 3])
        with pytest.raises(TypeError, match="must be a numpy array"):
            envs.reset(options={"reset_mask": [True, False]})
        with pytest.raises(ValueError, match="must have shape"):
            envs.reset(options={"reset_mask": np.array([True])})
        with pytest.raises(TypeError, match=r"dtype=np\.bool_"):
            envs.reset(options={"reset_mask": np.array([1, 0])})
        with pytest.raises(ValueError, match="at least one True"):
            envs.reset(options={"reset_mask": np.zeros(2, dtype=bool)})
    finally:
        envs.close()
    with pytest.raises(ValueError, match="use one of NEXT_STEP, SAME_STEP, DISABLED"):
        autoreset("sometimes")
    assert autoreset("NextStep") is AutoresetMode.NEXT_STEP
    with pytest.raises(ValueError, match="at least one session"):
        ClientSessions([])


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_autoreset_episodes_move_by_replay_when_their_server_is_lost(mode: AutoresetMode) -> None:
    """With recovery on (the default) the vector env's autoresets are seeded from the
    pool: an episode that began in an autoreset moves by verified replay when its server
    is lost, instead of ending truncated, and the run is the one it would have been."""

    def run(lose: bool) -> tuple[list[Any], int, dict[str, Any]]:
        network = InProcessNetwork()
        a = network.serve(GymEnvironment.for_id("CartPole-v1"), server_id="a")
        b = network.serve(GymEnvironment.for_id("CartPole-v1"), server_id="b")
        envs = RemoteVectorEnv.from_url(
            [a.url, b.url], NUM_ENVS, dialer=network, autoreset_mode=mode, health_interval=None
        )
        try:
            envs.reset(seed=5)
            actions = np.random.default_rng(0)
            seen, ended = [], 0
            for step in range(120):
                if lose and step == 100:  # each session has had several autoresets by now
                    run_blocking(b.restart(), 60)
                obs, _, terminated, truncated, _ = envs.step(actions.integers(0, 2, NUM_ENVS))
                assert not truncated.any(), f"step {step}: an episode was cut short"
                seen.append(obs.copy())
                ended += int(terminated.sum()) if step < 100 else 0
            return seen, ended, envs.sessions.async_pool.stats()  # type: ignore[attr-defined]
        finally:
            envs.close()
            run_blocking(network.aclose(), 30)

    kept, ended, _ = run(lose=False)
    moved, _, stats = run(lose=True)
    assert ended >= 2 * NUM_ENVS, "the sessions on the lost server must be in later episodes"
    assert stats["restored_by_replay"] >= 1 and stats["truncated"] == 0, stats
    for step, (x, y) in enumerate(zip(kept, moved, strict=True)):
        assert np.array_equal(x, y), f"step {step}: the run changed"

"""Stable-Baselines3 trains PPO on a served CartPole through the Gymnasium adapter."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("stable_baselines3", reason="needs the sb3 extra")

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_checker import check_env
from tests.support.servers import running

from corral.adapters.gymnasium import GymEnvironment, RemoteEnv

EVAL_SEEDS = range(1000, 1005)


@pytest.fixture
def cartpole() -> Iterator[RemoteEnv]:
    with running(GymEnvironment.for_id("CartPole-v1")) as server:
        env = RemoteEnv.from_url(server.url)
        yield env
        env.close()


def _mean_return(env: RemoteEnv, act: Callable[[Any], int]) -> float:
    returns = []
    for seed in EVAL_SEEDS:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def test_sb3_check_env_passes(cartpole: RemoteEnv) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(cartpole)
    assert not [w for w in caught if "corral" in str(w.filename)]


@pytest.mark.slow
def test_ppo_learns_on_a_served_cartpole(cartpole: RemoteEnv) -> None:
    torch.set_num_threads(1)  # the suite shares two cores
    rng = np.random.default_rng(0)
    random_mean = _mean_return(cartpole, lambda _: int(rng.integers(2)))
    model = PPO(
        "MlpPolicy",
        cartpole,
        n_steps=512,
        batch_size=64,
        n_epochs=10,
        learning_rate=1e-3,
        gamma=0.98,
        gae_lambda=0.9,
        seed=0,
        device="cpu",
    )
    model.learn(total_timesteps=4096)
    trained_mean = _mean_return(
        cartpole, lambda obs: int(model.predict(obs, deterministic=True)[0])
    )
    print(f"PPO after 4096 steps: mean return {trained_mean:.1f}; random policy {random_mean:.1f}")
    assert trained_mean > 2 * random_mean, (trained_mean, random_mean)

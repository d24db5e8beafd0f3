"""Reward components on /metrics: real Wordle episodes, and bounded series."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.contract import Observation
from corral.envs.wordle import SimplePolicy, WordleEnv
from corral.server.rewards import MAX_COMPONENTS, OTHER, RewardStats


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def test_wordle_components_reach_metrics() -> None:
    with running(WordleEnv) as srv:
        rewards: dict[str, float] = {}
        steps = 0
        async with AsyncEnvClient(srv.url, env=WordleEnv) as env:
            for seed in range(3):
                policy = SimplePolicy(seed=seed)
                result = await env.reset(seed=seed)
                while not result.done:
                    result = await env.step(policy.act(result.observation))
                    steps += 1
                    obs = result.observation
                    assert sum(obs.reward_components.values()) == obs.reward
                    for name, value in obs.reward_components.items():
                        rewards[name] = rewards.get(name, 0.0) + value
        text = httpx.get(f"{srv.url}/metrics").text
    sums = samples(text, "corral_reward_component_running_sum")
    assert {dict(k)["component"] for k in sums} == set(rewards)
    for labels, value in sums.items():
        assert abs(value - rewards[dict(labels)["component"]]) < 1e-9
    counts = {
        dict(k)["component"]: v
        for k, v in samples(text, "corral_reward_component_bucket").items()
        if dict(k)["le"] == "+Inf"
    }
    assert set(counts) == set(rewards) and sum(counts.values()) >= steps
    total = samples(text, "corral_step_reward_bucket")[(("le", "+Inf"),)]
    assert total == steps  # the resets have no reward


def test_component_names_are_bounded() -> None:
    stats = RewardStats()
    for i in range(MAX_COMPONENTS + 10):
        stats.observe(Observation(reward=1.0, reward_components={f"c{i}": 1.0}))
    assert len(stats.components) == MAX_COMPONENTS + 1
    assert stats.components[OTHER].observations == 10
    stats.observe(Observation(reward=float("nan"), reward_components={"c0": float("inf")}))
    assert stats.reward.observations == MAX_COMPONENTS + 10
    assert stats.components["c0"].observations == 1


def test_openenv_replies_carry_components_beside_the_observation() -> None:
    from corral.protocol.openenv import flatten_observation, unflatten_observation

    wire = {"done": False, "reward": 0.3, "reward_components": {"a": 0.3}, "word": "x"}
    flat = flatten_observation(wire)
    assert flat["observation"] == {"word": "x"} and flat["reward_components"] == {"a": 0.3}
    assert unflatten_observation(flat)["reward_components"] == {"a": 0.3}
    assert "reward_components" not in flatten_observation({"reward": 0.0, "word": "x"})

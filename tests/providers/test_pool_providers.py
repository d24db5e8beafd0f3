"""``EnvPool(n, target, provider=..., servers=M)``: the pool's servers from a provider,
owned by the pool (stopped with it, a dead one replaced), the provider left open."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from tests.support.pools import step_until_replaced

from corral.client import EnvPool
from corral.envs.echo import EchoEnv
from corral.providers.docker import BuiltImage, DockerProvider
from corral.providers.local import LocalProcessProvider


async def test_a_pool_over_the_local_process_provider() -> None:
    async with LocalProcessProvider() as provider:
        pool: EnvPool = EnvPool(
            4,
            "corral.envs.echo:EchoEnv",
            env=EchoEnv,
            provider=provider,
            servers=2,
            health_interval=0.2,
            on_error="return",
            progress=False,
        )
        async with pool:
            assert len(provider.endpoints) == 2
            assert sorted(pool.server_urls) == sorted(e.url for e in provider.endpoints)
            await pool.reset(seed=0)
            victim = pool.fleet.servers[1]
            old_url = victim.url
            os.killpg(victim.handle.endpoint.pid, signal.SIGKILL)
            await step_until_replaced(pool, 1, old_url)
            assert len(provider.endpoints) == 2  # the dead one released, its successor up
        assert provider.endpoints == []  # the pool stopped what it started
        assert not provider.closed


@pytest.mark.docker
async def test_a_pool_over_the_docker_provider(docker_client: Any, echo_image: BuiltImage) -> None:
    async with DockerProvider(docker_client, startup_timeout=60) as provider:
        pool: EnvPool = EnvPool(
            4,
            echo_image.tag,
            env=EchoEnv,
            provider=provider,
            servers=2,
            health_interval=0.2,
            on_error="return",
            progress=False,
        )
        async with pool:
            batch = await pool.reset(seed=0)
            assert batch.ids.tolist() == [0, 1, 2, 3]
            victim = pool.fleet.servers[0]
            old_url = victim.url
            docker_client.containers.get(victim.handle.endpoint.id).kill()
            await step_until_replaced(pool, 0, old_url)
        assert provider.endpoints == []


def test_a_provider_takes_a_spec_not_urls() -> None:
    provider = LocalProcessProvider()
    with pytest.raises(ValueError, match="spec"):
        EnvPool(2, "http://127.0.0.1:1", provider=provider)
    with pytest.raises(ValueError, match="server_args"):
        EnvPool(2, "corral.envs.echo:EchoEnv", provider=provider, server_args=["--x"])

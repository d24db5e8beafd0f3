"""RayProvider on a real local Ray cluster, one for the module (loopback only)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import httpx
import pytest

# Every Ray process on 127.0.0.1, not on the machine's interface address: set before Ray
# is imported (it reads the variable once).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="needs the ray extra")

from tests.support.pools import step_until_replaced  # noqa: E402

from corral.client import AsyncEnvClient, EnvPool  # noqa: E402
from corral.envs.echo import EchoAction, EchoEnv  # noqa: E402
from corral.errors import CorralError, ServerStartError  # noqa: E402
from corral.providers.ray import RayEndpoint, RayProvider  # noqa: E402

pytestmark = pytest.mark.ray

ECHO = "corral.envs.echo:EchoEnv"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A local Ray for this module (the only one using it): few CPUs, a custom resource,
    no dashboard. Shut down when the module is done, not when the session is: idle, its
    processes take ~1.7 CPU-seconds a minute from the rest of the suite."""
    ray.init(
        num_cpus=4,
        resources={"env_slot": 2},
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=80 * 2**20,
        configure_logging=False,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def provider(**options: object) -> RayProvider:
    options.setdefault("host", "127.0.0.1")
    options.setdefault("num_cpus", 0.25)
    return RayProvider(**options)  # type: ignore[arg-type]


async def echo_once(url: str, message: str = "hi") -> str:
    async with AsyncEnvClient(url) as env:
        await env.reset()
        return str((await env.step(EchoAction(message=message))).observation.echoed_message)


async def test_a_server_per_actor(ray_cluster: str) -> None:
    async with provider() as rays:
        endpoint = await rays.start(ECHO)
        assert isinstance(endpoint, RayEndpoint)
        assert endpoint.url.startswith("http://127.0.0.1:")
        assert endpoint.node_ip == "127.0.0.1" and endpoint.actor_id and endpoint.pid
        assert await echo_once(endpoint.url) == "hi"
        assert await rays.alive(endpoint)
        assert rays.endpoints == [endpoint]
        await rays.stop(endpoint)
        assert not await rays.alive(endpoint)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{endpoint.url}/health", timeout=2, trust_env=False)


async def test_placement_by_custom_resources(ray_cluster: str) -> None:
    """The cluster has two ``env_slot``s: a third server is not placed, and says so."""
    async with provider(resources={"env_slot": 1}) as rays:
        first, second = await asyncio.gather(rays.start(ECHO), rays.start(ECHO))
        assert first.actor_id != second.actor_id
        with pytest.raises(ServerStartError, match="was not placed and ready within 3 s"):
            await rays.start(_spec(startup_timeout=3))
        await rays.stop(first)
        # The slot is free again.
        third = await rays.start(ECHO)
        assert await echo_once(third.url) == "hi"


def _spec(**options: object) -> object:
    from corral.providers.base import ServerSpec

    return ServerSpec(ECHO, **options)  # type: ignore[arg-type]


async def test_placement_group_bundle(ray_cluster: str) -> None:
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 0.25}, {"CPU": 0.25}])
    await asyncio.wrap_future(group.ready().future())
    try:
        async with provider(placement_group=group, bundle_index=1) as rays:
            endpoint = await rays.start(ECHO)
            assert await echo_once(endpoint.url) == "hi"
    finally:
        remove_placement_group(group)


async def test_a_failing_server_reports_its_output(ray_cluster: str) -> None:
    async with provider() as rays:
        with pytest.raises(ServerStartError) as caught:
            await rays.start("corral.envs.no_such_module:Env")
        assert "no_such_module" in str(caught.value)
        assert rays.endpoints == []


async def test_a_killed_actor_is_seen_dead_and_its_clients_fail(ray_cluster: str) -> None:
    async with provider() as rays:
        endpoint = await rays.start(ECHO)
        async with AsyncEnvClient(endpoint.url, reconnect=False, timeout=30) as env:
            await env.reset()
            ray.kill(rays.actor(endpoint), no_restart=True)
            deadline = time.monotonic() + 60
            while await rays.alive(endpoint):
                assert time.monotonic() < deadline, "the dead actor was not noticed"
                await asyncio.sleep(0.05)
            # The actor's guardian stops the server once it sees the actor gone, which a
            # loaded machine may delay past the moment Ray reports the death: the client
            # fails once the server is down (a step before that may still be answered).
            with pytest.raises(CorralError):
                while True:
                    assert time.monotonic() < deadline, "the server outlived its actor"
                    await env.step(EchoAction(message="gone"))
                    await asyncio.sleep(0.05)


async def test_a_pool_over_ray_replaces_a_killed_actor(ray_cluster: str) -> None:
    async with provider() as rays:
        pool: EnvPool = EnvPool(
            4,
            ECHO,
            env=EchoEnv,
            provider=rays,
            servers=2,
            health_interval=0.2,
            on_error="return",
            progress=False,
        )
        async with pool:
            await pool.reset(seed=0)
            victim = pool.fleet.servers[1]
            old_url = victim.url
            ray.kill(rays.actor(victim.handle.endpoint), no_restart=True)
            await step_until_replaced(pool, 1, old_url)
        assert rays.endpoints == []


DRIVER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    import ray
    from corral.providers.ray import RayProvider

    async def main():
        ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
        endpoint = await RayProvider(host="127.0.0.1", num_cpus=0.25).start(sys.argv[2])
        print(endpoint.url, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


async def test_actors_die_with_their_driver(ray_cluster: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DRIVER,
        ray_cluster,
        ECHO,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert process.stdout is not None
    url = (await asyncio.wait_for(process.stdout.readline(), 180)).decode().strip()
    assert url.startswith("http://127.0.0.1:"), url
    await process.communicate()
    deadline = time.monotonic() + 90
    while True:
        try:
            httpx.get(f"{url}/health", timeout=2, trust_env=False)
        except httpx.HTTPError:
            break
        assert time.monotonic() < deadline, "the server outlived its driver"
        await asyncio.sleep(0.2)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="not both"):
        RayProvider(placement_group=object(), scheduling_strategy="SPREAD")
    with pytest.raises(ValueError, match="num_cpus"):
        RayProvider(num_cpus=-1)


def test_the_provider_imports_without_starting_ray() -> None:
    code = "import corral.providers.ray, ray; assert not ray.is_initialized()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

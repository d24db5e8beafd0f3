"""KubernetesProvider end to end: kmock's API emulator, a kubelet running real servers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from tests.support.kube import Cluster
from tests.support.pools import step_until_replaced

from corral.client import AsyncEnvClient, EnvPool
from corral.envs.echo import EchoAction, EchoEnv
from corral.errors import CorralError, ServerStartError
from corral.providers.base import ServerSpec
from corral.providers.kubernetes import KubernetesEndpoint, KubernetesProvider
from corral.providers.kubernetes.pods import OWNER_LABEL
from corral.providers.spares import WarmPool

ECHO = "corral.envs.echo:EchoEnv"


def provider_for(kube: Cluster, **options: object) -> KubernetesProvider:
    options.setdefault("connect", "in-cluster")
    options.setdefault("guard", False)
    return KubernetesProvider(
        configuration=kube.configuration(),
        namespace=kube.namespace,
        **options,  # type: ignore[arg-type]
    )


async def echo_once(url: str, message: str = "hi", token: str | None = None) -> str:
    async with AsyncEnvClient(url, token=token) as env:
        await env.reset()
        result = await env.step(EchoAction(message=message))
        return str(result.observation.echoed_message)


async def wait_for(predicate: object, timeout: float = 30.0) -> None:
    """Wait (bounded) until ``predicate()`` is true: the watch updates state asynchronously."""
    deadline = time.monotonic() + timeout
    while not await predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_a_pod_per_server_reached_in_cluster(kube: Cluster, echo_env_dir: Path) -> None:
    async with provider_for(kube) as provider:
        endpoint = await provider.start(echo_env_dir)
        assert isinstance(endpoint, KubernetesEndpoint)
        assert endpoint.url == f"http://{endpoint.pod_ip}:8000"
        assert await echo_once(endpoint.url) == "hi"
        assert await provider.alive(endpoint)
        assert provider.endpoints == [endpoint]
        (pod,) = kube.objects("pods")
        assert pod["metadata"]["name"] == endpoint.pod
        assert pod["metadata"]["labels"][OWNER_LABEL] == provider.owner
        container = pod["spec"]["containers"][0]
        assert container["image"] == "corral-echo:0.1.0"
        assert container["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}
        (lease,) = kube.objects("leases")
        assert lease["metadata"]["labels"][OWNER_LABEL] == provider.owner
        assert lease["spec"]["holderIdentity"].endswith(f"/{os.getpid()}")
        await provider.stop(endpoint)
        assert kube.objects("pods") == []
        assert provider.endpoints == []
        assert not await provider.alive(endpoint)
    # Closing deletes the Lease too.
    assert kube.objects("leases") == []


async def test_port_forward_carries_many_connections(kube: Cluster, echo_env_dir: Path) -> None:
    async with provider_for(kube, connect="port-forward") as provider:
        endpoint = await provider.start(echo_env_dir)
        assert endpoint.host == "127.0.0.1" and endpoint.pod_ip != "127.0.0.1"
        # Each connection is a stream of its own through the API server.
        echoed = await asyncio.gather(*(echo_once(endpoint.url, f"m{i}") for i in range(4)))
        assert echoed == ["m0", "m1", "m2", "m3"]
        await provider.stop(endpoint)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{endpoint.url}/health", timeout=2, trust_env=False)


async def test_url_mode_formats_the_template(kube: Cluster, echo_env_dir: Path) -> None:
    async with provider_for(kube, connect="url", url="http://{ip}:{port}/") as provider:
        endpoint = await provider.start(echo_env_dir)
        assert endpoint.url == f"http://{endpoint.pod_ip}:8000"
        assert await echo_once(endpoint.url) == "hi"


async def test_an_entry_point_served_by_a_given_image(kube: Cluster) -> None:
    async with provider_for(kube, image="corral-base:latest", port=9000) as provider:
        endpoint = await provider.start(ServerSpec(ECHO, max_sessions=2))
        assert endpoint.port == 9000
        (pod,) = kube.objects("pods")
        assert pod["metadata"]["name"].startswith("corral-echoenv-")
        command = pod["spec"]["containers"][0]["command"]
        assert command[4] == ECHO and command[-2:] == ["--max-sessions", "2"]
        assert await echo_once(endpoint.url) == "hi"


async def test_an_image_without_a_known_command_takes_no_server_options(kube: Cluster) -> None:
    async with provider_for(kube) as provider:
        with pytest.raises(ServerStartError, match="command corral does not know"):
            await provider.start(ServerSpec("registry.example.com/env:1", max_sessions=2))
        assert kube.objects("pods") == []


async def test_image_pull_backoff_fails_at_once_with_the_reason(kube: Cluster) -> None:
    async with provider_for(kube, startup_timeout=600) as provider:
        with pytest.raises(ServerStartError) as caught:
            await provider.start("unpullable/corral-echo:9")
        message = str(caught.value)
        assert "ImagePullBackOff" in message
        assert 'Back-off pulling image "unpullable/corral-echo:9"' in message
        assert "imagePullSecrets" in message
        # Reported by the watch (a timeout would say "not ready within 600 s").
        assert caught.value.details["reason"] == "ImagePullBackOff"
        # Nothing is left behind.
        await wait_for_empty(kube)


async def wait_for_empty(kube: Cluster) -> None:
    async def empty() -> bool:
        return kube.objects("pods") == []

    await wait_for(empty)


async def test_a_crashing_server_fails_with_its_exit_and_last_log_lines(
    kube: Cluster, crashing_env: Path
) -> None:
    async with provider_for(kube) as provider:
        with pytest.raises(ServerStartError) as caught:
            await provider.start(crashing_env)
        message = str(caught.value)
        assert "failed to start: Error: exit code 2" in message
        assert "last log lines" in message
        assert "no_such_module" in caught.value.details["output"]
        await wait_for_empty(kube)


async def test_unschedulable_fails_at_once_with_the_scheduler_message(kube: Cluster) -> None:
    async with provider_for(kube) as provider:
        with pytest.raises(ServerStartError) as caught:
            await provider.start("unschedulable/corral-echo:1")
        assert "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu" in str(caught.value)
        assert "lower resources.cpu" in str(caught.value)


async def test_a_pod_that_never_gets_ready_times_out_with_what_it_waited_for(
    tmp_path: Path,
) -> None:
    from tests.support.kube import cluster

    never = ["python", "-c", "import time; time.sleep(600)"]
    async with cluster(images={"corral-never:1": never}) as kube:
        async with provider_for(kube, startup_timeout=3) as provider:
            with pytest.raises(ServerStartError, match="not ready within 3 s") as caught:
                await provider.start("corral-never:1")
            assert "waiting for /ready" in str(caught.value)
        await wait_for_empty(kube)


async def test_a_crash_after_start_is_seen_by_the_watch(kube: Cluster, echo_env_dir: Path) -> None:
    async with provider_for(kube) as provider:
        endpoint = await provider.start(echo_env_dir)
        kube.kubelet.crash(endpoint.pod)

        async def dead() -> bool:
            return not await provider.alive(endpoint)

        await wait_for(dead)
        assert not await provider.healthy(endpoint)


async def test_a_cancelled_start_leaves_nothing() -> None:
    from tests.support.kube import cluster

    # A Pod that never gets ready: the start is still waiting when the cancel comes, on
    # however loaded a machine (an echo Pod could be ready first, and nothing to cancel).
    never = ["python", "-c", "import time; time.sleep(600)"]
    async with (
        cluster(images={"corral-never:1": never}) as kube,
        provider_for(kube) as provider,
    ):
        start = asyncio.create_task(provider.start("corral-never:1"))

        async def running() -> bool:
            return any(
                pod.get("status", {}).get("phase") == "Running" for pod in kube.objects("pods")
            )

        await wait_for(running)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        await wait_for_empty(kube)
        assert provider.endpoints == []


async def test_a_cancel_that_comes_as_the_watch_wakes_the_start_is_kept(kube: Cluster) -> None:
    """The start is waiting for its object; the watch sees a change and the caller gives up
    in the same loop turn: the start ends cancelled (3.11's wait_for returned the event's
    result instead and the wait went on to the startup timeout)."""
    from corral.providers.kubernetes.base import _Record

    async with provider_for(kube) as provider:
        record = _Record("corral-cancelled-0")
        waiting = asyncio.create_task(provider._wait(record, 300))
        for _ in range(3):  # into its wait on the record's event
            await asyncio.sleep(0)
        record.changed.set()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(30):  # the cancellation lost ran to this instead
                await waiting


async def test_a_token_is_stored_in_a_secret_and_required(
    kube: Cluster, echo_env_dir: Path
) -> None:
    token = "s3cret-token-for-k8s"
    async with provider_for(kube, token=token) as provider:
        endpoint = await provider.start(echo_env_dir)
        (secret,) = kube.objects("secrets")
        assert secret["stringData"] == {"token": token}
        assert secret["metadata"]["labels"][OWNER_LABEL] == provider.owner
        container = kube.objects("pods")[0]["spec"]["containers"][0]
        # The kubelet's plain httpGet probe made it ready: the probe paths need no token.
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert await echo_once(endpoint.url, token=token) == "hi"
        with pytest.raises(CorralError):
            await echo_once(endpoint.url)
    assert kube.objects("secrets") == []


async def test_warm_pool_over_pods(kube: Cluster, echo_env_dir: Path) -> None:
    async with provider_for(kube) as provider, WarmPool(provider, echo_env_dir, size=2) as pool:
        await pool.wait_full(timeout=120)
        assert len(kube.objects("pods")) == 2
        endpoint = await pool.acquire()
        assert await echo_once(endpoint.url) == "hi"
        await pool.release(endpoint)
        await pool.wait_full(timeout=120)
        stats = pool.stats()
        assert stats.started == 3 and stats.acquired == 0
    await wait_for_empty(kube)


async def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="connect must be"):
        KubernetesProvider(connect="ssh")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs url="):
        KubernetesProvider(connect="url")
    with pytest.raises(ValueError, match="image_pull_policy"):
        KubernetesProvider(image_pull_policy="Sometimes")
    with pytest.raises(ValueError, match="lease_seconds"):
        KubernetesProvider(lease_seconds=1)


KILLED = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from kubernetes_asyncio import client as k8s
    from corral.providers.kubernetes import KubernetesProvider

    async def main():
        provider = KubernetesProvider(
            configuration=k8s.Configuration(host=sys.argv[1]), namespace=sys.argv[2],
            connect="in-cluster", guard=sys.argv[4] == "guard",
        )
        await provider.start(sys.argv[3])
        print("started", flush=True)
        if sys.argv[4] == "guard":
            os.kill(os.getpid(), signal.SIGKILL)
        # else: exit without close(); the finalizer sweeps at interpreter exit

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("how", ["guard", "exit"])
async def test_cleanup_when_the_trainer_dies(kube: Cluster, echo_env_dir: Path, how: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        KILLED,
        kube.url,
        kube.namespace,
        str(echo_env_dir),
        how,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 120)
    assert line.strip() == b"started"
    await process.communicate()
    # The guardian (after SIGKILL) or the finalizer (at exit) swept the Pod and the Lease.

    async def swept() -> bool:
        return kube.objects("pods") == [] and kube.objects("leases") == []

    await wait_for(swept, timeout=90)


def test_the_sweep_command_reports_a_bad_cluster() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral.providers.kubernetes.gc",
            "--namespace",
            "rl",
            "--owner",
            "abc",
            "--server",
            "http://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "corral k8s gc:" in result.stderr


async def test_a_pool_over_pods_replaces_a_crashed_one(kube: Cluster, echo_env_dir: Path) -> None:
    async with provider_for(kube) as provider:
        pool: EnvPool = EnvPool(
            4,
            echo_env_dir,
            env=EchoEnv,
            provider=provider,
            servers=2,
            health_interval=0.2,
            on_error="return",
            progress=False,
        )
        async with pool:
            await pool.reset(seed=0)
            assert len(kube.objects("pods")) == 2
            victim = pool.fleet.servers[1]
            old_url = victim.url
            kube.kubelet.crash(victim.handle.endpoint.pod)
            await step_until_replaced(pool, 1, old_url)
        assert kube.objects("pods") == []  # the pool deleted the Pods it made
        assert provider.endpoints == []

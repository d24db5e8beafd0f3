"""AgentSandboxProvider: warm servers claimed from a SandboxWarmPool (fake controller)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.providers.kubernetes.test_k8s_provider import echo_once
from tests.support.kube import (
    RESOURCES,
    SANDBOX_RESOURCES,
    Cluster,
    FakeSandboxController,
    cluster,
)

from corral.errors import ServerStartError
from corral.providers.base import ServerSpec
from corral.providers.kubernetes import AgentSandboxProvider
from corral.providers.kubernetes.claims import warm_pool_name
from corral.providers.kubernetes.manifests import FleetOptions, render_fleet
from corral.providers.kubernetes.pods import OWNER_LABEL
from corral.providers.manifest import load_manifest


@pytest.fixture
async def sandboxes(echo_env_dir: Path) -> AsyncIterator[tuple[Cluster, FakeSandboxController]]:
    """A cluster with agent-sandbox, and the warm pool corral deploy renders for echo."""
    objects = render_fleet(load_manifest(echo_env_dir), FleetOptions(agent_sandbox=2))
    template = next(o for o in objects if o["kind"] == "SandboxTemplate")
    pool = next(o for o in objects if o["kind"] == "SandboxWarmPool")
    async with cluster(resources=RESOURCES + SANDBOX_RESOURCES) as kube:
        controller = FakeSandboxController(kube.api, pool, template)
        await controller.start()
        try:
            yield kube, controller
        finally:
            await controller.close()


def provider_for(kube: Cluster, **options: object) -> AgentSandboxProvider:
    options.setdefault("connect", "in-cluster")
    return AgentSandboxProvider(
        configuration=kube.configuration(),
        namespace=kube.namespace,
        guard=False,
        **options,  # type: ignore[arg-type]
    )


async def test_a_claim_binds_a_warm_server(
    sandboxes: tuple[Cluster, FakeSandboxController], echo_env_dir: Path
) -> None:
    kube, controller = sandboxes
    assert warm_pool_name("echo") == controller.name == "corral-echo"
    async with provider_for(kube) as provider:
        endpoint = await provider.start(echo_env_dir)
        (claim,) = kube.objects("sandboxclaims")
        assert claim["spec"] == {"warmPoolRef": {"name": "corral-echo"}}
        # Only the pool and the owner's labels: no env or volumes that force a cold start.
        assert claim["metadata"]["labels"][OWNER_LABEL] == provider.owner
        assert endpoint.claim == claim["metadata"]["name"]
        assert endpoint.pod == controller.bound[endpoint.claim]
        assert await echo_once(endpoint.url) == "hi"
        assert await provider.alive(endpoint)
        await provider.stop(endpoint)
        assert kube.objects("sandboxclaims") == []
    assert kube.objects("leases") == []


async def test_claims_by_pool_name_over_port_forward(
    sandboxes: tuple[Cluster, FakeSandboxController],
) -> None:
    kube, _ = sandboxes
    async with provider_for(kube, connect="port-forward") as provider:
        first, second = [await provider.start("corral-echo") for _ in range(2)]
        assert first.pod != second.pod and first.host == "127.0.0.1"
        assert await echo_once(first.url, "a") == "a"
        assert await echo_once(second.url, "b") == "b"


async def test_a_missing_pool_fails_at_once(
    sandboxes: tuple[Cluster, FakeSandboxController],
) -> None:
    kube, _ = sandboxes
    async with provider_for(kube) as provider:
        with pytest.raises(ServerStartError, match="no SandboxWarmPool 'corral-nope'"):
            await provider.start("corral-nope")
        assert kube.objects("sandboxclaims") == []


async def test_per_claim_options_are_refused(
    sandboxes: tuple[Cluster, FakeSandboxController],
) -> None:
    kube, _ = sandboxes
    async with provider_for(kube) as provider:
        with pytest.raises(ServerStartError, match="force a cold start"):
            await provider.start(ServerSpec("corral-echo", environment={"A": "1"}))


def test_claim_version_is_checked() -> None:
    with pytest.raises(ValueError, match="claim_version"):
        AgentSandboxProvider(claim_version="v2")

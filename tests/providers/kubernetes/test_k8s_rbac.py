"""The documented Roles against every call the providers make (issue 30.15).

No Kubernetes API server runs here: the emulated one (``tests/support/kube.py``) checks
each request that carries a bearer token against the Roles bound to its subject, as an
API server's RBAC authorizer does (``tests/support/kube_rbac.py``: 403 ``Forbidden`` for
anything not granted). A test applies the Role that ``corral k8s role`` prints, binds it
to a user, and drives a provider through a kubeconfig holding that user's token; then:

* nothing was refused (the Role is enough), and
* every rule the Role grants was used by some path (the Role holds nothing more),

so the table in :mod:`corral.providers.kubernetes.rbac` and the providers' calls cannot
drift apart. What the emulator does not model (ClusterRoles, aggregation, groups) is
listed in its docstring; no corral path needs them.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from tests.providers.kubernetes.test_k8s_gc import lease, pod
from tests.providers.kubernetes.test_k8s_provider import echo_once
from tests.support.kube import (
    RESOURCES,
    SANDBOX_RESOURCES,
    Cluster,
    FakeSandboxController,
    cluster,
)
from tests.support.kube_rbac import Authorizer
from typer.testing import CliRunner

from corral.cli.main import app
from corral.errors import ServerStartError
from corral.providers.kubernetes import AgentSandboxProvider, KubernetesProvider
from corral.providers.kubernetes.api import LEASES, PODS, SECRETS, claims, connect
from corral.providers.kubernetes.gc import sweep
from corral.providers.kubernetes.manifests import FleetOptions, render_fleet
from corral.providers.kubernetes.pods import MANAGED_BY, MODE_LABEL, OWNER_LABEL
from corral.providers.kubernetes.rbac import RULES, Mode, role, role_binding
from corral.providers.manifest import load_manifest

TRAINER = "trainer"
TOKEN = "s3cret-token-for-rbac"

# Granted but not asked for by an API server with AuthorizePodWebsocketUpgradeCreatePermission
# (the emulator's behaviour): older servers authorise the port-forward upgrade as get.
OLD_SERVERS_ONLY = {("", "pods/portforward", "get")}


def granted(mode: Mode) -> set[tuple[str, str, str]]:
    return {
        (rule.group, resource, verb)
        for rule in RULES[mode]
        for resource in rule.resources
        for verb in rule.verbs
    }


async def bind(kube: Cluster, mode: Mode, tmp_path: Path) -> str:
    """Apply ``mode``'s Role bound to the trainer; return a kubeconfig with its token."""
    await kube.apply(
        role("corral-provider", mode),
        role_binding(
            "corral-provider",
            "corral-provider",
            [{"kind": "User", "name": TRAINER, "apiGroup": "rbac.authorization.k8s.io"}],
        ),
    )
    return kube.kubeconfig(tmp_path / "kubeconfig", kube.user(TRAINER))


def refusals(authorizer: Authorizer) -> list[str]:
    return [f"{c.subject}: {c.attributes.describe()}" for c in authorizer.refused()]


@pytest.fixture
async def rbac_kube() -> AsyncIterator[Cluster]:
    async with cluster(rbac=True) as running:
        yield running


async def test_the_emulator_refuses_what_no_role_grants(rbac_kube: Cluster, tmp_path: Path) -> None:
    """The authorizer itself: a bound user is allowed its verbs, refused the others; a
    stranger is refused everything (the test below would prove nothing otherwise)."""
    config = await bind(rbac_kube, "pods", tmp_path)
    api = await connect(kubeconfig=config)
    try:
        assert await api.list(PODS) == []
        with pytest.raises(Exception, match=r'403 Forbidden.*cannot get resource "pods"'):
            await api.get(PODS, "anything")
        with pytest.raises(Exception, match="403"):
            await api.list(claims())
    finally:
        await api.close()
    stranger = rbac_kube.kubeconfig(tmp_path / "stranger", rbac_kube.user("stranger"))
    api = await connect(kubeconfig=stranger)
    try:
        with pytest.raises(Exception, match="403"):
            await api.list(PODS)
    finally:
        await api.close()


async def test_the_pods_role_is_exactly_what_the_pod_provider_uses(
    rbac_kube: Cluster, tmp_path: Path, echo_env_dir: Path, crashing_env: Path
) -> None:
    kube = rbac_kube
    config = await bind(kube, "pods", tmp_path)

    def provider(connect: str) -> KubernetesProvider:
        return KubernetesProvider(
            kubeconfig=config, namespace=kube.namespace, connect=connect,  # type: ignore[arg-type]
            guard=False, token=TOKEN,
        )  # fmt: skip

    # In-cluster and through a port-forward; a token (its Secret); a renewed Lease.
    async with provider("in-cluster") as inside:
        endpoint = await inside.start(echo_env_dir)
        assert await echo_once(endpoint.url, token=TOKEN) == "hi"
        await inside.ownership.renew(inside.api)
        # A server that fails to start: its last log lines are read.
        with pytest.raises(ServerStartError, match="no_such_module"):
            await inside.start(crashing_env)
        await inside.stop(endpoint)
    async with provider("port-forward") as outside:
        endpoint = await outside.start(echo_env_dir)
        assert await echo_once(endpoint.url, "pf", token=TOKEN) == "pf"
    # Everything was swept by the providers' own close under this Role.
    assert kube.objects("pods") == [] and kube.objects("secrets") == []
    assert kube.objects("leases") == []

    assert refusals(kube.authorizer) == []
    assert kube.authorizer.needed(TRAINER) == granted("pods") - OLD_SERVERS_ONLY


async def test_gc_under_the_pods_role_sweeps_a_dead_trainer(
    rbac_kube: Cluster, tmp_path: Path
) -> None:
    """The audit's case: the sweep listed SandboxClaims, 403 under this Role, and left the
    killed trainer's Pods, Secret and Lease. Now it lists only what the mode created."""
    kube = rbac_kube
    config = await bind(kube, "pods", tmp_path)
    await kube.api.create(LEASES, lease("dead", time.time() - 3600))
    await kube.api.create(PODS, pod("p-dead", "dead"))
    labels = {MANAGED_BY: "corral", OWNER_LABEL: "dead"}
    await kube.api.create(SECRETS, {"metadata": {"name": "s-dead", "labels": labels}})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "corral", "k8s", "gc", "--kubeconfig", config,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    assert "deleted 3 objects of 1 dead owners" in out.decode()
    assert kube.objects("pods") == kube.objects("secrets") == kube.objects("leases") == []
    assert refusals(kube.authorizer) == []


async def test_a_kind_the_role_does_not_grant_is_reported_and_the_rest_swept(
    rbac_kube: Cluster, tmp_path: Path
) -> None:
    """A dead agent-sandbox owner swept with the pods Role: its SandboxClaims cannot be
    listed (403), its Secret is swept, its Lease is kept for a sweep with more rights."""
    kube = rbac_kube
    for resource in SANDBOX_RESOURCES:
        kube.emulator.resources[resource] = {}
    config = await bind(kube, "pods", tmp_path)
    dead = lease("dead", time.time() - 3600)
    dead["metadata"]["labels"][MODE_LABEL] = "agent-sandbox"  # type: ignore[index]
    await kube.api.create(LEASES, dead)
    labels = {MANAGED_BY: "corral", OWNER_LABEL: "dead"}
    await kube.api.create(SECRETS, {"metadata": {"name": "s-dead", "labels": labels}})
    api = await connect(kubeconfig=config)
    try:
        swept = await sweep(api)
    finally:
        await api.close()
    assert set(swept.refused) == {"sandboxclaims"}
    assert "forbidden" in swept.refused["sandboxclaims"]
    assert swept.objects == {"secrets": ["s-dead"]}
    assert [o["metadata"]["name"] for o in kube.objects("leases")] == ["corral-owner-dead"]


@pytest.fixture
async def sandbox_kube(
    echo_env_dir: Path,
) -> AsyncIterator[tuple[Cluster, FakeSandboxController]]:
    objects = render_fleet(load_manifest(echo_env_dir), FleetOptions(agent_sandbox=1))
    template = next(o for o in objects if o["kind"] == "SandboxTemplate")
    warm_pool = next(o for o in objects if o["kind"] == "SandboxWarmPool")
    async with cluster(resources=RESOURCES + SANDBOX_RESOURCES, rbac=True) as kube:
        controller = FakeSandboxController(kube.api, warm_pool, template)
        await controller.start()
        try:
            yield kube, controller
        finally:
            await controller.close()


async def test_the_agent_sandbox_role_covers_the_claim_provider(
    sandbox_kube: tuple[Cluster, FakeSandboxController], tmp_path: Path, echo_env_dir: Path
) -> None:
    kube, _ = sandbox_kube
    config = await bind(kube, "agent-sandbox", tmp_path)
    async with AgentSandboxProvider(
        kubeconfig=config, namespace=kube.namespace, connect="port-forward", guard=False,
        token=TOKEN,
    ) as provider:  # fmt: skip
        endpoint = await provider.start(echo_env_dir)
        assert await echo_once(endpoint.url) == "hi"
        await provider.ownership.renew(provider.api)
        with pytest.raises(ServerStartError, match="no SandboxWarmPool"):
            await provider.start("corral-nope")
        await provider.stop(endpoint)
    assert kube.objects("sandboxclaims") == kube.objects("leases") == []
    assert refusals(kube.authorizer) == []
    needed = kube.authorizer.needed(TRAINER)
    # Pods are never touched in this mode; a failed start's log lines need a failing
    # sandbox, which the fake controller does not make (the pods test covers pods/log).
    assert needed == granted("agent-sandbox") - OLD_SERVERS_ONLY - {("", "pods/log", "get")}
    assert not any(resource == "pods" for _, resource, _ in needed)


def test_corral_k8s_role_prints_the_table() -> None:
    result = CliRunner().invoke(
        app, ["k8s", "role", "--mode", "agent-sandbox", "--namespace", "rl",
              "--service-account", "trainer"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    printed, binding = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert printed == role("corral-provider", "agent-sandbox", namespace="rl")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer", "namespace": "rl"}]
    assert binding["roleRef"]["name"] == "corral-provider"
    refused = CliRunner().invoke(app, ["k8s", "role", "--mode", "admin"])
    assert refused.exit_code == 2 and "--mode must be one of" in refused.output

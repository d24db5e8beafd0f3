"""The server's Pod template, checked against the official client's typed models."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.k8s_models import roundtrip, typed

from corral.providers.kubernetes.pods import (
    OWNER_LABEL,
    ServerTemplate,
    cpu_quantity,
    dns_label,
)
from corral.providers.manifest import load_manifest
from corral.server.http import PROBE_PATHS


@pytest.fixture
def template(echo_env_dir: Path) -> ServerTemplate:
    return ServerTemplate.from_manifest(load_manifest(echo_env_dir))


def test_the_pod_is_a_valid_pod_with_every_key_known(template: ServerTemplate) -> None:
    body = template.pod("corral-echo-1", labels={OWNER_LABEL: "abc"})
    assert roundtrip(body, "V1Pod") == body
    pod = typed(body, "V1Pod")
    container = pod.spec.containers[0]
    assert container.image == "corral-echo:0.1.0"
    assert container.command[:5] == ["python", "-m", "corral", "serve", "corral.envs.echo:EchoEnv"]
    assert "--max-sessions" in container.command and "8" in container.command
    assert container.ports[0].container_port == 8000 and container.ports[0].name == "http"
    assert pod.spec.restart_policy == "Never"
    assert pod.metadata.labels[OWNER_LABEL] == "abc"
    assert pod.metadata.labels["app.kubernetes.io/name"] == "corral-echo"
    assert pod.metadata.labels["app.kubernetes.io/managed-by"] == "corral"


def test_requests_and_limits_come_from_the_manifest(template: ServerTemplate) -> None:
    resources = typed(template.pod("p"), "V1Pod").spec.containers[0].resources
    assert resources.requests == {"cpu": "500m", "memory": "256Mi"}
    assert resources.limits == {"cpu": "500m", "memory": "256Mi"}
    burstable = ServerTemplate(name="x", image="x", cpu=2, cpu_limit=False)
    assert burstable.resources()["limits"] == {"memory": "1Gi"}


def test_probes(template: ServerTemplate) -> None:
    container = typed(template.pod("p"), "V1Pod").spec.containers[0]
    assert container.readiness_probe.http_get.path == "/readyz"
    assert container.readiness_probe.http_get.port == "http"
    assert container.liveness_probe.http_get.path == "/livez"
    assert container.startup_probe.http_get.path == "/livez"
    assert container.startup_probe.failure_threshold * container.startup_probe.period_seconds >= 60


def test_hardened_security_context(template: ServerTemplate) -> None:
    pod = typed(template.pod("p"), "V1Pod")
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.security_context.run_as_user == 10001
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert pod.spec.automount_service_account_token is False
    container = pod.spec.containers[0].security_context
    assert container.allow_privilege_escalation is False
    assert container.read_only_root_filesystem is True
    assert container.privileged is False
    assert container.capabilities.drop == ["ALL"]
    mounts = {m.mount_path: m.name for m in pod.spec.containers[0].volume_mounts}
    volumes = {v.name: v for v in pod.spec.volumes}
    assert volumes[mounts["/tmp"]].empty_dir.medium == "Memory"


def test_runtime_class_placement_and_pull_options() -> None:
    template = ServerTemplate(
        name="x",
        image="registry.example.com/corral-x:1",
        runtime_class="gvisor",
        service_account="envs",
        image_pull_policy="Always",
        image_pull_secrets=("regcred",),
        node_selector={"pool": "envs"},
        tolerations=({"key": "envs", "operator": "Exists", "effect": "NoSchedule"},),
    )
    body = template.pod("p")
    assert roundtrip(body, "V1Pod") == body
    spec = typed(body, "V1Pod").spec
    assert spec.runtime_class_name == "gvisor"
    assert spec.service_account_name == "envs"
    assert spec.image_pull_secrets[0].name == "regcred"
    assert spec.node_selector == {"pool": "envs"}
    assert spec.tolerations[0].key == "envs"
    assert spec.containers[0].image_pull_policy == "Always"
    # No command: the image's own.
    assert spec.containers[0].command is None


def test_a_token_keeps_plain_http_probes_on_the_token_free_paths() -> None:
    """Issue 30.17: an exec probe sending the token started a Python per probe."""
    template = ServerTemplate(name="x", image="x", token_secret="corral-token")
    body = template.pod("p")
    assert roundtrip(body, "V1Pod") == body
    container = typed(body, "V1Pod").spec.containers[0]
    for probe in (container.readiness_probe, container.liveness_probe, container.startup_probe):
        assert probe.var_exec is None
        assert probe.http_get.path in PROBE_PATHS
    token = next(e for e in container.env if e.name == "CORRAL_TOKEN")
    assert token.value_from.secret_key_ref.name == "corral-token"
    assert token.value_from.secret_key_ref.key == "token"


def test_drain_sets_the_variable_and_a_grace_period_that_covers_it() -> None:
    template = ServerTemplate(name="x", image="x", drain_seconds=120)
    pod = typed(template.pod("p"), "V1Pod")
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["CORRAL_DRAIN_SECONDS"] == "120"
    assert pod.spec.termination_grace_period_seconds > 120


def test_quantities_and_names() -> None:
    assert cpu_quantity(1) == "1"
    assert cpu_quantity(0.5) == "500m"
    assert cpu_quantity(2.25) == "2250m"
    assert dns_label("My_Env.v2") == "my-env-v2"
    assert dns_label("x" * 80) == "x" * 63
    assert dns_label("---") == "corral"

"""``corral deploy k8s``: every rendered object checked against the official client's models.

Core objects go through the official ``kubernetes`` client's typed (pydantic) models and
back: equality proves every key is known and every value has the right type. Custom
resources (prometheus-operator's, Gateway API's, agent-sandbox's) have no models there:
their embedded Pod specs go through ``V1PodSpec`` and their own fields are checked here.
``kubectl apply --dry-run=client`` runs too where a kubectl is installed (not on the
project's machines: the test says so when it skips).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tests.providers.kubernetes.test_k8s_gc import lease, pod
from tests.support.k8s_models import roundtrip, typed
from tests.support.kube import FLEET_KINDS, cluster, declare
from tests.support.servers import running
from typer.testing import CliRunner

from corral.cli.main import app
from corral.client import AsyncEnvClient
from corral.envs.echo import EchoAction, EchoEnv
from corral.providers.kubernetes.api import LEASES, PODS
from corral.providers.kubernetes.manifests import (
    HEADLESS_LABEL,
    FleetOptions,
    fleet_warnings,
    kustomization,
    render_fleet,
)
from corral.providers.manifest import load_manifest

MODELS = {
    "Deployment": "V1Deployment",
    "Service": "V1Service",
    "HorizontalPodAutoscaler": "V2HorizontalPodAutoscaler",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
    "DaemonSet": "V1DaemonSet",
    "NetworkPolicy": "V1NetworkPolicy",
    "Ingress": "V1Ingress",
}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(objects, kind)
    return found


@pytest.fixture
def fleet(echo_env_dir: Path) -> list[dict[str, Any]]:
    options = FleetOptions(
        namespace="rl",
        host="envs.example.com",
        tls_secret="envs-tls",
        agent_sandbox=3,
        token_secret="corral-token",
        runtime_class="gvisor",
        drain_seconds=120,
    )
    return render_fleet(load_manifest(echo_env_dir), options)


def test_every_core_object_is_valid_with_every_key_known(fleet: list[dict[str, Any]]) -> None:
    core = [o for o in fleet if o["kind"] in MODELS]
    assert {o["kind"] for o in core} == set(MODELS)
    for obj in core:
        assert roundtrip(obj, MODELS[obj["kind"]]) == obj, obj["kind"]
        assert obj["metadata"]["namespace"] == "rl"


def test_the_deployment(fleet: list[dict[str, Any]]) -> None:
    deployment = typed(one(fleet, "Deployment"), "V1Deployment")
    assert deployment.spec.strategy.rolling_update.max_unavailable == 0
    pod = deployment.spec.template.spec
    assert (
        deployment.spec.selector.match_labels.items()
        <= deployment.spec.template.metadata.labels.items()
    )
    container = pod.containers[0]
    # Plain httpGet probes even with a token: the token-free probe paths.
    assert container.readiness_probe.http_get.path == "/readyz"
    assert container.liveness_probe.http_get.path == "/livez"
    # No count beside the autoscaler: a GitOps re-apply would reset the fleet.
    assert "replicas" not in one(fleet, "Deployment")["spec"]
    assert container.resources.limits == {"cpu": "500m", "memory": "256Mi"}
    assert container.security_context.read_only_root_filesystem is True
    assert container.security_context.capabilities.drop == ["ALL"]
    assert pod.security_context.run_as_non_root is True
    assert pod.runtime_class_name == "gvisor"
    env = {e.name: e for e in container.env}
    assert env["CORRAL_DRAIN_SECONDS"].value == "120"
    assert env["CORRAL_TOKEN"].value_from.secret_key_ref.name == "corral-token"
    # The grace period covers the drain.
    assert pod.termination_grace_period_seconds > 120
    keys = {c.topology_key for c in pod.topology_spread_constraints}
    assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}


def test_services(fleet: list[dict[str, Any]]) -> None:
    service, headless = (typed(o, "V1Service") for o in by_kind(fleet, "Service"))
    assert service.spec.ports[0].port == 80 and service.spec.ports[0].target_port == "http"
    assert headless.metadata.name == "corral-echo-pods"
    assert headless.spec.cluster_ip == "None"
    assert headless.spec.ports[0].port == 8000
    assert headless.metadata.labels[HEADLESS_LABEL] == "true"


def test_autoscaler_on_cpu_and_active_sessions(fleet: list[dict[str, Any]]) -> None:
    hpa = typed(one(fleet, "HorizontalPodAutoscaler"), "V2HorizontalPodAutoscaler")
    assert hpa.spec.scale_target_ref.name == "corral-echo"
    assert (hpa.spec.min_replicas, hpa.spec.max_replicas) == (2, 10)
    cpu, sessions = hpa.spec.metrics
    assert cpu.resource.name == "cpu" and cpu.resource.target.average_utilization == 70
    assert sessions.pods.metric.name == "corral_sessions_active"
    # 80 % of the manifest's 8 sessions per server.
    assert sessions.pods.target.average_value == "6.4"
    assert hpa.spec.behavior.scale_down.policies[0].value == 1


def test_disruption_budget_prepull_and_network_policy(fleet: list[dict[str, Any]]) -> None:
    pdb = typed(one(fleet, "PodDisruptionBudget"), "V1PodDisruptionBudget")
    assert pdb.spec.max_unavailable == 1
    assert pdb.spec.unhealthy_pod_eviction_policy == "AlwaysAllow"
    hpa = one(fleet, "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] > pdb.spec.max_unavailable
    daemonset = typed(one(fleet, "DaemonSet"), "V1DaemonSet")
    pull = daemonset.spec.template.spec.init_containers[0]
    assert pull.image == "corral-echo:0.1.0"
    assert daemonset.spec.template.spec.containers[0].image.startswith("registry.k8s.io/pause")
    # Under the servers' RuntimeClass: its scheduling puts the pull on the gVisor nodes.
    assert daemonset.spec.template.spec.runtime_class_name == "gvisor"
    policy = typed(one(fleet, "NetworkPolicy"), "V1NetworkPolicy")
    assert policy.spec.policy_types == ["Ingress", "Egress"]
    assert policy.spec.egress == []  # egress closed by default
    (rule,) = policy.spec.ingress
    assert rule.ports[0].port == 8000
    # A `from`: the namespace's Pods and namespaces labelled as clients, no one else.
    assert [(p.pod_selector, p.namespace_selector) for p in rule._from] == [
        (typed({}, "V1LabelSelector"), None),
        (None, typed({"matchLabels": {"corral.dev/clients": "true"}}, "V1LabelSelector")),
    ]


def test_prepull_follows_the_servers_placement(echo_env_dir: Path) -> None:
    tolerations = ({"key": "sandbox.gke.io/runtime", "operator": "Equal", "value": "gvisor",
                    "effect": "NoSchedule"},)  # fmt: skip
    options = FleetOptions(
        runtime_class="gvisor", node_selector={"pool": "envs"}, tolerations=tolerations
    )
    objects = render_fleet(load_manifest(echo_env_dir), options)
    server = one(objects, "Deployment")["spec"]["template"]["spec"]
    pull = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    for key in ("runtimeClassName", "nodeSelector", "tolerations"):
        assert pull[key] == server[key], key


def test_cli_placement_options(echo_env_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["deploy", "k8s", str(echo_env_dir), "--runtime-class", "gvisor",
              "--toleration", "sandbox.gke.io/runtime=gvisor:NoSchedule",
              "--toleration", "dedicated", "--node-selector", "pool=envs"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    documents = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
    pull = one(documents, "DaemonSet")["spec"]["template"]["spec"]
    assert pull["tolerations"] == [
        {"key": "sandbox.gke.io/runtime", "operator": "Equal", "value": "gvisor",
         "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Exists"},
    ]  # fmt: skip
    assert pull["nodeSelector"] == {"pool": "envs"} and pull["runtimeClassName"] == "gvisor"
    bad = CliRunner().invoke(app, ["deploy", "k8s", str(echo_env_dir), "--toleration", "a:Never"])
    assert bad.exit_code == 2 and "effect" in bad.output


def test_a_single_pod_fleet_has_no_disruption_budget(echo_env_dir: Path) -> None:
    with pytest.raises(ValueError, match="min_replicas must be at least 2"):
        FleetOptions(min_replicas=1)
    options = FleetOptions(min_replicas=1, disruption_budget=False)
    objects = render_fleet(load_manifest(echo_env_dir), options)
    assert by_kind(objects, "PodDisruptionBudget") == []
    assert one(objects, "HorizontalPodAutoscaler")["spec"]["minReplicas"] == 1


def test_ingress_sets_websocket_timeouts(fleet: list[dict[str, Any]]) -> None:
    ingress = typed(one(fleet, "Ingress"), "V1Ingress")
    annotations = ingress.metadata.annotations
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    assert annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"] == "3600"
    assert ingress.spec.rules[0].host == "envs.example.com"
    assert ingress.spec.rules[0].http.paths[0].backend.service.name == "corral-echo"
    assert ingress.spec.tls[0].secret_name == "envs-tls"


@pytest.mark.parametrize(
    ("controller", "expected"),
    [
        ("haproxy", {"haproxy.org/timeout-tunnel": "600s", "haproxy.org/timeout-server": "600s"}),
        ("traefik", None),
        ("none", None),
    ],
)
def test_ingress_annotations_follow_the_controller(
    echo_env_dir: Path, controller: str, expected: dict[str, str] | None
) -> None:
    options = FleetOptions(
        host="envs.example.com", ingress_controller=controller, websocket_timeout=600
    )
    ingress = one(render_fleet(load_manifest(echo_env_dir), options), "Ingress")
    assert roundtrip(ingress, "V1Ingress") == ingress
    assert ingress["metadata"].get("annotations") == expected
    with pytest.raises(ValueError, match="ingress_controller"):
        FleetOptions(ingress_controller="istio")


def test_gateway_route_instead_of_ingress(echo_env_dir: Path) -> None:
    options = FleetOptions(gateway="infra/public", host="envs.example.com")
    objects = render_fleet(load_manifest(echo_env_dir), options)
    assert by_kind(objects, "Ingress") == []
    route = one(objects, "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "infra"}]
    assert route["spec"]["hostnames"] == ["envs.example.com"]
    rule = route["spec"]["rules"][0]
    assert rule["backendRefs"] == [{"name": "corral-echo", "port": 80}]
    assert rule["timeouts"] == {"request": "0s", "backendRequest": "0s"}


def test_monitoring(fleet: list[dict[str, Any]]) -> None:
    monitor = one(fleet, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]
    assert selector["matchExpressions"] == [{"key": HEADLESS_LABEL, "operator": "DoesNotExist"}]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert endpoint["authorization"]["credentials"] == {"name": "corral-token", "key": "token"}
    rules = one(fleet, "PrometheusRule")["spec"]["groups"][0]["rules"]
    names = {r["alert"] for r in rules}
    assert names == {
        "CorralEnvMemoryHigh",
        "CorralEnvCPUHigh",
        "CorralEnvCPUThrottled",
        "CorralEnvConnectionsHigh",
        "CorralEnvErrorRate",
        "CorralEnvSessionsRefused",
        "CorralEnvFleetNearCapacity",
        "CorralEnvAutoscalerAtMax",
    }
    for rule in rules:
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_alerts_can_fire_in_the_pod_shape_rendered(echo_env_dir: Path) -> None:
    """Issue 30.17: without a CPU limit no limit series exists (the CPU alert divided by
    it could never fire); one client per session must be able to reach the connections
    threshold (it was twice max_sessions)."""
    manifest = load_manifest(echo_env_dir)
    max_sessions = manifest.concurrency.max_sessions

    def rules(**options: Any) -> dict[str, str]:
        objects = render_fleet(manifest, FleetOptions(**options))
        found = one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
        return {r["alert"]: r["expr"] for r in found}

    limited = rules()
    assert "kube_pod_container_resource_limits" in limited["CorralEnvCPUHigh"]
    assert "container_cpu_cfs_throttled_periods_total" in limited["CorralEnvCPUThrottled"]
    burstable = rules(cpu_limit=False)
    assert 'resource="cpu"' in burstable["CorralEnvCPUHigh"]
    assert "limits" not in burstable["CorralEnvCPUHigh"]
    assert "kube_pod_container_resource_requests" in burstable["CorralEnvCPUHigh"]
    assert "CorralEnvCPUThrottled" not in burstable  # nothing throttles without a limit
    threshold = int(limited["CorralEnvConnectionsHigh"].rsplit(">=", 1)[1])
    assert 1 < threshold <= max_sessions


def test_plain_http_to_token_less_servers_is_warned_about(echo_env_dir: Path) -> None:
    open_door = fleet_warnings(FleetOptions(host="envs.example.com"))
    assert len(open_door) == 1 and "plain HTTP" in open_door[0] and "no token" in open_door[0]
    tls_only = fleet_warnings(FleetOptions(host="envs.example.com", tls_secret="tls"))
    assert len(tls_only) == 1 and "require no token" in tls_only[0]
    clear_token = fleet_warnings(FleetOptions(host="envs.example.com", token_secret="t"))
    assert len(clear_token) == 1 and "in clear" in clear_token[0]
    assert (
        fleet_warnings(FleetOptions(host="e.example.com", token_secret="t", tls_secret="s")) == []
    )
    assert fleet_warnings(FleetOptions()) == []  # no Ingress, nothing exposed
    result = CliRunner().invoke(
        app, ["deploy", "k8s", str(echo_env_dir), "--host", "x.example.com"]
    )
    assert result.exit_code == 0
    assert "warning:" in result.stderr and "plain HTTP" in result.stderr


async def test_alert_rules_use_the_metrics_a_server_exports(fleet: list[dict[str, Any]]) -> None:
    rules = one(fleet, "PrometheusRule")["spec"]["groups"][0]["rules"]
    used = {m for r in rules for m in re.findall(r"\b(corral_[a-z_]+)\b", r["expr"])}
    assert used >= {"corral_sessions_active", "corral_errors_total", "corral_env_calls_total"}
    with running(EchoEnv) as server:
        async with AsyncEnvClient(server.url) as env:
            await env.reset()
            await env.step(EchoAction(message="x"))
        text = httpx.get(f"{server.url}/metrics", timeout=10, trust_env=False).text
    exported = set(re.findall(r"^# TYPE (corral_[a-z_]+) (\w+)", text, re.M))
    # Counters are exposed as NAME_total (the TYPE line says either, by client version).
    series = {
        name if kind != "counter" or name.endswith("_total") else f"{name}_total"
        for name, kind in exported
    }
    assert used <= series, used - series


def test_agent_sandbox_template_and_pool(fleet: list[dict[str, Any]]) -> None:
    template = one(fleet, "SandboxTemplate")
    pool = one(fleet, "SandboxWarmPool")
    assert template["apiVersion"] == pool["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
    pod_spec = template["spec"]["podTemplate"]["spec"]
    assert roundtrip(pod_spec, "V1PodSpec") == pod_spec
    env = {e["name"] for e in pod_spec["containers"][0]["env"]}
    assert "CORRAL_DRAIN_SECONDS" not in env
    assert template["spec"]["envVarsInjectionPolicy"] == "Disallowed"
    assert template["spec"]["networkPolicy"]["egress"] == []
    assert pool["spec"] == {"replicas": 3, "sandboxTemplateRef": {"name": "corral-echo"}}


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="min"):
        FleetOptions(min_replicas=5, max_replicas=2)
    with pytest.raises(ValueError, match="target_cpu"):
        FleetOptions(target_cpu=150)
    with pytest.raises(ValueError, match="target_sessions"):
        FleetOptions(target_sessions=0)


def test_cli_prints_only_yaml_on_stdout(echo_env_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["deploy", "k8s", str(echo_env_dir), "--namespace", "rl", "--host", "x.example.com"]
    )
    assert result.exit_code == 0, result.output
    documents = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
    expected = render_fleet(
        load_manifest(echo_env_dir), FleetOptions(namespace="rl", host="x.example.com")
    )
    assert documents == expected
    assert "&id" not in result.stdout  # no YAML anchors


def test_cli_writes_a_kustomize_base(echo_env_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    result = CliRunner().invoke(
        app, ["deploy", "k8s", str(echo_env_dir), "-o", str(out), "--no-prepull", "--no-monitoring"]
    )
    assert result.exit_code == 0, result.output
    base = yaml.safe_load((out / "kustomization.yaml").read_text())
    files = sorted(p.name for p in out.glob("*.yaml") if p.name != "kustomization.yaml")
    assert base == kustomization(files)
    kinds = [yaml.safe_load((out / f).read_text())["kind"] for f in files]
    assert kinds == [
        "Deployment",
        "Service",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ]


def test_cli_reports_bad_input(echo_env_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["deploy", "k8s", str(tmp_path)])
    assert result.exit_code == 2 and "no corral.yaml" in result.output
    result = CliRunner().invoke(
        app, ["deploy", "k8s", str(echo_env_dir), "--min-replicas", "3", "--max-replicas", "2"]
    )
    assert result.exit_code == 2 and "min (3) <= max (2)" in result.output


async def test_kubectl_applies_the_kustomize_base(echo_env_dir: Path, tmp_path: Path) -> None:
    """``kubectl apply --dry-run=client -k`` against the emulator's discovery."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl on this machine: the typed-model checks above stand in for it")
    out = tmp_path / "deploy"
    result = CliRunner().invoke(
        app, ["deploy", "k8s", str(echo_env_dir), "-o", str(out), "--host", "a.example.com",
              "--agent-sandbox", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    async with cluster() as kube:
        declare(kube.emulator, FLEET_KINDS)
        process = await asyncio.create_subprocess_exec(
            kubectl, "apply", "--dry-run=client", "--validate=false", "-k", str(out),
            "--server", kube.url, "-n", "rl",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, stderr.decode()
    applied = stdout.decode()
    for kind in ("deployment.apps", "service", "horizontalpodautoscaler.autoscaling",
                 "sandboxwarmpool.extensions.agents.x-k8s.io"):  # fmt: skip
        assert f"{kind}/corral-echo created (dry run)" in applied


async def test_gc_command_sweeps_through_a_kubeconfig(tmp_path: Path) -> None:
    """``corral k8s gc`` end to end: a kubeconfig pointing at the emulator, in a subprocess."""
    async with cluster() as kube:
        await kube.api.create(LEASES, lease("dead", 0))
        await kube.api.create(PODS, pod("p-dead", "dead"))
        config = tmp_path / "kubeconfig"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emu", "cluster": {"server": kube.url}}],
                    "users": [{"name": "me", "user": {}}],
                    "contexts": [
                        {
                            "name": "emu",
                            "context": {"cluster": "emu", "user": "me", "namespace": "rl"},
                        }
                    ],
                    "current-context": "emu",
                }
            )
        )
        command = [sys.executable, "-m", "corral", "k8s", "gc", "--kubeconfig", str(config)]
        dry = await asyncio.create_subprocess_exec(
            *command, "--dry-run", stdout=asyncio.subprocess.PIPE
        )
        planned = (await dry.communicate())[0].decode()
        assert "would delete" in planned and "p-dead" in planned
        assert {o["metadata"]["name"] for o in kube.objects("pods")} == {"p-dead"}
        done = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
        swept = (await done.communicate())[0].decode()
        assert "deleted 2 objects of 1 dead owners" in swept
        assert kube.objects("pods") == [] and kube.objects("leases") == []


def test_the_pod_router(echo_env_dir: Path) -> None:
    """Issue 29: one host reaches the Pod holding a client's sessions. The router's nginx
    runs for real in tests/providers/test_frontdoor_router.py; here, its objects."""
    options = FleetOptions(namespace="rl", host="envs.example.com", router=True)
    objects = render_fleet(load_manifest(echo_env_dir), options)
    server = by_kind(objects, "Deployment")[0]
    container = server["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-2:] == ["--server-id", "$(POD_IP)"]
    pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    assert config["metadata"]["name"] == "corral-echo-router"
    assert roundtrip(config, "V1ConfigMap") == config
    conf = config["data"]["nginx.conf"]
    assert "server corral-echo:80" in conf and "$pod:8000" in conf
    router = by_kind(objects, "Deployment")[1]
    assert roundtrip(router, "V1Deployment") == router
    spec = typed(router, "V1Deployment").spec.template.spec
    assert spec.containers[0].security_context.read_only_root_filesystem is True
    assert spec.volumes[0].config_map.name == "corral-echo-router"
    policy = by_kind(objects, "NetworkPolicy")[1]
    assert roundtrip(policy, "V1NetworkPolicy") == policy
    to_servers, dns = policy["spec"]["egress"]
    assert to_servers["to"] == [
        {"podSelector": {"matchLabels": server["spec"]["selector"]["matchLabels"]}}
    ]
    assert [p["port"] for p in dns["ports"]] == [53, 53]
    ingress = one(objects, "Ingress")
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == (
        "corral-echo-router"
    )
    route = one(
        render_fleet(load_manifest(echo_env_dir), FleetOptions(gateway="gw", router=True)),
        "HTTPRoute",
    )
    assert route["spec"]["rules"][0]["backendRefs"] == [{"name": "corral-echo-router", "port": 80}]
    # Without the router: no POD_IP id, the Ingress goes to the fleet's Service.
    plain = render_fleet(load_manifest(echo_env_dir), FleetOptions(host="envs.example.com"))
    assert "--server-id" not in by_kind(plain, "Deployment")[0]["spec"]["template"]["spec"][
        "containers"][0]["command"]  # fmt: skip
    assert by_kind(plain, "ConfigMap") == []

"""The manifests of a long-lived fleet of environment servers: ``corral deploy k8s``.

:func:`render_fleet` turns a manifest (``corral.yaml``) into plain Kubernetes objects,
in the order ``kubectl apply`` wants them:

* **Deployment**: the server Pods of :class:`~corral.providers.kubernetes.pods.ServerTemplate`
  (probes, requests and limits, hardened), spread over nodes and zones, rolled one surge
  Pod at a time and never below the wanted count; on SIGTERM a server **drains**:
  ``/ready`` answers 503 (no new clients), open sessions go on up to ``drain_seconds``
  (``$CORRAL_DRAIN_SECONDS``), and the grace period covers the drain;
* **Service** (port 80, for the ingress and the autoscaler) and a **headless Service**
  (``<name>-pods``) whose DNS name resolves to every ready Pod, so that a trainer in the
  cluster spreads an ``EnvPool`` over the Pods directly
  (:func:`~corral.providers.kubernetes.fleet.fleet_urls`);
* **HorizontalPodAutoscaler** on CPU and on active sessions per Pod
  (``corral_sessions_active`` from ``/metrics``, through the custom metrics API, e.g.
  prometheus-adapter), scaling down slowly since each removed Pod drains its sessions;
* **PodDisruptionBudget** (one Pod at a time);
* an image **pre-pull DaemonSet**, so that a new Pod on any node starts without a pull;
* a **NetworkPolicy**: the server's port open, egress closed (``egress=True`` opens it);
* an **Ingress** (ingress-nginx annotations: WebSocket read/send timeouts, frame size) or,
  with ``gateway=``, a Gateway API **HTTPRoute** whose request timeout is disabled;
* a **ServiceMonitor** and **PrometheusRule** (prometheus-operator): memory and CPU
  against the limits, WebSocket connections, error rate, refused sessions, fleet
  capacity, autoscaler at its maximum;
* with ``agent_sandbox=N``: a **SandboxTemplate** and a **SandboxWarmPool** of N warm
  Pods for kubernetes-sigs/agent-sandbox
  (:class:`~corral.providers.kubernetes.claims.AgentSandboxProvider` claims from it).

Why plain YAML rather than a Helm chart or a kustomize base of templates: the objects are
computed from ``corral.yaml`` (resources, port, sessions, the image tag ``corral build``
gave) by code that is tested against the official client's models; a chart would repeat
that logic in Go templates, untested, and drift from the provider's Pods. Written to a
directory, the output is also a kustomize base (``kustomization.yaml``), so overlays per
cluster need no new tool.

One module because the objects of a fleet are one thing: they share names, labels and
selectors, and refer to each other (the autoscaler to the Deployment, the route to the
Service, the monitor to its labels); it is long because the objects are spelled out as
data, as ``kubectl get -o yaml`` shows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from corral.providers.kubernetes.pods import ServerTemplate, dns_label
from corral.providers.manifest import Manifest

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
"""The do-nothing container that keeps a pre-pull Pod alive once its image is pulled."""
HEADLESS_LABEL = "corral.dev/headless"
"""Marks the headless Service (so that Prometheus scrapes each Pod once)."""
SESSIONS_METRIC = "corral_sessions_active"
"""The per-Pod gauge the autoscaler scales on."""


@dataclass(frozen=True)
class FleetOptions:
    """How the fleet is deployed (every field has a default a small fleet can keep).

    Attributes:
        image: the image (default: ``corral build``'s tag, ``corral-<name>:<version>``).
        namespace: set on every object (default: none, ``kubectl -n`` decides).
        replicas: Pods to start with (the autoscaler moves them after).
        min_replicas / max_replicas: the autoscaler's range.
        target_cpu: average CPU utilisation (% of requests) the autoscaler aims at.
        target_sessions: average active sessions per Pod it aims at (default: 80 % of
            ``concurrency.max_sessions``).
        drain_seconds: how long a stopping Pod serves its open sessions.
        host: the Ingress / HTTPRoute host name (no Ingress without a host or gateway).
        ingress_class: the Ingress class (default: the cluster's).
        tls_secret: a TLS Secret for the Ingress host.
        gateway: ``name`` or ``namespace/name`` of a Gateway: an HTTPRoute instead of an
            Ingress.
        websocket_timeout: seconds a WebSocket may stay silent at the ingress (the
            server pings every 20 s, so this is a backstop).
        egress: allow the servers outbound traffic.
        prepull: render the image pre-pull DaemonSet.
        monitoring: render the ServiceMonitor and the PrometheusRule.
        agent_sandbox: warm Pods of a SandboxWarmPool (0: no agent-sandbox objects).
        token_secret: a Secret holding the bearer token under ``token``.
        runtime_class: a RuntimeClass for the server Pods (gVisor, Kata).
        image_pull_secrets: Secrets to pull the image with.
        node_selector / tolerations: where the Pods may run.
        cpu_limit: limit CPU to the request (Guaranteed QoS).
    """

    image: str | None = None
    namespace: str | None = None
    replicas: int = 2
    min_replicas: int = 1
    max_replicas: int = 10
    target_cpu: int = 70
    target_sessions: float | None = None
    drain_seconds: float = 300.0
    host: str | None = None
    ingress_class: str | None = None
    tls_secret: str | None = None
    gateway: str | None = None
    websocket_timeout: int = 3600
    egress: bool = False
    prepull: bool = True
    monitoring: bool = True
    agent_sandbox: int = 0
    token_secret: str | None = None
    runtime_class: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    cpu_limit: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"replicas must satisfy 1 <= min ({self.min_replicas}) <= max ({self.max_replicas})"
            )
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {self.replicas}")
        if not 1 <= self.target_cpu <= 100:
            raise ValueError(f"target_cpu is a percentage of the request, got {self.target_cpu}")
        if self.target_sessions is not None and self.target_sessions <= 0:
            raise ValueError(f"target_sessions must be positive, got {self.target_sessions}")
        if self.drain_seconds < 0 or self.websocket_timeout < 1 or self.agent_sandbox < 0:
            raise ValueError("drain_seconds, websocket_timeout and agent_sandbox must be >= 0")


def _meta(
    name: str,
    labels: Mapping[str, str],
    namespace: str | None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace is not None:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


class _Fleet:
    """The objects of one fleet (see :func:`render_fleet`)."""

    def __init__(self, manifest: Manifest, options: FleetOptions) -> None:
        self.manifest = manifest
        self.options = options
        self.template = ServerTemplate.from_manifest(
            manifest,
            image=options.image,
            token_secret=options.token_secret,
            runtime_class=options.runtime_class,
            image_pull_secrets=options.image_pull_secrets,
            node_selector=options.node_selector,
            tolerations=options.tolerations,
            cpu_limit=options.cpu_limit,
            drain_seconds=options.drain_seconds,
        )
        self.name = self.template.app_name
        self.labels = self.template.labels()
        self.selector = self.template.selector()

    def meta(self, name: str, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
        return _meta(name, self.labels, self.options.namespace, annotations)

    @property
    def max_sessions(self) -> int:
        return self.manifest.concurrency.max_sessions

    def deployment(self) -> dict[str, Any]:
        spec = self.template.pod_spec()
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": self.selector},
            }
            for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
        ]
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self.meta(self.name),
            "spec": {
                "replicas": self.options.replicas,
                "revisionHistoryLimit": 5,
                "minReadySeconds": 5,
                "selector": {"matchLabels": self.selector},
                "strategy": {
                    "type": "RollingUpdate",
                    # Never below the wanted count: a rollout adds a Pod, then drains one.
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                },
                "template": {"metadata": {"labels": self.labels}, "spec": spec},
            },
        }

    def services(self) -> list[dict[str, Any]]:
        port = self.template.port
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.meta(self.name),
            "spec": {
                "type": "ClusterIP",
                "selector": self.selector,
                "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
            },
        }
        headless = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(
                f"{self.name}-pods", {**self.labels, HEADLESS_LABEL: "true"}, self.options.namespace
            ),
            "spec": {
                "clusterIP": "None",
                "selector": self.selector,
                "publishNotReadyAddresses": False,
                "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
            },
        }
        return [service, headless]

    def autoscaler(self) -> dict[str, Any]:
        options = self.options
        sessions = options.target_sessions or max(1.0, 0.8 * self.max_sessions)
        return {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": self.meta(self.name),
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": self.name,
                },
                "minReplicas": options.min_replicas,
                "maxReplicas": options.max_replicas,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {
                                "type": "Utilization",
                                "averageUtilization": options.target_cpu,
                            },
                        },
                    },
                    {
                        "type": "Pods",
                        "pods": {
                            "metric": {"name": SESSIONS_METRIC},
                            "target": {"type": "AverageValue", "averageValue": f"{sessions:g}"},
                        },
                    },
                ],
                "behavior": {
                    "scaleUp": {
                        "stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 30}],
                    },
                    # Every Pod removed drains its sessions: one at a time, and only after
                    # the load stayed low for five minutes.
                    "scaleDown": {
                        "stabilizationWindowSeconds": 300,
                        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                    },
                },
            },
        }

    def disruption_budget(self) -> dict[str, Any]:
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": self.meta(self.name),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": self.selector}},
        }

    def prepull(self) -> dict[str, Any]:
        """A DaemonSet whose init container pulls the image on every node, then idles."""
        spec = self.template.pod_spec()
        server = spec["containers"][0]
        security = server["securityContext"]
        small = {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "32Mi"}}
        selector = {"app.kubernetes.io/name": f"{self.name}-prepull"}
        pod_spec: dict[str, Any] = {
            "initContainers": [
                {
                    "name": "pull",
                    "image": server["image"],
                    "command": ["python", "-c", "pass"],
                    "resources": small,
                    "securityContext": security,
                }
            ],
            "containers": [
                {
                    "name": "pause",
                    "image": PAUSE_IMAGE,
                    "resources": small,
                    "securityContext": security,
                }
            ],
            "automountServiceAccountToken": False,
            "securityContext": spec["securityContext"],
            "terminationGracePeriodSeconds": 1,
        }
        for key in ("imagePullSecrets", "nodeSelector", "tolerations"):
            if key in spec:
                pod_spec[key] = spec[key]
        return {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": self.meta(f"{self.name}-prepull"),
            "spec": {
                "selector": {"matchLabels": selector},
                "updateStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": "20%"},
                },
                "template": {"metadata": {"labels": {**self.labels, **selector}}, "spec": pod_spec},
            },
        }

    def network_policy(self) -> dict[str, Any]:
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": self.meta(self.name),
            "spec": {
                "podSelector": {"matchLabels": self.selector},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"ports": [{"port": self.template.port, "protocol": "TCP"}]}],
                # No rule: nothing leaves the servers, DNS included (they need none).
                "egress": [{}] if self.options.egress else [],
            },
        }

    def ingress(self) -> dict[str, Any]:
        options = self.options
        timeout = str(options.websocket_timeout)
        annotations = {
            "nginx.ingress.kubernetes.io/proxy-read-timeout": timeout,
            "nginx.ingress.kubernetes.io/proxy-send-timeout": timeout,
            # Twice the server's default frame cap (16 MiB): its own error, not the proxy's.
            "nginx.ingress.kubernetes.io/proxy-body-size": "32m",
        }
        spec: dict[str, Any] = {
            "rules": [
                {
                    "host": options.host,
                    "http": {
                        "paths": [
                            {
                                "path": "/",
                                "pathType": "Prefix",
                                "backend": {
                                    "service": {"name": self.name, "port": {"name": "http"}}
                                },
                            }
                        ]
                    },
                }
            ]
        }
        if options.ingress_class is not None:
            spec["ingressClassName"] = options.ingress_class
        if options.tls_secret is not None:
            spec["tls"] = [{"hosts": [options.host], "secretName": options.tls_secret}]
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": self.meta(self.name, annotations),
            "spec": spec,
        }

    def http_route(self) -> dict[str, Any]:
        options = self.options
        assert options.gateway is not None
        namespace, _, name = options.gateway.rpartition("/")
        parent: dict[str, Any] = {"name": name}
        if namespace:
            parent["namespace"] = namespace
        spec: dict[str, Any] = {
            "parentRefs": [parent],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [{"name": self.name, "port": 80}],
                    # "0s" disables the request timeout: a WebSocket lives as long as the
                    # training run, and the server's pings detect dead peers.
                    "timeouts": {"request": "0s", "backendRequest": "0s"},
                }
            ],
        }
        if options.host is not None:
            spec["hostnames"] = [options.host]
        return {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": self.meta(self.name),
            "spec": spec,
        }

    def service_monitor(self) -> dict[str, Any]:
        endpoint: dict[str, Any] = {
            "port": "http",
            "path": "/metrics",
            "interval": "15s",
            "scrapeTimeout": "10s",
        }
        if self.options.token_secret is not None:
            endpoint["authorization"] = {
                "type": "Bearer",
                "credentials": {"name": self.options.token_secret, "key": "token"},
            }
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": self.meta(self.name),
            "spec": {
                # The fleet's Service only: the headless one reaches the same Pods.
                "selector": {
                    "matchLabels": self.selector,
                    "matchExpressions": [{"key": HEADLESS_LABEL, "operator": "DoesNotExist"}],
                },
                "endpoints": [endpoint],
            },
        }

    def alert_rules(self) -> dict[str, Any]:
        job = f'job="{self.name}"'
        pods = f'container="server", pod=~"{self.name}-.*"'
        if self.options.namespace is not None:
            pods += f', namespace="{self.options.namespace}"'
        per_pod = "max by (namespace, pod)"
        connections = max(64, 2 * self.max_sessions)
        hpa = f'horizontalpodautoscaler="{self.name}"'

        def rule(
            name: str, expr: str, duration: str, severity: str, summary: str
        ) -> dict[str, Any]:
            return {
                "alert": name,
                "expr": expr,
                "for": duration,
                "labels": {"severity": severity},
                "annotations": {"summary": summary},
            }

        rules = [
            rule(
                "CorralEnvMemoryHigh",
                f"{per_pod} (container_memory_working_set_bytes{{{pods}}}) / {per_pod} "
                f'(kube_pod_container_resource_limits{{{pods}, resource="memory"}}) > 0.9',
                "5m",
                "warning",
                "{{ $labels.pod }} uses over 90% of its memory limit: raise resources.memory "
                "or lower concurrency.max_sessions",
            ),
            rule(
                "CorralEnvCPUHigh",
                f"sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{{{pods}}}[5m]))"
                f' / {per_pod} (kube_pod_container_resource_limits{{{pods}, resource="cpu"}})'
                " > 0.9",
                "15m",
                "warning",
                "{{ $labels.pod }} runs at over 90% of its CPU limit: steps slow down",
            ),
            rule(
                "CorralEnvConnectionsHigh",
                f"{per_pod} (corral_connections_active{{{job}}}) > {connections}",
                "10m",
                "warning",
                "{{ $labels.pod }} holds many WebSocket connections: a client per session "
                "instead of an EnvPool, or connections leaking",
            ),
            rule(
                "CorralEnvErrorRate",
                f"sum(rate(corral_errors_total{{{job}}}[5m])) / "
                f"clamp_min(sum(rate(corral_env_calls_total{{{job}}}[5m])), 1e-9) > 0.05",
                "10m",
                "critical",
                "over 5% of environment calls fail",
            ),
            rule(
                "CorralEnvSessionsRefused",
                f'sum(rate(corral_sessions_total{{{job}, event="refused"}}[5m])) > 0',
                "5m",
                "warning",
                "servers refuse sessions at capacity: raise max_replicas or max_sessions",
            ),
            rule(
                "CorralEnvFleetNearCapacity",
                f"sum(corral_sessions_active{{{job}}}) / sum(corral_sessions_max{{{job}}}) > 0.85",
                "10m",
                "warning",
                "the fleet holds over 85% of its session capacity",
            ),
            rule(
                "CorralEnvAutoscalerAtMax",
                f"kube_horizontalpodautoscaler_status_current_replicas{{{hpa}}} >= "
                f"kube_horizontalpodautoscaler_spec_max_replicas{{{hpa}}}",
                "15m",
                "warning",
                "the autoscaler is at max_replicas: the fleet cannot grow",
            ),
        ]
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": self.meta(self.name),
            "spec": {"groups": [{"name": self.name, "rules": rules}]},
        }

    def agent_sandbox(self) -> list[dict[str, Any]]:
        """A SandboxTemplate of the server Pod and a SandboxWarmPool of it."""
        # Sandboxes are single servers: no drain, and the template carries no env a claim
        # could override (which would force cold starts).
        template = replace(self.template, drain_seconds=None)
        sandbox_template = {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxTemplate",
            "metadata": self.meta(self.name),
            "spec": {
                "podTemplate": {"metadata": {"labels": self.labels}, "spec": template.pod_spec()},
                "networkPolicyManagement": "Managed",
                "networkPolicy": {
                    "ingress": [{"ports": [{"port": template.port, "protocol": "TCP"}]}],
                    "egress": [{}] if self.options.egress else [],
                },
                "envVarsInjectionPolicy": "Disallowed",
            },
        }
        warm_pool = {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxWarmPool",
            "metadata": self.meta(self.name),
            "spec": {
                "replicas": self.options.agent_sandbox,
                "sandboxTemplateRef": {"name": self.name},
            },
        }
        return [sandbox_template, warm_pool]

    def objects(self) -> list[dict[str, Any]]:
        options = self.options
        objects = [self.deployment(), *self.services(), self.autoscaler(), self.disruption_budget()]
        if options.prepull:
            objects.append(self.prepull())
        objects.append(self.network_policy())
        if options.gateway is not None:
            objects.append(self.http_route())
        elif options.host is not None:
            objects.append(self.ingress())
        if options.monitoring:
            objects += [self.service_monitor(), self.alert_rules()]
        if options.agent_sandbox:
            objects += self.agent_sandbox()
        return objects


def render_fleet(manifest: Manifest, options: FleetOptions | None = None) -> list[dict[str, Any]]:
    """The objects of a fleet serving ``manifest``'s environment (see the module docstring)."""
    return _Fleet(manifest, options or FleetOptions()).objects()


def file_name(index: int, obj: Mapping[str, Any]) -> str:
    """``NN-kind-name.yaml``: the file an object is written to (apply order kept)."""
    kind = str(obj["kind"]).lower()
    return f"{index:02d}-{kind}-{dns_label(str(obj['metadata']['name']))}.yaml"


def kustomization(files: list[str], namespace: str | None = None) -> dict[str, Any]:
    """A kustomize base listing the written files."""
    base: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": files,
    }
    if namespace is not None:
        base["namespace"] = namespace
    return base

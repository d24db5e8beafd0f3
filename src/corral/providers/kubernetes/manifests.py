"""The manifests of a long-lived fleet of environment servers: ``corral deploy k8s``.

:func:`render_fleet` turns a manifest (``corral.yaml``) into plain Kubernetes objects,
in the order ``kubectl apply`` wants them:

* **Deployment**: the server Pods of :class:`~corral.providers.kubernetes.pods.ServerTemplate`
  (probes, requests and limits, hardened), spread over nodes and zones, rolled one surge
  Pod at a time and never below the wanted count, with **no** ``spec.replicas``: the
  autoscaler owns the count (a GitOps sync re-applying a count would fight it, resetting
  the fleet at every sync); on SIGTERM a server **drains**:
  ``/ready`` answers 503 (no new clients), open sessions go on up to ``drain_seconds``
  (``$CORRAL_DRAIN_SECONDS``), and the grace period covers the drain;
* **Service** (port 80, for the ingress and the autoscaler) and a **headless Service**
  (``<name>-pods``) whose DNS name resolves to every ready Pod, so that a trainer in the
  cluster spreads an ``EnvPool`` over the Pods directly
  (:func:`~corral.providers.kubernetes.fleet.fleet_urls`);
* **HorizontalPodAutoscaler** on CPU and on active sessions per Pod
  (``corral_sessions_active`` from ``/metrics``, through the custom metrics API, e.g.
  prometheus-adapter), scaling down slowly since each removed Pod drains its sessions;
* **PodDisruptionBudget** (one Pod at a time; the autoscaler's minimum is at least 2, as
  one Pod under that budget could be evicted at any time, and under a stricter one never);
* an image **pre-pull DaemonSet**, so that a new Pod on any node starts without a pull:
  under the servers' RuntimeClass and with their node selector and tolerations, so it
  reaches the nodes they may land on (gVisor nodes are usually tainted);
* a **NetworkPolicy**: the server's port open to the namespace's Pods and to the
  namespaces labelled ``corral.dev/clients=true`` (the ingress controller's, the
  trainers'; ``allow_from`` adds more), egress closed (``egress=True`` opens it);
* an **Ingress** with the timeouts and body size set for the chosen controller
  (``ingress_controller``: ingress-nginx, HAProxy, Traefik or none) or, with ``gateway=``,
  a Gateway API **HTTPRoute** whose request timeout is disabled;
* with ``router=True``: a **Pod router** (ConfigMap, Deployment, Service and NetworkPolicy
  ``<name>-router``): nginx routing a ``corral-server`` header that names a Pod (the
  servers' id is their Pod IP) to that Pod, and everything else to the fleet's Service;
  the Ingress or HTTPRoute points at it, so a client reaches the server holding its
  sessions through the one host (:func:`~corral.providers.frontdoor.render_nginx_pod_router`
  says why a router rather than the ingress controller's own features);
* a **ServiceMonitor** and **PrometheusRule** (prometheus-operator): memory against the
  limit, CPU against the limit and CFS throttling (or, with ``cpu_limit=False``, against
  the request), WebSocket connections per session, error rate, refused sessions, fleet
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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from corral.providers.kubernetes.pods import SANDBOXES, ServerTemplate, dns_label
from corral.providers.manifest import Manifest

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
"""The do-nothing container that keeps a pre-pull Pod alive once its image is pulled."""
HEADLESS_LABEL = "corral.dev/headless"
"""Marks the headless Service (so that Prometheus scrapes each Pod once)."""
SESSIONS_METRIC = "corral_sessions_active"
"""The per-Pod gauge the autoscaler scales on."""
ROUTER_IMAGE = "nginxinc/nginx-unprivileged:1.27-alpine"
"""The Pod router's nginx: the official image's unprivileged build (uid 101, port 8080)."""
ROUTER_PORT = 8080
CLIENTS_LABEL = "corral.dev/clients"
"""A namespace labelled ``corral.dev/clients=true`` may reach the servers (NetworkPolicy)."""

INGRESS_ANNOTATIONS: dict[str, Callable[[int], dict[str, str]]] = {
    # ingress-nginx: proxy timeouts in seconds; the body cap (twice the server's default
    # frame cap, 16 MiB, so that the server's own error answers, not the proxy's).
    "nginx": lambda t: {
        "nginx.ingress.kubernetes.io/proxy-read-timeout": str(t),
        "nginx.ingress.kubernetes.io/proxy-send-timeout": str(t),
        "nginx.ingress.kubernetes.io/proxy-body-size": "32m",
    },
    # HAProxy Technologies' kubernetes-ingress: a WebSocket is a tunnel once upgraded.
    "haproxy": lambda t: {
        "haproxy.org/timeout-tunnel": f"{t}s",
        "haproxy.org/timeout-server": f"{t}s",
    },
    # Traefik has no per-Ingress timeouts (they are the entry point's); nothing to set.
    "traefik": lambda t: {},
    "none": lambda t: {},
}
"""Per Ingress controller: the annotations for a WebSocket that lives ``t`` seconds."""


@dataclass(frozen=True)
class FleetOptions:
    """How the fleet is deployed (every field has a default a small fleet can keep).

    Attributes:
        image: the image (default: ``corral build``'s tag, ``corral-<name>:<version>``).
        namespace: set on every object (default: none, ``kubectl -n`` decides).
        min_replicas / max_replicas: the autoscaler's range (the Deployment has no count of
            its own); at least 2 while a disruption budget is rendered.
        disruption_budget: render the PodDisruptionBudget.
        target_cpu: average CPU utilisation (% of requests) the autoscaler aims at.
        target_sessions: average active sessions per Pod it aims at (default: 80 % of
            ``concurrency.max_sessions``).
        drain_seconds: how long a stopping Pod serves its open sessions.
        host: the Ingress / HTTPRoute host name (no Ingress without a host or gateway).
        ingress_class: the Ingress class (default: the cluster's).
        ingress_controller: whose annotations the Ingress carries: ``nginx``
            (ingress-nginx), ``haproxy`` (haproxytech kubernetes-ingress), ``traefik``
            or ``none``.
        tls_secret: a TLS Secret for the Ingress host.
        gateway: ``name`` or ``namespace/name`` of a Gateway: an HTTPRoute instead of an
            Ingress.
        websocket_timeout: seconds a WebSocket may stay silent at the ingress (the
            server pings every 20 s, so this is a backstop).
        egress: allow the servers outbound traffic.
        allow_from: more namespaces (names) whose Pods may reach the servers.
        prepull: render the image pre-pull DaemonSet.
        monitoring: render the ServiceMonitor and the PrometheusRule.
        agent_sandbox: warm Pods of a SandboxWarmPool (0: no agent-sandbox objects).
        token_secret: a Secret holding the bearer token under ``token``.
        runtime_class: a RuntimeClass for the server Pods (gVisor, Kata).
        router: render the Pod router and send the Ingress/HTTPRoute through it.
        router_image: the router's nginx image (non-root, listening on 8080).
        sandbox: how an environment that sandboxes code gets its boundary in the Pod:
            ``none``, ``namespaces`` or ``runtime-class``
            (:mod:`corral.providers.kubernetes.pods`).
        image_pull_secrets: Secrets to pull the image with.
        node_selector / tolerations: where the Pods may run.
        cpu_limit: limit CPU to the request (Guaranteed QoS).
    """

    image: str | None = None
    namespace: str | None = None
    min_replicas: int = 2
    max_replicas: int = 10
    disruption_budget: bool = True
    target_cpu: int = 70
    target_sessions: float | None = None
    drain_seconds: float = 300.0
    host: str | None = None
    ingress_class: str | None = None
    ingress_controller: str = "nginx"
    tls_secret: str | None = None
    gateway: str | None = None
    websocket_timeout: int = 3600
    egress: bool = False
    allow_from: tuple[str, ...] = ()
    prepull: bool = True
    monitoring: bool = True
    agent_sandbox: int = 0
    token_secret: str | None = None
    runtime_class: str | None = None
    sandbox: str = "none"
    router: bool = False
    router_image: str = ROUTER_IMAGE
    image_pull_secrets: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    cpu_limit: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"replicas must satisfy 1 <= min ({self.min_replicas}) <= max ({self.max_replicas})"
            )
        if self.disruption_budget and self.min_replicas < 2:
            raise ValueError(
                f"min_replicas must be at least 2 under the disruption budget, got "
                f"{self.min_replicas}: with one Pod, a node drain evicts the only server "
                "(or, under a stricter budget, can never proceed); turn the budget off "
                "to run a single Pod"
            )
        if self.sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, not {self.sandbox!r}")
        if self.sandbox == "runtime-class" and self.runtime_class is None:
            raise ValueError(
                "--sandbox runtime-class makes the RuntimeClass the boundary: "
                "give --runtime-class (gvisor, kata)"
            )
        if self.ingress_controller not in INGRESS_ANNOTATIONS:
            raise ValueError(
                f"ingress_controller must be one of {', '.join(INGRESS_ANNOTATIONS)}, "
                f"not {self.ingress_controller!r}"
            )
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
            sandbox=options.sandbox,
            image_pull_secrets=options.image_pull_secrets,
            node_selector=options.node_selector,
            tolerations=options.tolerations,
            cpu_limit=options.cpu_limit,
            drain_seconds=options.drain_seconds,
            pod_ip_id=options.router,
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
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": self.selector},
                # A Pod that is not ready serves nobody: evicting it never costs a session,
                # and must not be blocked by the budget (a stuck Pod would block a drain).
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
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
        # The servers' RuntimeClass (its scheduling adds its node selector and tolerations,
        # e.g. for tainted gVisor nodes) and placement: the image is pulled where they run.
        for key in ("runtimeClassName", "imagePullSecrets", "nodeSelector", "tolerations"):
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
                "ingress": [
                    {
                        "from": self._peers(),
                        "ports": [{"port": self.template.port, "protocol": "TCP"}],
                    }
                ],
                # No rule: nothing leaves the servers, DNS included (they need none).
                "egress": [{}] if self.options.egress else [],
            },
        }

    def _peers(self) -> list[dict[str, Any]]:
        """Who may reach the servers: the namespace's own Pods (trainers, the metrics
        scraper deployed beside them), namespaces labelled as clients, and ``allow_from``.
        Kubelet probes come from the node and are not subject to the policy."""
        peers: list[dict[str, Any]] = [
            {"podSelector": {}},
            {"namespaceSelector": {"matchLabels": {CLIENTS_LABEL: "true"}}},
        ]
        peers += [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}
            for name in self.options.allow_from
        ]
        return peers

    @property
    def entry(self) -> str:
        """The Service the Ingress or HTTPRoute sends clients to."""
        return f"{self.name}-router" if self.options.router else self.name

    def router(self) -> list[dict[str, Any]]:
        """The Pod router: its configuration, Pods, Service and NetworkPolicy."""
        from corral.providers.frontdoor import render_nginx_pod_router

        name = f"{self.name}-router"
        selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "router"}
        labels = {**self.labels, **selector}
        conf = render_nginx_pod_router(
            f"{self.name}:80",
            pod_port=self.template.port,
            listen=f"0.0.0.0:{ROUTER_PORT}",
            prefix="/tmp",
            websocket_timeout_s=self.options.websocket_timeout,
        )
        meta = _meta(name, labels, self.options.namespace)
        config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                      "data": {"nginx.conf": conf}}  # fmt: skip
        probe = {"tcpSocket": {"port": "http"}, "periodSeconds": 5}
        container = {
            "name": "router",
            "image": self.options.router_image,
            "command": ["nginx", "-p", "/tmp", "-c", "/etc/corral-router/nginx.conf"],
            "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
            "resources": {
                "requests": {"cpu": "100m", "memory": "64Mi"},
                "limits": {"memory": "128Mi"},
            },
            "readinessProbe": probe,
            "livenessProbe": {**probe, "periodSeconds": 10},
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "privileged": False,
                "runAsNonRoot": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [
                {"name": "config", "mountPath": "/etc/corral-router", "readOnly": True},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
        }
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [container],
                        "automountServiceAccountToken": False,
                        "enableServiceLinks": False,
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 101,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "volumes": [
                            {"name": "config", "configMap": {"name": name}},
                            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                        ],
                    },
                },
            },
        }
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "type": "ClusterIP",
                "selector": selector,
                "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
            },
        }
        policy = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": meta,
            "spec": {
                "podSelector": {"matchLabels": selector},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [
                    {"from": self._peers(), "ports": [{"port": ROUTER_PORT, "protocol": "TCP"}]}
                ],
                # A forged header reaches nothing but the fleet's servers (and DNS, which
                # resolves the fleet's Service at start).
                "egress": [
                    {
                        "to": [{"podSelector": {"matchLabels": self.selector}}],
                        "ports": [{"port": self.template.port, "protocol": "TCP"}],
                    },
                    {
                        "to": [{"namespaceSelector": {}}],
                        "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                    },
                ],
            },
        }
        return [config_map, deployment, service, policy]

    def ingress(self) -> dict[str, Any]:
        options = self.options
        annotations = INGRESS_ANNOTATIONS[options.ingress_controller](options.websocket_timeout)
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
                                    "service": {"name": self.entry, "port": {"name": "http"}}
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
                    "backendRefs": [{"name": self.entry, "port": 80}],
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
        # One client per session reaches as many connections as sessions (up to
        # max_sessions); an EnvPool multiplexes up to 256 sessions per connection. Half
        # the Pod's sessions on their own connections is the pattern to flag.
        connections = max(2, self.max_sessions // 2)
        cpu_use = f"sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{{{pods}}}[5m]))"
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
            *self._cpu_rules(rule, cpu_use, pods, per_pod),
            rule(
                "CorralEnvConnectionsHigh",
                f"{per_pod} (corral_connections_active{{{job}}}) >= {connections}",
                "10m",
                "warning",
                f"{{{{ $labels.pod }}}} holds {connections}+ WebSocket connections (its "
                f"max_sessions is {self.max_sessions}): a client per session instead of an "
                "EnvPool, or connections leaking",
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

    def _cpu_rules(
        self, rule: Callable[..., dict[str, Any]], cpu_use: str, pods: str, per_pod: str
    ) -> list[dict[str, Any]]:
        """CPU alerts that can fire in the Pod shape rendered: against the limit, and CFS
        throttling (what makes steps slow under a limit, docs/scaling.md), when there is
        a limit; against the request when there is none (no limit series exists then)."""
        if not self.options.cpu_limit:
            return [
                rule(
                    "CorralEnvCPUHigh",
                    f"{cpu_use} / {per_pod} "
                    f'(kube_pod_container_resource_requests{{{pods}, resource="cpu"}}) > 1.5',
                    "15m",
                    "warning",
                    "{{ $labels.pod }} uses over 150% of its CPU request (no limit): the "
                    "node is overcommitted or target_cpu is too high for the autoscaler",
                )
            ]
        throttled = (
            f"sum by (namespace, pod) (rate(container_cpu_cfs_throttled_periods_total{{{pods}}}"
            f"[5m])) / sum by (namespace, pod) (rate(container_cpu_cfs_periods_total{{{pods}}}"
            "[5m])) > 0.25"
        )
        return [
            rule(
                "CorralEnvCPUHigh",
                f"{cpu_use}"
                f' / {per_pod} (kube_pod_container_resource_limits{{{pods}, resource="cpu"}})'
                " > 0.9",
                "15m",
                "warning",
                "{{ $labels.pod }} runs at over 90% of its CPU limit: steps slow down",
            ),
            rule(
                "CorralEnvCPUThrottled",
                throttled,
                "15m",
                "warning",
                "{{ $labels.pod }} is CPU-throttled in over 25% of its CFS periods: batched "
                "steps wait for the next period (raise resources.cpu or render --no-cpu-limit)",
            ),
        ]

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
        objects = [self.deployment(), *self.services(), self.autoscaler()]
        if options.disruption_budget:
            objects.append(self.disruption_budget())
        if options.prepull:
            objects.append(self.prepull())
        objects.append(self.network_policy())
        if options.router:
            objects += self.router()
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


def fleet_warnings(options: FleetOptions) -> list[str]:
    """What an operator should hear about before applying ``options``' fleet."""
    found = []
    exposed = options.host is not None or options.gateway is not None
    if exposed and options.token_secret is None:
        if options.gateway is None and options.tls_secret is None:
            found.append(
                f"the Ingress serves {options.host} over plain HTTP to servers that require "
                "no token: anyone who reaches it can open and drive sessions; give "
                "--token-secret (and --tls-secret)"
            )
        else:
            found.append(
                "the servers are exposed outside the cluster and require no token: anyone "
                "who reaches the host can open and drive sessions; give --token-secret"
            )
    elif options.host is not None and options.gateway is None and options.tls_secret is None:
        found.append(
            f"the Ingress serves {options.host} over plain HTTP: the bearer token crosses "
            "the network in clear; give --tls-secret"
        )
    return found


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

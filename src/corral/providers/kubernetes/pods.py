"""The Pod of one corral server: container, probes, limits, security context, labels.

One :class:`ServerTemplate` renders the Pod that runs ``corral serve`` for an
environment, and everything that runs it shares it: the Kubernetes provider (one Pod per
server), ``corral deploy k8s`` (the Deployment's Pod template, the image pre-pull
DaemonSet) and the agent-sandbox ``SandboxTemplate``. The Pod:

* runs the environment's image with the manifest's ``corral serve`` command, listening on
  the manifest's port (named ``http``);
* requests the manifest's CPU and memory and is limited to them (Guaranteed QoS, unless
  ``cpu_limit=False``);
* probes ``/readyz`` for readiness (503 while full or draining), ``/livez`` for liveness,
  and ``/livez`` as a startup probe so that slow imports are not killed: the token-free,
  bodiless twins of ``/ready`` and ``/health`` (:data:`corral.server.http.PROBE_PATHS`),
  so the probes are plain ``httpGet`` probes even when the server requires a token (an
  ``exec`` probe sending the token started a Python each time: 51-66 ms of CPU, 12-16 %
  of a 250m Pod at a 2 s period);
* runs hardened: non-root (the image's uid 10001), read-only root filesystem with an
  in-memory ``/tmp``, no privilege escalation, every capability dropped, seccomp
  ``RuntimeDefault``, no service-account token, no service links; optionally under a
  RuntimeClass (gVisor, Kata) for a stronger boundary;
* carries the standard ``app.kubernetes.io`` labels and corral's own.

**Environments that sandbox code** (the coding environment) need more than the hardened
Pod allows: under it every namespace mode fails (``RuntimeDefault`` seccomp refuses new
user namespaces; with seccomp off, the masked ``/proc`` cannot be mounted in a new pid
namespace), and ``"auto"`` used to fall silently to the weak ``rlimits`` mode. Measured
with Docker's equivalents of these settings (``tests/providers/kubernetes/test_k8s_sandbox.py``).
``sandbox=`` says how such a Pod gets its boundary:

* ``"namespaces"``: the Pod runs in a **user namespace of its own** (``hostUsers:
  false``: its uids, root included, are nobody on the node), and the server container
  may create namespaces (``seccompProfile: Unconfined``) and mount an unmasked ``/proc``
  in them (``procMount: Unmasked``). Still non-root, no capabilities, no privilege
  escalation, read-only root. util-linux's ``unshare`` (in every Debian image) then runs
  the ``unshare`` mode; ``bwrap`` where the image has it. Needs Kubernetes with user
  namespaces (1.33+, or 1.30+ with the feature gate) and a runtime that supports them;
  Pod Security ``restricted`` rejects these settings: label the namespace ``baseline``
  at most and see docs/scaling.md;
* ``"runtime-class"``: the RuntimeClass (gVisor, Kata; ``runtime_class=``) is the
  boundary between the agents' code and the node, and the server is allowed the weak
  mode inside it (``$CORRAL_SANDBOX_ALLOW_WEAK=1``): sessions of one Pod are separated
  by resource limits and Python-level guards only, which code written to escape them
  gets past (:mod:`corral.sandbox`). Use it where one Pod's sessions may see each other;
* ``"none"`` (default): the hardened Pod; a sandboxing environment refuses to start in
  it (its preflight finds no namespace mode), which ``/health`` and the Pod's logs say.

With a bearer token (``token_secret``: a Secret holding it under the key ``token``), the
server requires it on every route but the two probe paths.

Everything here renders plain dicts in the API's JSON shape: no Kubernetes client needed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.auth import TOKEN_ENV
from corral.providers.dockerfile import IMAGE_UID, image_tag, serve_command
from corral.providers.manifest import Manifest, format_memory
from corral.sandbox.probe import ALLOW_WEAK_ENV

DOMAIN = "corral.dev"
"""The prefix of corral's own labels and annotations."""
OWNER_LABEL = f"{DOMAIN}/owner"
"""Marks what a provider created with the provider's owner id (swept by ``corral k8s gc``)."""
ROLE_LABEL = f"{DOMAIN}/role"
"""``owner`` on a provider's Lease (its liveness)."""
MODE_LABEL = f"{DOMAIN}/provider"
"""On a provider's Lease: its mode (``pods``, ``agent-sandbox``), so a sweep of a dead
owner lists the kinds that owner created and no other (see
:mod:`corral.providers.kubernetes.rbac`)."""
ENV_LABEL = f"{DOMAIN}/env"
CONTRACT_LABEL = f"{DOMAIN}/contract"
MANAGED_BY = "app.kubernetes.io/managed-by"
CONTAINER = "server"
"""The name of the server's container."""
TOKEN_KEY = "token"
"""The key of the bearer token in its Secret."""
SANDBOXES = ("none", "namespaces", "runtime-class")
"""The values of :attr:`ServerTemplate.sandbox` (see the module docstring)."""

_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` as a DNS-1123 label (lowercase letters, digits, ``-``; at most ``limit``)."""
    label = _DNS_LABEL.sub("-", text.lower()).strip("-")[:limit].rstrip("-")
    return label or "corral"


def cpu_quantity(cpu: float) -> str:
    """A CPU amount as a Kubernetes quantity: ``1`` → ``"1"``, ``0.5`` → ``"500m"``."""
    millis = round(cpu * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


@dataclass(frozen=True)
class ServerTemplate:
    """Everything the Pod of one environment server needs (see the module docstring).

    Attributes:
        name: the environment's name (it names the Pods and labels them).
        image: the image to run.
        port: the port the server listens on in the container.
        command: the container's full command; None runs the image's own command.
        cpu: CPUs requested (and the limit, with ``cpu_limit``).
        memory: bytes of memory requested and the limit.
        version: the environment's version (a label).
        contract_version: its contract version (a label).
        environment: extra environment variables.
        token_secret: a Secret holding the bearer token under ``token``.
        runtime_class: a RuntimeClass (``gvisor``, ``kata``) for stronger isolation.
        service_account: the Pod's service account (its token is never mounted).
        image_pull_policy: ``Always``, ``IfNotPresent`` or ``Never`` (default: the
            cluster's).
        image_pull_secrets: Secrets to pull the image with.
        node_selector: node labels the Pod must land on.
        tolerations: taints the Pod tolerates (API-shaped dicts).
        cpu_limit: limit CPU to the request (Guaranteed QoS); False leaves it burstable.
        drain_seconds: on SIGTERM, keep serving open sessions this long
            (``$CORRAL_DRAIN_SECONDS``); the Pod's grace period covers it.
        probe_period: seconds between readiness probes.
        sandbox: how a sandboxing environment gets its boundary: ``"none"``,
            ``"namespaces"`` or ``"runtime-class"`` (see the module docstring).
        pod_ip_id: the server's id is its Pod IP (``--server-id $(POD_IP)``), what the
            Pod router of ``corral deploy k8s --router`` routes by.
    """

    name: str
    image: str
    port: int = 8000
    command: tuple[str, ...] | None = None
    cpu: float = 1.0
    memory: int = 2**30
    version: str = ""
    contract_version: str = ""
    environment: Mapping[str, str] = field(default_factory=dict)
    token_secret: str | None = None
    runtime_class: str | None = None
    service_account: str | None = None
    image_pull_policy: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    cpu_limit: bool = True
    drain_seconds: float | None = None
    probe_period: int = 2
    sandbox: str = "none"
    pod_ip_id: bool = False

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, not {self.sandbox!r}")
        if self.sandbox == "runtime-class" and self.runtime_class is None:
            raise ValueError(
                "sandbox='runtime-class' makes the RuntimeClass the boundary: give runtime_class"
            )

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest,
        *,
        image: str | None = None,
        serve_args: Sequence[str] = (),
        **options: Any,
    ) -> ServerTemplate:
        """The template of the environment ``manifest`` describes.

        Args:
            manifest: the environment's manifest (name, port, resources, concurrency).
            image: the image (default: the tag ``corral build`` gives it).
            serve_args: ``corral serve`` options after the manifest's own.
            options: any other field.
        """
        command = (*serve_command(manifest, "0.0.0.0", manifest.port), *serve_args)
        values: dict[str, Any] = {
            "name": manifest.name,
            "image": image or image_tag(manifest),
            "port": manifest.port,
            "command": command,
            "cpu": manifest.resources.cpu,
            "memory": manifest.resources.memory,
            "version": manifest.version,
            "contract_version": manifest.contract_version,
            **options,
        }
        return cls(**values)

    @property
    def app_name(self) -> str:
        """``corral-<name>``: the name of the fleet and the ``app.kubernetes.io/name``."""
        return dns_label(f"corral-{self.name}", 50)

    def selector(self) -> dict[str, str]:
        """The labels that select this environment's server Pods."""
        return {
            "app.kubernetes.io/name": self.app_name,
            "app.kubernetes.io/component": "env-server",
        }

    def labels(self) -> dict[str, str]:
        """Every label of this environment's objects."""
        labels = {
            **self.selector(),
            MANAGED_BY: "corral",
            ENV_LABEL: dns_label(self.name),
        }
        if self.version:
            labels["app.kubernetes.io/version"] = self.version
        if self.contract_version:
            labels[CONTRACT_LABEL] = self.contract_version
        return labels

    def resources(self) -> dict[str, dict[str, str]]:
        """Requests and limits."""
        requests = {"cpu": cpu_quantity(self.cpu), "memory": format_memory(self.memory)}
        limits = {"memory": requests["memory"]}
        if self.cpu_limit:
            limits["cpu"] = requests["cpu"]
        return {"requests": requests, "limits": limits}

    def probes(self) -> dict[str, dict[str, Any]]:
        """The readiness, liveness and startup probes of the server's container."""
        timeout = 3

        def probe(path: str) -> dict[str, Any]:
            return {"httpGet": {"path": path, "port": "http"}}

        return {
            "readinessProbe": {
                **probe("/readyz"),
                "periodSeconds": self.probe_period,
                "timeoutSeconds": timeout,
                "failureThreshold": 2,
            },
            "livenessProbe": {
                **probe("/livez"),
                "periodSeconds": 10,
                "timeoutSeconds": timeout,
                "failureThreshold": 3,
            },
            "startupProbe": {
                **probe("/livez"),
                "periodSeconds": 1,
                "timeoutSeconds": timeout,
                # Two minutes for imports and a cold page cache before liveness applies.
                "failureThreshold": 120,
            },
        }

    def env(self) -> list[dict[str, Any]]:
        """The container's environment variables."""
        values = {"CORRAL_PORT": str(self.port), "PYTHONUNBUFFERED": "1", **self.environment}
        if self.drain_seconds:
            values["CORRAL_DRAIN_SECONDS"] = f"{self.drain_seconds:g}"
        if self.sandbox == "runtime-class":
            values[ALLOW_WEAK_ENV] = "1"
        env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
        if self.pod_ip_id:
            env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        if self.token_secret is not None:
            env.append(
                {
                    "name": TOKEN_ENV,
                    "valueFrom": {"secretKeyRef": {"name": self.token_secret, "key": TOKEN_KEY}},
                }
            )
        return env

    def container(self) -> dict[str, Any]:
        """The server's container."""
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": self.image,
            "ports": [{"name": "http", "containerPort": self.port, "protocol": "TCP"}],
            "env": self.env(),
            "resources": self.resources(),
            **self.probes(),
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "privileged": False,
                "runAsNonRoot": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }
        if self.sandbox == "namespaces":
            # In the Pod's own user namespace (hostUsers: false): what these open is
            # confined to uids that are nobody on the node.
            container["securityContext"]["procMount"] = "Unmasked"
            container["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
        if self.command is not None:
            container["command"] = list(self.command)
            if self.pod_ip_id:
                # Kubernetes expands $(POD_IP) from the container's environment.
                container["command"] += ["--server-id", "$(POD_IP)"]
        if self.image_pull_policy is not None:
            container["imagePullPolicy"] = self.image_pull_policy
        return container

    def pod_spec(self, *, restart_policy: str = "Always") -> dict[str, Any]:
        """The Pod spec: the container, its volume, the Pod's security and placement."""
        spec: dict[str, Any] = {
            "containers": [self.container()],
            "restartPolicy": restart_policy,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": IMAGE_UID,
                "runAsGroup": IMAGE_UID,
                "fsGroup": IMAGE_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}],
            "terminationGracePeriodSeconds": int((self.drain_seconds or 0) + 10),
        }
        if self.runtime_class is not None:
            spec["runtimeClassName"] = self.runtime_class
        if self.sandbox == "namespaces":
            spec["hostUsers"] = False
        if self.service_account is not None:
            spec["serviceAccountName"] = self.service_account
        if self.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": s} for s in self.image_pull_secrets]
        if self.node_selector:
            spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            spec["tolerations"] = [dict(t) for t in self.tolerations]
        return spec

    def pod(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        owner_references: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """A Pod running one server that is never restarted in place.

        A restarted server has lost its sessions anyway: the provider reports the exit
        and its user (a warm pool, ``EnvPool``) starts a new server instead.
        """
        metadata: dict[str, Any] = {"name": name, "labels": {**self.labels(), **(labels or {})}}
        if annotations:
            metadata["annotations"] = dict(annotations)
        if owner_references:
            metadata["ownerReferences"] = [dict(o) for o in owner_references]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": self.pod_spec(restart_policy="Never"),
        }

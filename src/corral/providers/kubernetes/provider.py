"""Environment servers in Kubernetes Pods: one Pod per server.

    async with KubernetesProvider(namespace="rl") as provider:
        endpoint = await provider.start("path/to/my_env")     # corral-my-env:0.1.0, pushed
        async with AsyncEnvClient(endpoint.url) as env:
            ...

:class:`KubernetesProvider` creates a Pod per server from the environment's manifest
(:class:`~corral.providers.kubernetes.pods.ServerTemplate`: requests and limits, probes on
``/ready`` and ``/health``, a hardened security context, an optional RuntimeClass) and
returns once it is Ready; the watch, the verdicts, the connection modes and the cleanup
are the engine's (:mod:`corral.providers.kubernetes.base`). The Pods never restart in
place: a server that exits is reported, and its user (a ``WarmPool``, an ``EnvPool``)
starts another. Needs ``pip install 'corral[kubernetes]'``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.errors import ServerStartError
from corral.providers.base import ServerSpec, SpecLike
from corral.providers.dockerfile import URL_FILE
from corral.providers.kubernetes.api import PODS, KubeAPI
from corral.providers.kubernetes.base import KubeProvider, short_name
from corral.providers.kubernetes.pods import ServerTemplate
from corral.providers.kubernetes.status import Verdict, pod_verdict
from corral.providers.manifest import ManifestError, parse_memory


class KubernetesProvider(KubeProvider):
    """Run each environment server in a Pod of its own (see the module docstring).

    ``start(spec)`` takes an environment directory (its image is ``corral build``'s tag,
    ``corral-<name>:<version>``, unless ``image=`` says otherwise), an image tag (run
    with its own command), or, with ``image=``, an entry point served by that image.

    Args:
        image: the image to run (and, for an entry point target, the one serving it).
        port: the server's port for an image target (default: the manifest's, or 8000).
        runtime_class: a RuntimeClass for stronger isolation (``gvisor``, ``kata``).
        service_account: the Pods' service account (its token is not mounted).
        image_pull_policy: ``Always``, ``IfNotPresent`` or ``Never``.
        image_pull_secrets: Secrets to pull the image with.
        node_selector / tolerations: where the Pods may run.
        labels / annotations: extra metadata for every Pod.
        unschedulable_timeout: seconds to wait for a node before an unschedulable Pod
            fails (0: at once; give a cluster autoscaler time to add one).
        cpu_limit: limit CPU to the request (Guaranteed QoS).
        options: those of :class:`KubeProvider` (namespace, connect, kubeconfig, ...).
    """

    def __init__(
        self,
        *,
        image: str | None = None,
        port: int | None = None,
        runtime_class: str | None = None,
        service_account: str | None = None,
        image_pull_policy: str | None = None,
        image_pull_secrets: Sequence[str] = (),
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Mapping[str, Any]] = (),
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        unschedulable_timeout: float = 0.0,
        cpu_limit: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if image_pull_policy not in (None, "Always", "IfNotPresent", "Never"):
            raise ValueError(
                "image_pull_policy must be Always, IfNotPresent or Never, "
                f"not {image_pull_policy!r}"
            )
        self.image = image
        self.port = port
        self.runtime_class = runtime_class
        self.service_account = service_account
        self.image_pull_policy = image_pull_policy
        self.image_pull_secrets = tuple(image_pull_secrets)
        self.node_selector = dict(node_selector or {})
        self.tolerations = tuple(tolerations)
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self.unschedulable_timeout = unschedulable_timeout
        self.cpu_limit = cpu_limit

    def template(self, spec: SpecLike) -> ServerTemplate:
        """The Pod template of a server for ``spec``.

        Raises:
            ServerStartError: a bad manifest, or server options for an image whose
                command is unknown.
        """
        server = ServerSpec.of(spec)
        try:
            manifest = server.manifest()
        except ManifestError as exc:
            raise ServerStartError(str(exc), details={"target": server.target}) from None
        options: dict[str, Any] = {
            "environment": dict(server.environment),
            "token_secret": self.ownership.token_secret,
            "runtime_class": self.runtime_class,
            "service_account": self.service_account,
            "image_pull_policy": self.image_pull_policy,
            "image_pull_secrets": self.image_pull_secrets,
            "node_selector": self.node_selector,
            "tolerations": self.tolerations,
            "cpu_limit": self.cpu_limit,
            "probe_period": 1,
        }
        if server.cpu is not None:
            options["cpu"] = server.cpu
        if server.memory is not None:
            options["memory"] = parse_memory(server.memory)
        if manifest is not None:
            return ServerTemplate.from_manifest(
                manifest, image=self.image, serve_args=server.serve_args(), **options
            )
        port = self.port or 8000
        if self.image is not None:
            command: tuple[str, ...] | None = (
                "python", "-m", "corral", "serve", server.target, "--host", "0.0.0.0",
                "--port", str(port), "--port-file", URL_FILE, *server.serve_args(),
            )  # fmt: skip
            image = self.image
        else:
            if server.serve_args():
                raise ServerStartError(
                    f"{server.target!r} is an image whose command corral does not know, so "
                    "server options (max_sessions, idle_timeout_s, server_args) cannot be "
                    "added to it; pass the environment's directory, or image= with an "
                    "entry point",
                    details={"target": server.target},
                )
            command, image = None, server.target
        return ServerTemplate(
            name=short_name(server), image=image, port=port, command=command, **options
        )

    async def _create(self, api: KubeAPI, spec: ServerSpec, name: str) -> int:
        template = self.template(spec)
        body = template.pod(
            name,
            labels={**self.labels, **self.ownership.labels()},
            annotations=self.annotations,
            owner_references=self.ownership.owner_references,
        )
        await api.create(PODS, body)
        return template.port

    def _verdict(self, state: Mapping[str, Any] | None, waited: float) -> Verdict:
        verdict = pod_verdict(state)
        if verdict.state == "unschedulable" and waited >= self.unschedulable_timeout:
            return Verdict("failed", verdict.reason, verdict.message, verdict.hint)
        return verdict

    async def _pod_of(self, api: KubeAPI, state: Mapping[str, Any]) -> tuple[str, str]:
        name = str((state.get("metadata") or {}).get("name", ""))
        return name, str((state.get("status") or {}).get("podIP") or "")

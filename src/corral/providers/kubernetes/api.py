"""The handful of Kubernetes API calls corral makes, as plain dicts, on ``kubernetes_asyncio``.

Why ``kubernetes_asyncio`` rather than the official, blocking ``kubernetes`` client: a
provider is async-first and a warm pool or an ``EnvPool`` starts and watches many Pods
at once. With the asyncio client a watch is a coroutine reading a stream, so a cancelled
start or a closed provider ends its requests at once; the blocking client would hold an
executor thread per call and per watch until the server's timeout (the default executor
has ``cpus + 4`` threads, which the Docker provider already uses). Both clients are
generated from the same OpenAPI document, so objects have the same shape; the tests
check every rendered manifest against the official client's typed models.

Objects go in and out as the API's JSON (camelCase dicts): the verdict table
(:mod:`corral.providers.kubernetes.status`) and the renderers read and write that shape
directly, and custom resources (agent-sandbox's) have no models anyway.

:func:`connect` finds the cluster like ``kubectl`` does: in a Pod, its service account
(and namespace); elsewhere ``$KUBECONFIG`` or ``~/.kube/config`` (and the context's
namespace).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.errors import PlatformError

try:
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio import config as k8s_config
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.stream import WsApiClient
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the Kubernetes provider needs kubernetes_asyncio: pip install 'corral[kubernetes]'"
    ) from exc

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

CLAIM_GROUP = "extensions.agents.x-k8s.io"
"""The API group of agent-sandbox's SandboxClaim, SandboxWarmPool and SandboxTemplate."""
SANDBOX_GROUP = "agents.x-k8s.io"
"""The API group of agent-sandbox's Sandbox."""


class KubeError(PlatformError, RuntimeError):
    """The API refused a request.

    Attributes:
        status: the HTTP status (0: the API server could not be reached).
        reason: the API's reason (``NotFound``, ``Forbidden``, ...).
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason

    @classmethod
    def of(cls, exc: ApiException) -> KubeError:
        """The error for an ``ApiException``, with the message of the API's Status body."""
        message = str(exc.reason or "")
        reason = str(exc.reason or "")
        body = getattr(exc, "body", None)
        if body:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                status = json.loads(body)
                message = str(status.get("message") or message)
                reason = str(status.get("reason") or reason)
        return cls(int(exc.status or 0), reason, message)

    @property
    def not_found(self) -> bool:
        """The object (or the resource) does not exist."""
        return self.status == 404

    @property
    def permanent(self) -> bool:
        """Retrying will not help: unauthorized, forbidden, invalid or missing."""
        return self.status in (400, 401, 403, 404, 405, 422)


@dataclass(frozen=True)
class Kind:
    """A namespaced resource: its API group (``""`` for the core group), version, plural."""

    group: str
    version: str
    plural: str


PODS = Kind("", "v1", "pods")
SECRETS = Kind("", "v1", "secrets")
LEASES = Kind("coordination.k8s.io", "v1", "leases")


def claims(version: str = "v1beta1") -> Kind:
    """agent-sandbox's SandboxClaims, in ``version``."""
    return Kind(CLAIM_GROUP, version, "sandboxclaims")


def warm_pools(version: str = "v1beta1") -> Kind:
    """agent-sandbox's SandboxWarmPools, in ``version``."""
    return Kind(CLAIM_GROUP, version, "sandboxwarmpools")


def sandboxes(version: str = "v1beta1") -> Kind:
    """agent-sandbox's Sandboxes, in ``version``."""
    return Kind(SANDBOX_GROUP, version, "sandboxes")


@dataclass(frozen=True)
class ClusterAccess:
    """How to reach the cluster again (from another process, e.g. the guardian's sweep).

    Attributes:
        kubeconfig: the kubeconfig file (None: the default lookup).
        context: the kubeconfig context (None: the current one).
        server: an API server URL reached without credentials (a test emulator).
        in_cluster: the service account of the Pod this runs in.
    """

    kubeconfig: str | None = None
    context: str | None = None
    server: str | None = None
    in_cluster: bool = False

    def arguments(self) -> list[str]:
        """The options of ``python -m corral.providers.kubernetes.gc`` that reproduce it."""
        if self.server is not None:
            return ["--server", self.server]
        if self.in_cluster:
            return ["--in-cluster"]
        args: list[str] = []
        if self.kubeconfig is not None:
            args += ["--kubeconfig", self.kubeconfig]
        if self.context is not None:
            args += ["--context", self.context]
        return args


class KubeAPI:
    """An API client bound to one namespace (see the module docstring).

    Use :func:`connect` to make one; :meth:`close` it when done.
    """

    def __init__(self, api_client: k8s.ApiClient, namespace: str, access: ClusterAccess) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.access = access
        self._core = k8s.CoreV1Api(api_client)
        self._leases = k8s.CoordinationV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._ws: WsApiClient | None = None

    async def close(self) -> None:
        """Close the HTTP sessions."""
        if self._ws is not None:
            await self._ws.close()
            self._ws = None
        await self.api_client.close()

    def _dict(self, obj: Any) -> dict[str, Any]:
        data = self.api_client.sanitize_for_serialization(obj)
        return data if isinstance(data, dict) else {}

    # ------------------------------------------------------------------ objects

    async def create(self, kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object in the namespace; return it as the API stored it."""
        ns = self.namespace
        # The generated methods take models or their JSON alike.
        payload: Any = {**body, "metadata": {**(body.get("metadata") or {}), "namespace": ns}}
        try:
            if kind == PODS:
                created: Any = await self._core.create_namespaced_pod(ns, payload)
            elif kind == SECRETS:
                created = await self._core.create_namespaced_secret(ns, payload)
            elif kind == LEASES:
                created = await self._leases.create_namespaced_lease(ns, payload)
            else:
                created = await self._custom.create_namespaced_custom_object(
                    kind.group, kind.version, ns, kind.plural, payload
                )
        except ApiException as exc:
            raise KubeError.of(exc) from None
        return self._dict(created)

    async def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        """An object by name, or None if it does not exist."""
        ns = self.namespace
        try:
            if kind == PODS:
                found: Any = await self._core.read_namespaced_pod(name, ns)
            elif kind == LEASES:
                found = await self._leases.read_namespaced_lease(name, ns)
            else:
                found = await self._custom.get_namespaced_custom_object(
                    kind.group, kind.version, ns, kind.plural, name
                )
        except ApiException as exc:
            error = KubeError.of(exc)
            if error.not_found:
                return None
            raise error from None
        return self._dict(found)

    async def delete(self, kind: Kind, name: str, *, grace_seconds: int | None = None) -> bool:
        """Delete an object; False when it was already gone."""
        ns = self.namespace
        body: Any = {"gracePeriodSeconds": grace_seconds} if grace_seconds is not None else None
        try:
            if kind == PODS:
                await self._core.delete_namespaced_pod(name, ns, body=body)
            elif kind == SECRETS:
                await self._core.delete_namespaced_secret(name, ns, body=body)
            elif kind == LEASES:
                await self._leases.delete_namespaced_lease(name, ns, body=body)
            else:
                await self._custom.delete_namespaced_custom_object(
                    kind.group, kind.version, ns, kind.plural, name, body=body
                )
        except ApiException as exc:
            error = KubeError.of(exc)
            if error.not_found:
                return False
            raise error from None
        return True

    async def patch(self, kind: Kind, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Merge ``body`` into an object."""
        ns = self.namespace
        payload: Any = dict(body)
        try:
            if kind == LEASES:
                patched: Any = await self._leases.patch_namespaced_lease(name, ns, payload)
            elif kind == PODS:
                patched = await self._core.patch_namespaced_pod(name, ns, payload)
            else:
                patched = await self._custom.patch_namespaced_custom_object(
                    kind.group, kind.version, ns, kind.plural, name, payload
                )
        except ApiException as exc:
            raise KubeError.of(exc) from None
        return self._dict(patched)

    async def list(self, kind: Kind, selector: str = "") -> list[dict[str, Any]]:
        """The objects of ``kind`` whose labels match ``selector``.

        The labels are checked here too: an emulator may not apply selectors.
        """
        ns = self.namespace
        try:
            if kind == PODS:
                found: Any = await self._core.list_namespaced_pod(ns, label_selector=selector)
            elif kind == SECRETS:
                found = await self._core.list_namespaced_secret(ns, label_selector=selector)
            elif kind == LEASES:
                found = await self._leases.list_namespaced_lease(ns, label_selector=selector)
            else:
                found = await self._custom.list_namespaced_custom_object(
                    kind.group, kind.version, ns, kind.plural, label_selector=selector
                )
        except ApiException as exc:
            raise KubeError.of(exc) from None
        items = self._dict(found).get("items") or []
        return [item for item in items if isinstance(item, dict) and matches(item, selector)]

    # ------------------------------------------------------------------ streams

    async def watch(
        self, kind: Kind, selector: str = ""
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """``(event type, object)`` for every change of the matching objects, forever.

        It starts with an ``ADDED`` event per existing object (a watch without a resource
        version does), resumes from the last resource version when the server ends the
        stream, and starts over when that version is too old (410 Gone). Bookmarks are
        consumed here.

        Raises:
            KubeError: the API refused the watch.
        """
        version: str | None = None
        while True:
            response = await self._open_watch(kind, selector, version)
            gone = False
            try:
                if response.status == 410:
                    version = None
                    continue
                if response.status >= 300:
                    text = await response.text()
                    raise KubeError(response.status, response.reason or "", text.strip())
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind_of = str(event.get("type", ""))
                    obj = event.get("object") or {}
                    if kind_of == "ERROR":
                        if obj.get("code") == 410:
                            gone = True
                            break
                        raise KubeError(
                            int(obj.get("code") or 500),
                            str(obj.get("reason") or ""),
                            str(obj.get("message") or ""),
                        )
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv and rv != "...":
                        version = str(rv)
                    if kind_of == "BOOKMARK" or not matches(obj, selector):
                        continue
                    yield kind_of, obj
            finally:
                response.close()
            if gone:
                version = None

    async def _open_watch(self, kind: Kind, selector: str, version: str | None) -> Any:
        # Lowercase, as kubectl sends them: the client would send "True".
        options: dict[str, Any] = {
            "label_selector": selector,
            "watch": "true",
            "allow_watch_bookmarks": "true",
            "_preload_content": False,
        }
        if version is not None:
            options["resource_version"] = version
        try:
            if kind == PODS:
                return await self._core.list_namespaced_pod(self.namespace, **options)
            return await self._custom.list_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural, **options
            )
        except ApiException as exc:
            raise KubeError.of(exc) from None

    async def pod_log(self, name: str, *, lines: int = 50, previous: bool = False) -> str:
        """The server container's last ``lines`` lines ("" when there are none yet)."""
        try:
            text = await self._core.read_namespaced_pod_log(
                name,
                self.namespace,
                container="server",
                tail_lines=lines,
                previous=previous,
            )
        except ApiException:
            return ""
        return str(text).rstrip()

    async def portforward(self, name: str, port: int) -> Any:
        """A port-forward WebSocket to ``port`` of Pod ``name`` (an async context manager).

        The socket speaks ``v4.channel.k8s.io`` (see
        :mod:`corral.providers.kubernetes.portforward`).
        """
        if self._ws is None:
            self._ws = WsApiClient(self.api_client.configuration)
        core = k8s.CoreV1Api(self._ws)
        return await core.connect_get_namespaced_pod_portforward(
            name, self.namespace, ports=port, _preload_content=False
        )


def matches(obj: Mapping[str, Any], selector: str) -> bool:
    """``obj``'s labels satisfy ``selector`` (``k=v``, ``k!=v``, ``k`` and ``!k`` terms)."""
    labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.strip().rstrip("=")) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def in_cluster() -> bool:
    """This process runs in a Pod with a service account."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and SERVICE_ACCOUNT_NAMESPACE.exists()


async def connect(
    *,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    configuration: k8s.Configuration | None = None,
) -> KubeAPI:
    """An API client for the cluster (see the module docstring).

    Args:
        namespace: the namespace (default: the Pod's, the context's, else ``default``).
        kubeconfig: a kubeconfig file (default: ``$KUBECONFIG`` or ``~/.kube/config``).
        context: a kubeconfig context (default: the current one).
        configuration: a ready client configuration (then nothing is loaded).

    Raises:
        KubeError: no configuration was found (status 0; the message says where it looked).
    """
    access: ClusterAccess
    if configuration is not None:
        has_credentials = bool(
            configuration.api_key or configuration.cert_file or configuration.username
        )
        access = ClusterAccess(server=None if has_credentials else configuration.host)
        found_namespace = None
    elif kubeconfig is None and context is None and in_cluster():
        configuration = k8s.Configuration()
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
        access = ClusterAccess(in_cluster=True)
        found_namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    else:
        configuration = k8s.Configuration()
        try:
            await k8s_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
            contexts, current = k8s_config.list_kube_config_contexts(config_file=kubeconfig)
        except (k8s_config.ConfigException, OSError) as exc:
            raise KubeError(
                0,
                "NoConfiguration",
                f"no Kubernetes configuration found ({exc}); outside a cluster, point "
                "$KUBECONFIG (or kubeconfig=) at a kubeconfig file",
            ) from None
        chosen = next((c for c in contexts if c.get("name") == context), current)
        found_namespace = (chosen or {}).get("context", {}).get("namespace")
        access = ClusterAccess(kubeconfig=kubeconfig, context=context)
    api_client = k8s.ApiClient(configuration)
    return KubeAPI(api_client, namespace or found_namespace or "default", access)

"""The engine shared by the Kubernetes providers: watch, verdicts, connections, cleanup.

A provider creates one object per server (a Pod, or a SandboxClaim of a warm pool) and
returns once it is Ready. Readiness is awaited by **one watch** over the provider's
objects, never by polling: every event goes through the verdict table
(:mod:`corral.providers.kubernetes.status`), so a server that cannot start
(``ImagePullBackOff``, ``CrashLoopBackOff``, ``OOMKilled``, unschedulable) fails its
start at once, with the reason, the kubelet's message, a hint and the container's last
log lines. The same watch answers :meth:`KubeProvider.alive` without an API call.

**Connection modes** (``connect=``): ``"in-cluster"`` reaches the Pod IP (the trainer runs
in the cluster); ``"port-forward"`` tunnels through the API server to ``127.0.0.1`` (a
laptop; :mod:`corral.providers.kubernetes.portforward`); ``"url"`` formats ``url=``
(``"https://envs.example.com/{name}"``, with ``{name}``, ``{namespace}``, ``{ip}``,
``{port}``) for a server behind an ingress; ``"auto"`` (default) is in-cluster inside a
Pod and port-forward elsewhere.

**Cleanup** is the owner's (:mod:`corral.providers.kubernetes.owner`): stop, close,
context exit, interpreter exit, the guardian, and ``corral k8s gc`` for a dead machine.

A provider belongs to the event loop it first starts a server on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes_asyncio import client as k8s

from corral.errors import ServerStartError
from corral.providers.base import Endpoint, Provider, ServerSpec, SpecLike
from corral.providers.kubernetes.api import PODS, Kind, KubeAPI, KubeError, connect, in_cluster
from corral.providers.kubernetes.owner import Ownership
from corral.providers.kubernetes.pods import dns_label
from corral.providers.kubernetes.portforward import PortForward
from corral.providers.kubernetes.rbac import Mode
from corral.providers.kubernetes.status import Verdict
from corral.providers.manifest import ManifestError
from corral.runtime import wait_event

log = logging.getLogger("corral.providers.kubernetes")

Connect = Literal["auto", "in-cluster", "port-forward", "url"]


@dataclass(frozen=True)
class KubernetesEndpoint(Endpoint):
    """A server in a Pod.

    Attributes:
        pod: the Pod's name.
        namespace: its namespace.
        pod_ip: its IP in the cluster.
        claim: the SandboxClaim that holds it (agent-sandbox mode), else "".
    """

    pod: str = ""
    namespace: str = ""
    pod_ip: str = ""
    claim: str = ""

    @property
    def id(self) -> str:
        """``namespace/name`` of the Pod (or of the claim)."""
        return f"{self.namespace}/{self.claim or self.pod}"


@dataclass(eq=False)
class _Record:
    """What the provider knows of one object it created."""

    name: str
    state: dict[str, Any] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    endpoint: KubernetesEndpoint | None = None
    forward: PortForward | None = None
    logs: str = ""
    gone: bool = False


class KubeProvider(Provider):
    """The engine shared by the Kubernetes providers (see the module docstring).

    Subclasses say what they create per server (:meth:`_create`), how to judge it
    (:meth:`_verdict`), where its Pod is (:meth:`_pod_of`) and what to delete
    (:attr:`_kind`).

    Args:
        namespace: where to create objects (default: the Pod's, the kubeconfig
            context's, else ``default``).
        connect: ``"auto"``, ``"in-cluster"``, ``"port-forward"`` or ``"url"``.
        url: with ``connect="url"``: a template (``{name}``, ``{namespace}``, ``{ip}``,
            ``{port}``) or a function of the endpoint's Pod.
        kubeconfig / context: the kubeconfig file and context (default: the usual lookup).
        configuration: a ready ``kubernetes_asyncio`` client configuration instead.
        startup_timeout: seconds a server may take to become Ready (pull included).
        log_lines: a failed server's last log lines quoted in its error.
        lease_seconds: the owner Lease's duration; it is renewed every third of it.
        guard: have the process's guardian sweep this provider's objects if the
            process is killed.
        token: the bearer token servers require (default: ``$CORRAL_TOKEN``); the
            provider stores it in a Secret of its own that the Pods read.
    """

    kind = "kubernetes"
    mode: Mode = "pods"
    """What the provider creates (see :mod:`corral.providers.kubernetes.rbac`)."""
    _kind: Kind = PODS

    def __init__(
        self,
        *,
        namespace: str | None = None,
        connect: Connect = "auto",
        url: str | Callable[[KubernetesEndpoint], str] | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        configuration: k8s.Configuration | None = None,
        startup_timeout: float = 300.0,
        log_lines: int = 50,
        lease_seconds: float = 60.0,
        guard: bool = True,
        token: str | None = None,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout, token=token)
        if connect not in ("auto", "in-cluster", "port-forward", "url"):
            raise ValueError(
                f"connect must be 'auto', 'in-cluster', 'port-forward' or 'url', not {connect!r}"
            )
        if (connect == "url") != (url is not None):
            raise ValueError("connect='url' needs url=, and url= needs connect='url'")
        if lease_seconds < 15:
            raise ValueError(f"lease_seconds must be at least 15, got {lease_seconds:g}")
        self.namespace = namespace
        self.connect = connect
        self.url = url
        self.kubeconfig = kubeconfig
        self.context = context
        self.configuration = configuration
        self.log_lines = log_lines
        self.ownership = Ownership(
            lease_seconds=lease_seconds,
            guard=guard,
            token=self.token,
            mode=self.mode,
            kind=self._kind,
        )
        self._api: KubeAPI | None = None
        self._opening: asyncio.Lock | None = None
        self._records: dict[str, _Record] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._watch_error: KubeError | None = None

    # ------------------------------------------------------------------ session

    @property
    def api(self) -> KubeAPI:
        """The API client (after the first start)."""
        if self._api is None:
            raise RuntimeError("the provider is not connected yet: start a server first")
        return self._api

    @property
    def owner(self) -> str:
        """This provider's id: the value of the owner label on what it creates."""
        return self.ownership.owner

    async def _session(self) -> KubeAPI:
        """Connect, take the owner Lease, store the token, start the watch (once)."""
        if self._api is not None:
            return self._api
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._api is not None:
                return self._api
            try:
                api = await connect(
                    namespace=self.namespace,
                    kubeconfig=self.kubeconfig,
                    context=self.context,
                    configuration=self.configuration,
                )
            except KubeError as exc:
                raise ServerStartError(str(exc), details={"reason": exc.reason}) from None
            try:
                await self.ownership.take(api, self)
            except KubeError as exc:
                await api.close()
                raise ServerStartError(
                    f"cannot create the owner Lease in namespace {api.namespace!r}: {exc}",
                    details={"namespace": api.namespace, "status": exc.status},
                ) from None
            self._tasks = [
                asyncio.create_task(self._watch(api), name="corral-k8s-watch"),
                asyncio.create_task(self.ownership.renew_forever(api), name="corral-k8s-lease"),
            ]
            self._api = api
            return api

    async def _watch(self, api: KubeAPI) -> None:
        """Follow every object of this provider; wake whoever waits on one that changed."""
        delay = 0.5
        while True:
            try:
                async for event, obj in api.watch(self._kind, self.ownership.selector):
                    delay = 0.5
                    name = str((obj.get("metadata") or {}).get("name", ""))
                    record = self._records.get(name)
                    if record is None:
                        continue
                    record.state = None if event == "DELETED" else obj
                    record.gone = event == "DELETED"
                    record.changed.set()
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                if exc.permanent:
                    # Forbidden to watch: nothing will ever be seen; fail the waiters now.
                    self._watch_error = exc
                    for record in self._records.values():
                        record.changed.set()
                    return
                log.warning("watch of %s failed (%s); watching again", self._kind.plural, exc)
            except Exception as exc:
                log.warning("watch of %s failed (%s); watching again", self._kind.plural, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    # ------------------------------------------------------------------ subclass hooks

    @abstractmethod
    async def _create(self, api: KubeAPI, spec: ServerSpec, name: str) -> int:
        """Create the object for ``spec`` named ``name``; return the server's port."""

    @abstractmethod
    def _verdict(self, state: Mapping[str, Any] | None, waited: float) -> Verdict:
        """What the object's state says, ``waited`` seconds after it was created."""

    @abstractmethod
    async def _pod_of(self, api: KubeAPI, state: Mapping[str, Any]) -> tuple[str, str]:
        """``(Pod name, Pod IP)`` of a ready object."""

    def _name(self, spec: ServerSpec) -> str:
        """A fresh object name for a server of ``spec``."""
        return f"corral-{dns_label(short_name(spec), 40)}-{secrets.token_hex(4)}"

    # ------------------------------------------------------------------ starting

    async def start(self, spec: SpecLike) -> KubernetesEndpoint:
        """Create a server for ``spec`` and return once it answers ``/ready``.

        Raises:
            ServerStartError: the object could not be created, its Pod failed (with the
                reason, the kubelet's message, a hint and the last log lines), or it was
                not ready within the startup timeout; nothing is left behind.
        """
        self._check_open()
        server = ServerSpec.of(spec)
        api = await self._session()
        name = self._name(server)
        record = _Record(name)
        self._records[name] = record
        try:
            try:
                port = await self._create(api, server, name)
            except KubeError as exc:
                raise ServerStartError(
                    f"the cluster refused to create {self._kind.plural} {name!r} in namespace "
                    f"{api.namespace!r}: {exc}",
                    details={"name": name, "namespace": api.namespace, "status": exc.status},
                ) from None
            timeout = server.startup_timeout or self.startup_timeout
            state = await self._wait(record, timeout)
            pod, ip = await self._pod_of(api, state)
            endpoint = await self._reach(api, record, pod, ip, port)
            remaining = max(5.0, timeout)
            await self.wait_ready(endpoint, remaining)
        except BaseException:
            await asyncio.shield(self._discard(record))
            raise
        if self.closed:
            await self._discard(record)
            self._check_open()
        return endpoint

    async def _wait(self, record: _Record, timeout: float) -> dict[str, Any]:
        """Wait for ``record``'s verdict to be ready; raise its failure at once."""
        started = time.monotonic()
        while True:
            waited = time.monotonic() - started
            if self._watch_error is not None:
                raise ServerStartError(
                    f"cannot watch {self._kind.plural} in namespace {self.api.namespace!r}: "
                    f"{self._watch_error}",
                    details={"status": self._watch_error.status},
                )
            if record.state is None and not record.gone:
                verdict = Verdict("pending", "created, not seen by the watch yet")
            else:
                verdict = self._verdict(record.state, waited)
            if verdict.state == "ready" and record.state is not None:
                return record.state
            if verdict.done:
                raise await self._failed(record, verdict)
            if waited >= timeout:
                raise await self._failed(
                    record,
                    Verdict(
                        "failed",
                        f"not ready within {timeout:g} s",
                        f"last seen: {verdict.describe()}",
                    ),
                )
            record.changed.clear()
            # The unschedulable grace needs a wake-up without an event.
            wake = min(timeout - waited, 1.0) if verdict.state == "unschedulable" else None
            await wait_event(record.changed, wake or timeout - waited)

    async def _failed(self, record: _Record, verdict: Verdict) -> ServerStartError:
        output = ""
        pod = None
        if record.state is not None:
            with contextlib.suppress(Exception):
                pod = (await self._pod_of(self.api, record.state))[0]
        if pod:
            output = await self.api.pod_log(
                pod, lines=self.log_lines, previous=verdict.previous_logs
            )
            record.logs = output
        where = f"{self._kind.plural[:-1]} {self.api.namespace}/{record.name}"
        return ServerStartError(
            f"{where} failed to start: {verdict.describe()}"
            + (f"; last log lines:\n{output}" if output else ""),
            details={
                "name": record.name,
                "namespace": self.api.namespace,
                "reason": verdict.reason,
                "message": verdict.message,
                "output": output,
            },
        )

    async def _reach(
        self, api: KubeAPI, record: _Record, pod: str, ip: str, port: int
    ) -> KubernetesEndpoint:
        mode = self.connect
        if mode == "auto":
            mode = "in-cluster" if in_cluster() else "port-forward"
        shown = f"[{ip}]" if ":" in ip else ip
        claim = record.name if self._kind != PODS else ""
        endpoint = KubernetesEndpoint(
            url=f"http://{shown}:{port}",
            host=ip,
            port=port,
            pod=pod,
            namespace=api.namespace,
            pod_ip=ip,
            claim=claim,
        )
        if mode == "port-forward":
            record.forward = PortForward(api, pod, port)
            url = await record.forward.start()
            endpoint = _with_url(endpoint, url, "127.0.0.1", record.forward.local_port)
        elif mode == "url":
            assert self.url is not None
            url = (
                self.url(endpoint)
                if callable(self.url)
                else self.url.format(name=pod, namespace=api.namespace, ip=ip, port=port)
            )
            endpoint = _with_url(endpoint, url.rstrip("/"), endpoint.host, endpoint.port)
        record.endpoint = endpoint
        return endpoint

    # ------------------------------------------------------------------ stopping

    async def _discard(self, record: _Record) -> None:
        """Forget ``record``, close its tunnel and delete its object (errors logged)."""
        self._records.pop(record.name, None)
        if record.forward is not None:
            await record.forward.close()
        if self._api is not None:
            try:
                await self._api.delete(self._kind, record.name, grace_seconds=5)
            except KubeError as exc:
                log.warning("cannot delete %s %s: %s", self._kind.plural, record.name, exc)

    def _record_of(self, endpoint: Endpoint) -> _Record | None:
        if not isinstance(endpoint, KubernetesEndpoint):
            return None
        return self._records.get(endpoint.claim or endpoint.pod)

    async def stop(self, endpoint: Endpoint) -> None:
        """Delete a server's object (no error if it is already gone)."""
        record = self._record_of(endpoint)
        if record is not None:
            await self._discard(record)

    async def alive(self, endpoint: Endpoint) -> bool:
        """The server's Pod is ready, as the watch last saw it (no API call)."""
        record = self._record_of(endpoint)
        if record is None or record.gone:
            return False
        return self._verdict(record.state, 0.0).state == "ready"

    def logs(self, endpoint: Endpoint, lines: int = 50) -> str:
        """The last log lines fetched for the server (see :meth:`fetch_logs`)."""
        record = self._record_of(endpoint)
        if record is None:
            return ""
        return "\n".join(record.logs.splitlines()[-lines:])

    async def fetch_logs(self, endpoint: Endpoint, lines: int = 50) -> str:
        """The server container's last ``lines`` log lines, read from the API now."""
        if not isinstance(endpoint, KubernetesEndpoint) or self._api is None:
            return ""
        text = await self._api.pod_log(endpoint.pod, lines=lines)
        record = self._record_of(endpoint)
        if record is not None:
            record.logs = text
        return text

    @property
    def endpoints(self) -> list[Endpoint]:
        """The servers started and not stopped."""
        return [r.endpoint for r in self._records.values() if r.endpoint is not None]

    async def close(self) -> None:
        """Delete every object this provider created, its Secret and its Lease."""
        self._closed = True
        await asyncio.gather(
            *(self._discard(r) for r in list(self._records.values())), return_exceptions=True
        )
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        api, self._api = self._api, None
        if api is None:
            return
        try:
            await self.ownership.release(api)
        finally:
            await api.close()


def _with_url(endpoint: KubernetesEndpoint, url: str, host: str, port: int) -> KubernetesEndpoint:
    return KubernetesEndpoint(
        url=url,
        host=host,
        port=port,
        pod=endpoint.pod,
        namespace=endpoint.namespace,
        pod_ip=endpoint.pod_ip,
        claim=endpoint.claim,
    )


def short_name(spec: ServerSpec) -> str:
    """A short name for the servers of ``spec``: the manifest's, the class's or the image's."""
    try:
        manifest = spec.manifest()
    except ManifestError:
        manifest = None
    if manifest is not None:
        return manifest.name
    target = spec.target.rstrip("/")
    if ":" in target and "/" not in target.split(":", 1)[1]:
        head, tail = target.rsplit(":", 1)
        # module:Class names the class; repository:tag names the repository.
        return tail if "." in head and tail[:1].isupper() else head.rsplit("/", 1)[-1]
    return target.rsplit("/", 1)[-1]

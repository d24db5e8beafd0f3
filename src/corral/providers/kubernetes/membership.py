"""A fleet's members from its Service's EndpointSlices, followed by one watch.

``fleet_urls`` (:mod:`corral.providers.kubernetes.fleet`) resolves the headless Service
once; a running pool then never hears of a Pod the autoscaler added, and keeps dialling
one that is gone. :class:`EndpointSliceFleet` follows the Service's EndpointSlices (the
objects the control plane keeps in step with the Pods' readiness) through one watch,
and answers the membership interface of the client (``client/membership.py``): ``await
urls()`` is the ready Pods' URLs now, at no API call after the first::

    async with EndpointSliceFleet("corral-echo-pods", namespace="rl") as members:
        urls = await members.urls()         # ['http://10.1.2.3:8000', ...]

A Pod that fails its readiness probe or starts terminating (a drain, a scale-down) leaves
the list at the next event; a new ready Pod joins it. The watch restarts when its stream
ends; a refusal (403: see ``corral k8s role --mode fleet``, list and watch of
``endpointslices``) is raised by the next ``urls()``.

Runs where the trainer can reach Pod IPs (in the cluster). Needs ``corral[kubernetes]``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from kubernetes_asyncio import client as k8s

from corral import runtime
from corral.providers.kubernetes.api import Kind, KubeAPI, KubeError, connect

log = logging.getLogger("corral.providers.kubernetes")

ENDPOINT_SLICES = Kind("discovery.k8s.io", "v1", "endpointslices")
SERVICE_LABEL = "kubernetes.io/service-name"
"""The label that ties an EndpointSlice to its Service."""


def slice_urls(endpoint_slice: Mapping[str, Any], port: str | int, scheme: str) -> list[str]:
    """The URLs of the ready, not terminating endpoints of one EndpointSlice.

    ``port`` is the Service port's name (``"http"``) or number. A ``ready`` condition
    that is absent counts as ready, as the API defines it.
    """
    numbers = [
        p.get("port")
        for p in endpoint_slice.get("ports") or []
        if port in (p.get("name"), p.get("port")) or len(endpoint_slice.get("ports") or []) == 1
    ]
    if not numbers or numbers[0] is None:
        return []
    number = int(numbers[0])
    found = []
    for endpoint in endpoint_slice.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready") is False or conditions.get("terminating") is True:
            continue
        for address in (endpoint.get("addresses") or [])[:1]:
            host = f"[{address}]" if ":" in str(address) else str(address)
            found.append(f"{scheme}://{host}:{number}")
    return found


class EndpointSliceFleet:
    """The ready Pods of a Service, kept current by a watch (see the module docstring).

    Args:
        service: the Service's name (``corral deploy k8s`` renders ``<name>-pods``).
        namespace: its namespace (default: the Pod's or the kubeconfig context's).
        port: the Service port's name or number (``"http"``).
        scheme: ``http`` or ``https``.
        kubeconfig / context / configuration: how to reach the API (as the providers).
    """

    def __init__(
        self,
        service: str,
        *,
        namespace: str | None = None,
        port: str | int = "http",
        scheme: str = "http",
        kubeconfig: str | None = None,
        context: str | None = None,
        configuration: k8s.Configuration | None = None,
    ) -> None:
        self.service = service
        self.namespace = namespace
        self.port = port
        self.scheme = scheme
        self._connect = functools.partial(
            connect,
            namespace=namespace,
            kubeconfig=kubeconfig,
            context=context,
            configuration=configuration,
        )
        self._api: KubeAPI | None = None
        self._slices: dict[str, list[str]] = {}
        self._task: asyncio.Task[None] | None = None
        self._error: KubeError | None = None
        self._starting: asyncio.Lock | None = None
        self.changed = asyncio.Event()
        """Set at every change of the membership (cleared by whoever waits on it)."""

    @property
    def selector(self) -> str:
        return f"{SERVICE_LABEL}={self.service}"

    async def urls(self) -> list[str]:
        """The URLs of the ready Pods, sorted (the first call lists and starts the watch).

        Raises:
            KubeError: the API refused to list or watch the EndpointSlices.
        """
        await self._start()
        if self._error is not None:
            raise self._error
        return sorted({url for urls in self._slices.values() for url in urls})

    async def _start(self) -> None:
        if self._task is not None:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._task is not None:
                return
            api = self._api or await self._connect()
            self._api = api
            for found in await api.list(ENDPOINT_SLICES, self.selector):
                self._update("ADDED", found)
            self._task = asyncio.create_task(self._follow(api), name="corral-endpointslices")

    def _update(self, event: str, endpoint_slice: Mapping[str, Any]) -> None:
        name = str((endpoint_slice.get("metadata") or {}).get("name", ""))
        before = self._slices.get(name)
        if event == "DELETED":
            self._slices.pop(name, None)
        else:
            self._slices[name] = slice_urls(endpoint_slice, self.port, self.scheme)
        if self._slices.get(name) != before:
            self.changed.set()

    async def _follow(self, api: KubeAPI) -> None:
        delay = 0.5
        while True:
            try:
                async for event, found in api.watch(ENDPOINT_SLICES, self.selector):
                    delay = 0.5
                    self._update(event, found)
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                if exc.permanent:
                    self._error = exc
                    self.changed.set()
                    return
                log.warning("watch of the EndpointSlices of %s failed (%s)", self.service, exc)
            except Exception as exc:
                log.warning("watch of the EndpointSlices of %s failed (%s)", self.service, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def close(self) -> None:
        """Stop the watch and close the API client."""
        if self._task is not None:
            self._task.cancel()
            await runtime.reap(self._task)
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def __aenter__(self) -> EndpointSliceFleet:
        await self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

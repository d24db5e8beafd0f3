"""Scale-down prefers idle Pods: ``controller.kubernetes.io/pod-deletion-cost`` kept in step
with each server's active sessions.

When a Deployment shrinks (the autoscaler, a rollout's old ReplicaSet), its ReplicaSet
deletes the Pods of lowest deletion cost first. :class:`DeletionCostKeeper` sets each
ready server Pod's cost to its count of active sessions (``/ready``'s
``active_sessions``), so the Pods that go are those holding the fewest sessions, and an
idle one before any busy one.

**Who patches, with which rights.** The keeper runs apart from the servers (a trainer's
task, or ``corral k8s deletion-cost`` as a small Deployment of its own): the servers' Pods
run agents' code and get no API token (``automountServiceAccountToken: false``). Its Role
(``corral k8s role --mode deletion-cost``) is list and patch of Pods in the namespace:
Pods are named by their ReplicaSet at random, so ``resourceNames`` cannot narrow it. It
reads ``/ready`` with the fleet's bearer token, and patches only the one annotation, only
when the count changed since the last round (one list per round, one patch per changed
Pod). Kubernetes reads the annotation as best effort (it is not a guarantee, and it costs
the API server a write per change: keep ``interval`` at seconds, not milliseconds).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from typing import Any

import httpx
from kubernetes_asyncio import client as k8s

from corral.auth import bearer_header
from corral.providers.kubernetes.api import PODS, KubeAPI, KubeError, connect

log = logging.getLogger("corral.providers.kubernetes")

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return bool(status.get("podIP")) and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _port(pod: Mapping[str, Any]) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "http":
                return int(port["containerPort"])
    return None


class DeletionCostKeeper:
    """Keeps the deletion cost of a fleet's Pods at their active sessions (module docstring).

    Args:
        selector: the label selector of the fleet's server Pods
            (``app.kubernetes.io/name=corral-<name>``).
        token: the servers' bearer token (None: they require none).
        interval: seconds between rounds of :meth:`run_forever`.
        namespace / kubeconfig / context / configuration: how to reach the API.
    """

    def __init__(
        self,
        selector: str,
        *,
        token: str | None = None,
        interval: float = 10.0,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        configuration: k8s.Configuration | None = None,
    ) -> None:
        self.selector = selector
        self.token = token
        self.interval = interval
        self._connect = functools.partial(
            connect,
            namespace=namespace,
            kubeconfig=kubeconfig,
            context=context,
            configuration=configuration,
        )
        self._api: KubeAPI | None = None

    async def _sessions(self, http: httpx.AsyncClient, pod: Mapping[str, Any]) -> int | None:
        port = _port(pod)
        ip = str(pod["status"]["podIP"])
        host = f"[{ip}]" if ":" in ip else ip
        headers = bearer_header(self.token) if self.token is not None else {}
        try:
            reply = await http.get(f"http://{host}:{port}/ready", headers=headers)
            active = reply.json().get("active_sessions")
        except (httpx.HTTPError, ValueError, AttributeError):
            return None  # unreachable or draining: its cost stays as it was
        return int(active) if isinstance(active, int) else None

    async def sync_once(self) -> dict[str, int]:
        """One round: read every ready Pod's sessions, patch the costs that changed.

        Returns:
            ``{pod name: cost}`` of the Pods patched in this round.

        Raises:
            KubeError: the API refused to list or patch.
        """
        if self._api is None:
            self._api = await self._connect()
        api = self._api
        pods = [p for p in await api.list(PODS, self.selector) if _ready(p) and _port(p)]
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
            counts = await asyncio.gather(*(self._sessions(http, p) for p in pods))
        patched: dict[str, int] = {}
        for pod, count in zip(pods, counts, strict=True):
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if count is None or annotations.get(ANNOTATION) == str(count):
                continue
            name = str(pod["metadata"]["name"])
            await api.patch(PODS, name, {"metadata": {"annotations": {ANNOTATION: str(count)}}})
            patched[name] = count
        return patched

    async def run_forever(self) -> None:
        """Sync every ``interval`` seconds until cancelled (a refused call is logged)."""
        while True:
            try:
                await self.sync_once()
            except KubeError as exc:
                log.warning("cannot keep the pod deletion costs of %s: %s", self.selector, exc)
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        """Close the API client."""
        if self._api is not None:
            await self._api.close()
            self._api = None

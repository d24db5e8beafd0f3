"""Environment servers on Kubernetes: Pods per server, warm claims, fleet manifests.

* :class:`KubernetesProvider` (:mod:`.provider`): a Pod per server, on the engine of
  :mod:`.base` (readiness by watch, failures reported at once, in-cluster /
  port-forward / URL connections) and the cleanup of :mod:`.owner`.
* :class:`AgentSandboxProvider` (:mod:`.claims`): claims warm Pods from a
  ``SandboxWarmPool`` of kubernetes-sigs/agent-sandbox.
* :mod:`.pods`: the server's Pod (shared by the providers and ``corral deploy k8s``).
* :mod:`.manifests`: the long-lived fleet ``corral deploy k8s`` renders.
* :mod:`.gc`: ``corral k8s gc``, the sweep of what dead providers left.

The providers need ``pip install 'corral[kubernetes]'`` (``kubernetes_asyncio``); the
Pod template and the manifests need nothing beyond corral, so they are imported from
their modules and this package imports no client eagerly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.providers.kubernetes.base import KubernetesEndpoint
    from corral.providers.kubernetes.claims import AgentSandboxProvider
    from corral.providers.kubernetes.provider import KubernetesProvider

__all__ = ["AgentSandboxProvider", "KubernetesEndpoint", "KubernetesProvider"]


def __getattr__(name: str) -> Any:
    if name == "AgentSandboxProvider":
        from corral.providers.kubernetes.claims import AgentSandboxProvider

        return AgentSandboxProvider
    if name == "KubernetesEndpoint":
        from corral.providers.kubernetes.base import KubernetesEndpoint

        return KubernetesEndpoint
    if name == "KubernetesProvider":
        from corral.providers.kubernetes.provider import KubernetesProvider

        return KubernetesProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Warm servers claimed from agent-sandbox's ``SandboxWarmPool``: no cold start per server.

kubernetes-sigs/agent-sandbox keeps a ``SandboxWarmPool`` of ready Pods made from a
``SandboxTemplate``; a ``SandboxClaim`` adopts one of them at once (their measured p50
is under 100 ms, against tens of seconds for a cold Pod). ``corral deploy k8s
--agent-sandbox`` renders a template and a pool for an environment; then::

    async with AgentSandboxProvider(namespace="rl") as provider:
        endpoint = await provider.start("corral-echo")     # the SandboxWarmPool's name
        # or provider.start("path/to/echo-env"): the pool corral deploy named for it

A claim carries only the pool reference and the owner's labels: per-claim environment
variables or volumes would make the controller create a fresh sandbox (a cold start)
instead of adopting a warm one. The claim is watched like the Pod provider's Pods
(:func:`~corral.providers.kubernetes.status.claim_verdict`): ``Ready=True`` with the
sandbox's Pod IPs means the server answered its readiness probe; a terminal reason
(``TemplateNotFound``, ``ClaimExpired`` ...) fails the start at once. Stopping deletes the
claim, and the controller deletes the sandbox and refills the pool. The connection modes
and the cleanup are those of :class:`~corral.providers.kubernetes.provider.KubeProvider`.

``claim_version`` picks the CRD version: ``v1beta1`` (``spec.warmPoolRef``) or
``v1alpha1`` (``spec.sandboxTemplateRef`` and ``spec.warmpool``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.errors import ServerStartError
from corral.providers.base import ServerSpec
from corral.providers.kubernetes.api import (
    CLAIM_GROUP,
    KubeAPI,
    claims,
    sandboxes,
    warm_pools,
)
from corral.providers.kubernetes.base import KubeProvider
from corral.providers.kubernetes.pods import dns_label
from corral.providers.kubernetes.status import Verdict, claim_verdict
from corral.providers.manifest import ManifestError

POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
"""The annotation of a Sandbox naming the Pod it adopted from a warm pool."""


def warm_pool_name(env_name: str) -> str:
    """The SandboxWarmPool ``corral deploy k8s --agent-sandbox`` renders for an environment."""
    return dns_label(f"corral-{env_name}", 50)


class AgentSandboxProvider(KubeProvider):
    """Claim warm environment servers from a ``SandboxWarmPool`` (see the module docstring).

    ``start(spec)`` takes the pool's name, or an environment directory (the pool is then
    ``corral-<name>``, as ``corral deploy k8s --agent-sandbox`` names it, and the port the
    manifest's).

    Args:
        port: the server's port in the pooled Pods (default: the manifest's, or 8000).
        claim_version: ``"v1beta1"`` or ``"v1alpha1"`` of the SandboxClaim CRD.
        template: with ``v1alpha1``: the SandboxTemplate to claim (default: the pool's
            name, as corral deploy names both alike).
        options: those of :class:`~corral.providers.kubernetes.provider.KubeProvider`.
    """

    kind = "agent-sandbox"
    mode = "agent-sandbox"

    def __init__(
        self,
        *,
        port: int | None = None,
        claim_version: str = "v1beta1",
        template: str | None = None,
        **options: Any,
    ) -> None:
        if claim_version not in ("v1beta1", "v1alpha1"):
            raise ValueError(f"claim_version must be v1beta1 or v1alpha1, not {claim_version!r}")
        self._kind = claims(claim_version)
        super().__init__(**options)
        self.port = port
        self.claim_version = claim_version
        self.template_name = template

    def _pool(self, spec: ServerSpec) -> tuple[str, int]:
        try:
            manifest = spec.manifest()
        except ManifestError as exc:
            raise ServerStartError(str(exc), details={"target": spec.target}) from None
        if manifest is not None:
            return warm_pool_name(manifest.name), self.port or manifest.port
        return spec.target, self.port or 8000

    def _name(self, spec: ServerSpec) -> str:
        pool, _ = self._pool(spec)
        return super()._name(ServerSpec(target=pool.removeprefix("corral-")))

    async def _create(self, api: KubeAPI, spec: ServerSpec, name: str) -> int:
        if spec.serve_args() or spec.environment or spec.cpu or spec.memory:
            raise ServerStartError(
                "a claimed sandbox runs its SandboxTemplate as it is: per-claim server "
                "options, environment or resources would force a cold start; set them in "
                "corral.yaml and render the template again (corral deploy k8s --agent-sandbox)",
                details={"target": spec.target},
            )
        pool, port = self._pool(spec)
        if await api.get(warm_pools(self.claim_version), pool) is None:
            # The controller would retry a claim on a missing pool for ever: say it now.
            raise ServerStartError(
                f"no SandboxWarmPool {pool!r} in namespace {api.namespace!r} (or agent-sandbox "
                "is not installed); render one with corral deploy k8s --agent-sandbox and "
                "apply it",
                details={"pool": pool, "namespace": api.namespace},
            )
        if self.claim_version == "v1beta1":
            claim_spec: dict[str, Any] = {"warmPoolRef": {"name": pool}}
        else:
            claim_spec = {
                "sandboxTemplateRef": {"name": self.template_name or pool},
                "warmpool": pool,
            }
        await api.create(
            self._kind,
            {
                "apiVersion": f"{CLAIM_GROUP}/{self.claim_version}",
                "kind": "SandboxClaim",
                "metadata": {
                    "name": name,
                    "labels": self.ownership.labels(),
                    "ownerReferences": self.ownership.owner_references,
                },
                "spec": claim_spec,
            },
        )
        return port

    def _verdict(self, state: Mapping[str, Any] | None, waited: float) -> Verdict:
        return claim_verdict(state)

    async def _pod_of(self, api: KubeAPI, state: Mapping[str, Any]) -> tuple[str, str]:
        sandbox = (state.get("status") or {}).get("sandbox") or {}
        ips = sandbox.get("podIPs") or []
        name = str(sandbox.get("name") or sandbox.get("Name") or "")
        pod = name
        if name:
            found = await api.get(sandboxes(self.claim_version), name)
            annotations = ((found or {}).get("metadata") or {}).get("annotations") or {}
            pod = str(annotations.get(POD_NAME_ANNOTATION) or name)
        return pod, str(ips[0]) if ips else ""

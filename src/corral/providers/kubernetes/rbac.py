"""The permissions corral's Kubernetes code needs, as Roles rendered from one table.

Who calls the API, and with what:

* a **provider** (``KubernetesProvider``: mode ``pods``; ``AgentSandboxProvider``: mode
  ``agent-sandbox``), run by the trainer with the trainer's credentials: its objects
  (Pods or SandboxClaims), its token Secret, its owner Lease, the failed server's log
  lines and, in port-forward mode, the tunnel. Its cleanup (``close``, the guardian's
  and the interpreter exit's sweep) deletes exactly the kinds its mode creates, so it
  needs nothing else (a sweep that listed SandboxClaims in ``pods`` mode was refused
  under this very Role, and left a killed trainer's Pods behind);
* ``corral k8s gc``: the same Role as the providers whose leftovers it sweeps;
* a trainer following a fleet through its **EndpointSlices** (mode ``fleet``:
  :class:`~corral.providers.kubernetes.membership.EndpointSliceFleet`): list and watch;
* the **deletion-cost keeper** of a fleet
  (:class:`~corral.providers.kubernetes.deletion_cost.DeletionCostKeeper`, ``corral k8s
  deletion-cost``): list and patch of Pods, to keep each server Pod's
  ``controller.kubernetes.io/pod-deletion-cost`` at its count of active sessions. It runs
  apart from the servers: a server's Pod runs agents' code and holds no API token.

:data:`RULES` is the one table: ``corral k8s role`` prints it, ``docs/scaling.md`` shows
it, and the tests run every
provider path against an emulated API server that refuses (403) whatever the Role of
the mode does not grant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from corral.providers.kubernetes.pods import MANAGED_BY

Mode = Literal["pods", "agent-sandbox", "fleet", "deletion-cost"]
MODES: tuple[Mode, ...] = ("pods", "agent-sandbox", "fleet", "deletion-cost")

CLAIMS_GROUP = "extensions.agents.x-k8s.io"
SANDBOXES_GROUP = "agents.x-k8s.io"


@dataclass(frozen=True)
class Rule:
    """One ``rules`` entry of a Role.

    Attributes:
        group: the API group (``""``: the core group).
        resources: resources, ``pods/log`` style for subresources.
        verbs: the verbs granted.
    """

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def to_api(self) -> dict[str, Any]:
        """The rule as the API writes it."""
        return {
            "apiGroups": [self.group],
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


_OWNER = (
    # The token's Secret: created at start, listed and deleted by the sweep.
    Rule("", ("secrets",), ("create", "list", "delete")),
    # The owner Lease: created, renewed (patch), listed by the sweep, deleted.
    Rule("coordination.k8s.io", ("leases",), ("create", "list", "patch", "delete")),
    # A failed server's last log lines, quoted in its start error.
    Rule("", ("pods/log",), ("get",)),
    # Port-forward mode: the tunnel is a WebSocket GET, which recent API servers
    # authorise as create too (AuthorizePodWebsocketUpgradeCreatePermission).
    Rule("", ("pods/portforward",), ("get", "create")),
)

RULES: dict[Mode, tuple[Rule, ...]] = {
    "pods": (
        Rule("", ("pods",), ("create", "list", "watch", "delete")),
        *_OWNER,
    ),
    "agent-sandbox": (
        Rule(CLAIMS_GROUP, ("sandboxclaims",), ("create", "list", "watch", "delete")),
        # The pool is checked before a claim (a missing pool would be retried forever).
        Rule(CLAIMS_GROUP, ("sandboxwarmpools",), ("get",)),
        # A claim's Sandbox names the Pod it adopted.
        Rule(SANDBOXES_GROUP, ("sandboxes",), ("get",)),
        *_OWNER,
    ),
    "fleet": (Rule("discovery.k8s.io", ("endpointslices",), ("list", "watch")),),
    "deletion-cost": (Rule("", ("pods",), ("list", "patch")),),
}
"""What each mode's calls need (see the module docstring)."""

SWEPT: dict[Mode, tuple[str, ...]] = {
    "pods": ("pods", "secrets", "leases"),
    "agent-sandbox": ("sandboxclaims", "secrets", "leases"),
}
"""The kinds (plurals) a provider of each mode creates, and so sweeps."""


def rules(mode: Mode) -> list[dict[str, Any]]:
    """The ``rules`` of ``mode``'s Role.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in RULES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    return [rule.to_api() for rule in RULES[mode]]


def _meta(name: str, namespace: str | None, labels: Mapping[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {MANAGED_BY: "corral", **labels}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def role(
    name: str,
    mode: Mode,
    *,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A namespaced Role granting ``mode``'s calls."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(name, namespace, labels or {}),
        "rules": rules(mode),
    }


def role_binding(
    name: str,
    role_name: str,
    subjects: Sequence[Mapping[str, str]],
    *,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A RoleBinding of ``role_name`` to ``subjects`` (API-shaped dicts)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(name, namespace, labels or {}),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": [dict(s) for s in subjects],
    }


def service_account_subject(name: str, namespace: str | None) -> dict[str, str]:
    """The RoleBinding subject of a service account."""
    subject = {"kind": "ServiceAccount", "name": name}
    if namespace is not None:
        subject["namespace"] = namespace
    return subject

"""Sweeping what dead providers left in a cluster: ``corral k8s gc``.

Every Kubernetes provider holds a Lease (``corral-owner-<id>``) that it renews while it
lives, and labels what it creates with its owner id. :func:`sweep` deletes the Pods,
SandboxClaims and Secrets of owners whose Lease expired or is missing, then the expired
Leases; with ``owner=`` it deletes one owner's objects, expired or not (what a provider
does on close, and what its guardian runs when the trainer is killed)::

    python -m corral.providers.kubernetes.gc --namespace rl --owner 3f9a0c1d2e4b --in-cluster
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client as k8s

from corral.providers.kubernetes.api import (
    LEASES,
    PODS,
    SECRETS,
    ClusterAccess,
    Kind,
    KubeAPI,
    KubeError,
    claims,
    connect,
)
from corral.providers.kubernetes.pods import MANAGED_BY, OWNER_LABEL, ROLE_LABEL

SKEW = 30.0
"""Seconds a Lease is given beyond its duration (clocks of different machines differ)."""


def lease_name(owner: str) -> str:
    """The name of owner ``owner``'s Lease."""
    return f"corral-owner-{owner}"


def _timestamp(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def lease_expired(lease: Mapping[str, Any], now: float | None = None) -> bool:
    """The Lease was not renewed within its duration (plus :data:`SKEW`)."""
    spec = lease.get("spec") or {}
    renewed = _timestamp(str(spec.get("renewTime") or spec.get("acquireTime") or ""))
    if renewed is None:
        return True
    duration = float(spec.get("leaseDurationSeconds") or 0)
    return (time.time() if now is None else now) > renewed + duration + SKEW


@dataclass
class Swept:
    """What a sweep deleted (or would delete, in a dry run), by kind.

    Attributes:
        objects: ``{kind plural: [names]}``.
        owners: the owner ids swept.
    """

    objects: dict[str, list[str]] = field(default_factory=dict)
    owners: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """The number of objects."""
        return sum(len(names) for names in self.objects.values())


def _owner(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(OWNER_LABEL, ""))


async def sweep(
    api: KubeAPI,
    *,
    owner: str | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> Swept:
    """Delete the objects of dead owners (or of ``owner``) in the API's namespace.

    Raises:
        KubeError: listing or deleting was refused.
    """
    leases = await api.list(LEASES, f"{MANAGED_BY}=corral,{ROLE_LABEL}=owner")
    live = {_owner(lease) for lease in leases if not lease_expired(lease, now)}

    def doomed(who: str) -> bool:
        return bool(who) and (who == owner if owner is not None else who not in live)

    found: dict[Kind, list[dict[str, Any]]] = {}
    for kind in (claims("v1beta1"), PODS, SECRETS):
        try:
            found[kind] = await api.list(kind, OWNER_LABEL)
        except KubeError as exc:
            if not (exc.not_found and kind.group):
                raise
            # agent-sandbox is not installed in this cluster
    found[LEASES] = [
        lease for lease in leases if doomed(_owner(lease)) or lease_expired(lease, now)
    ]
    swept = Swept()
    owners: set[str] = set()
    for kind, objects in found.items():
        doomed_objects = [o for o in objects if kind == LEASES or doomed(_owner(o))]
        for obj in doomed_objects:
            name = str(obj["metadata"]["name"])
            if not dry_run:
                await api.delete(kind, name, grace_seconds=0 if kind == PODS else None)
            swept.objects.setdefault(kind.plural, []).append(name)
            owners.add(_owner(obj))
    swept.owners = sorted(owners - {""})
    return swept


async def connect_to(access: ClusterAccess, namespace: str) -> KubeAPI:
    """An API client for the cluster ``access`` describes."""
    if access.server is not None:
        configuration = k8s.Configuration(host=access.server)
        return await connect(namespace=namespace, configuration=configuration)
    return await connect(namespace=namespace, kubeconfig=access.kubeconfig, context=access.context)


async def sweep_owner(access: ClusterAccess, namespace: str, owner: str) -> Swept:
    """Connect and delete every object of ``owner`` (the provider's and guardian's cleanup)."""
    api = await connect_to(access, namespace)
    try:
        return await sweep(api, owner=owner)
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Sweep one owner's objects (what the guardian runs for a killed provider)."""
    parser = argparse.ArgumentParser(prog="python -m corral.providers.kubernetes.gc")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--owner", required=True)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--server", help="an API server reached without credentials")
    where.add_argument("--in-cluster", action="store_true")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    access = ClusterAccess(
        kubeconfig=args.kubeconfig,
        context=args.context,
        server=args.server,
        in_cluster=args.in_cluster,
    )
    try:
        swept = asyncio.run(sweep_owner(access, args.namespace, args.owner))
    except (KubeError, OSError) as exc:
        print(f"corral k8s gc: {exc}", file=sys.stderr)
        return 1
    with contextlib.suppress(OSError):
        print(f"swept {swept.total} objects of owner {args.owner}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sweeping what dead providers left in a cluster: ``corral k8s gc``.

Every Kubernetes provider holds a Lease (``corral-owner-<id>``) that it renews while it
lives, labelled with its mode (``pods`` or ``agent-sandbox``), and labels what it creates
with its owner id. :func:`sweep` deletes the objects of owners whose Lease expired or is
missing, then the expired Leases; with ``owner=`` it deletes one owner's objects, expired
or not (what a provider does on close, and what its guardian runs when the trainer is
killed)::

    python -m corral.providers.kubernetes.gc --namespace rl --owner 3f9a0c1d2e4b --in-cluster

**Only the kinds a mode creates are listed** (:data:`~corral.providers.kubernetes.rbac.SWEPT`):
Pods and Secrets for ``pods``, SandboxClaims and Secrets for ``agent-sandbox``, so the
least-privilege Role of the mode (:mod:`corral.providers.kubernetes.rbac`) is enough. A
kind the caller may not list or delete (403) does not stop the sweep: the other kinds
are swept, and the refusal is reported (``SweepReport.refused``; ``corral k8s gc`` exits 1).
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
from corral.providers.kubernetes.pods import MANAGED_BY, MODE_LABEL, OWNER_LABEL, ROLE_LABEL
from corral.providers.kubernetes.rbac import SWEPT, Mode

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
class SweepReport:
    """What a sweep deleted (or would delete, in a dry run), by kind.

    Attributes:
        objects: ``{kind plural: [names]}``.
        owners: the owner ids swept.
        refused: ``{kind plural: the API's message}`` for kinds the caller may not list
            or delete (the rest was swept).
    """

    objects: dict[str, list[str]] = field(default_factory=dict)
    owners: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """The number of objects."""
        return sum(len(names) for names in self.objects.values())


def _owner(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(OWNER_LABEL, ""))


def kinds_of(mode: Mode, claim_version: str = "v1beta1") -> list[Kind]:
    """The kinds a provider of ``mode`` creates (its Lease aside)."""
    by_plural = {"pods": PODS, "secrets": SECRETS, "sandboxclaims": claims(claim_version)}
    return [by_plural[plural] for plural in SWEPT[mode] if plural != "leases"]


def _mode(lease: Mapping[str, Any]) -> Mode:
    labels = (lease.get("metadata") or {}).get("labels") or {}
    return "agent-sandbox" if labels.get(MODE_LABEL) == "agent-sandbox" else "pods"


async def sweep(
    api: KubeAPI,
    *,
    owner: str | None = None,
    kinds: Sequence[Kind] | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> SweepReport:
    """Delete the objects of dead owners (or of ``owner``) in the API's namespace.

    Args:
        api: the namespace's client.
        owner: sweep this owner only, its Lease live or not.
        kinds: the kinds to sweep (the Leases aside); default: ``pods``' kinds, and those
            of every mode a swept owner's Lease names.
        dry_run: list, delete nothing.
        now: the time Leases are judged at (default: now).

    Raises:
        KubeError: the Leases could not be listed (nothing was swept).
    """
    leases = await api.list(LEASES, f"{MANAGED_BY}=corral,{ROLE_LABEL}=owner")
    live = {_owner(lease) for lease in leases if not lease_expired(lease, now)}

    def doomed(who: str) -> bool:
        return bool(who) and (who == owner if owner is not None else who not in live)

    doomed_leases = [lease for lease in leases if doomed(_owner(lease))]
    if kinds is None:
        wanted = kinds_of("pods")
        for lease in doomed_leases:
            wanted += [k for k in kinds_of(_mode(lease)) if k not in wanted]
        kinds = wanted
    swept = SweepReport()
    found: dict[Kind, list[dict[str, Any]]] = {}
    for kind in kinds:
        try:
            found[kind] = [o for o in await api.list(kind, OWNER_LABEL) if doomed(_owner(o))]
        except KubeError as exc:
            if exc.not_found and kind.group:
                continue  # a custom resource not installed here (no agent-sandbox)
            if exc.status != 403:
                raise
            swept.refused[kind.plural] = str(exc)
    for kind, objects in found.items():
        await _delete(api, kind, objects, swept, dry_run)
    # The Leases last, and only of owners left with nothing: one whose objects could not
    # all be swept keeps its Lease, so that a sweep with more rights still finds them.
    unfinished = {_owner(lease) for lease in doomed_leases} if swept.refused else set()
    done = [lease for lease in doomed_leases if _owner(lease) not in unfinished]
    await _delete(api, LEASES, done, swept, dry_run)
    swept.owners = sorted(
        {_owner(o) for kind in found.values() for o in kind} | {_owner(o) for o in done}
    )
    return swept


async def _delete(
    api: KubeAPI,
    kind: Kind,
    objects: Sequence[Mapping[str, Any]],
    swept: SweepReport,
    dry_run: bool,
) -> None:
    for obj in objects:
        name = str(obj["metadata"]["name"])
        if not dry_run:
            try:
                await api.delete(kind, name, grace_seconds=0 if kind == PODS else None)
            except KubeError as exc:
                if exc.status != 403:
                    raise
                swept.refused[kind.plural] = str(exc)
                continue
        swept.objects.setdefault(kind.plural, []).append(name)


async def connect_to(access: ClusterAccess, namespace: str) -> KubeAPI:
    """An API client for the cluster ``access`` describes."""
    if access.server is not None:
        configuration = k8s.Configuration(host=access.server)
        return await connect(namespace=namespace, configuration=configuration)
    return await connect(namespace=namespace, kubeconfig=access.kubeconfig, context=access.context)


async def sweep_owner(
    access: ClusterAccess, namespace: str, owner: str, kinds: Sequence[Kind]
) -> SweepReport:
    """Connect and delete every object of ``owner`` of ``kinds`` (the guardian's cleanup)."""
    api = await connect_to(access, namespace)
    try:
        return await sweep(api, owner=owner, kinds=kinds)
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Sweep one owner's objects (what the guardian runs for a killed provider)."""
    parser = argparse.ArgumentParser(prog="python -m corral.providers.kubernetes.gc")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--mode", choices=sorted(SWEPT), default="pods")
    parser.add_argument("--claim-version", default="v1beta1")
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
        kinds = kinds_of(args.mode, args.claim_version)
        swept = asyncio.run(sweep_owner(access, args.namespace, args.owner, kinds))
    except (KubeError, OSError) as exc:
        print(f"corral k8s gc: {exc}", file=sys.stderr)
        return 1
    for plural, message in swept.refused.items():
        print(f"corral k8s gc: cannot sweep {plural}: {message}", file=sys.stderr)
    with contextlib.suppress(OSError):
        print(f"swept {swept.total} objects of owner {args.owner}")
    return 1 if swept.refused else 0


if __name__ == "__main__":
    sys.exit(main())

"""A provider's identity in the cluster: its owner Lease, its token Secret, its cleanup.

Every Kubernetes provider holds a ``coordination.k8s.io`` Lease (``corral-owner-<id>``)
naming its host and pid, renewed every third of its duration while the provider lives,
and labels everything it creates with its owner id (and an owner reference to the Lease,
so that the cluster's garbage collector removes it with the Lease). Cleanup, from the
most to the least graceful:

1. :meth:`Ownership.release` (the provider's ``close``): sweep the owner's objects and
   delete the Lease;
2. at interpreter exit or when the provider is collected without being closed: the
   sweep command (``python -m corral.providers.kubernetes.gc --owner <id>``) in a
   process of its own;
3. when the process is killed outright: the same command, run by the process's guardian
   (:mod:`corral.providers.guardian`);
4. when the machine died too: the Lease expires and ``corral k8s gc`` sweeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from typing import Any

from corral.providers.guardian import guardian
from corral.providers.kubernetes import gc
from corral.providers.kubernetes.api import LEASES, PODS, SECRETS, Kind, KubeAPI, KubeError
from corral.providers.kubernetes.pods import (
    DOMAIN,
    MANAGED_BY,
    MODE_LABEL,
    OWNER_LABEL,
    ROLE_LABEL,
    TOKEN_KEY,
)
from corral.providers.kubernetes.rbac import Mode

log = logging.getLogger("corral.providers.kubernetes")


def micro_time(moment: float | None = None) -> str:
    """A Kubernetes ``MicroTime``: RFC 3339 in UTC with microseconds."""
    when = datetime.datetime.fromtimestamp(
        time.time() if moment is None else moment, tz=datetime.UTC
    )
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Ownership:
    """One provider's owner id, Lease, token Secret and cleanup (see the module docstring).

    Args:
        lease_seconds: the Lease's duration.
        guard: register the sweep with the process's guardian.
        token: a bearer token to store in a Secret for the servers.
        mode: the provider's mode (``pods``, ``agent-sandbox``): a label of the Lease.
        kind: what the provider creates per server (Pods, SandboxClaims): with its
            Secret, the kinds its cleanup sweeps, and no other (see
            :mod:`corral.providers.kubernetes.rbac`).
    """

    def __init__(
        self,
        *,
        lease_seconds: float,
        guard: bool,
        token: str | None,
        mode: Mode = "pods",
        kind: Kind | None = None,
    ) -> None:
        self.owner = secrets.token_hex(6)
        """The value of the owner label on everything the provider creates."""
        self.mode = mode
        self.kinds: list[Kind] = [kind or PODS, SECRETS]
        """What the cleanup sweeps (the Lease aside)."""
        self.lease_seconds = lease_seconds
        self.guard = guard
        self.token = token
        self.owner_references: list[dict[str, Any]] = []
        """References to the Lease, for the objects the provider creates."""
        self.token_secret: str | None = None
        """The Secret holding the token, once taken."""
        self._sweep: list[str] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def lease(self) -> str:
        """The Lease's name."""
        return gc.lease_name(self.owner)

    @property
    def selector(self) -> str:
        """The label selector of everything the provider created."""
        return f"{OWNER_LABEL}={self.owner}"

    def labels(self) -> dict[str, str]:
        """The labels of everything the provider creates."""
        return {MANAGED_BY: "corral", OWNER_LABEL: self.owner}

    async def take(self, api: KubeAPI, holder: object) -> None:
        """Create the Lease (and the token's Secret); register the cleanup of ``holder``.

        Raises:
            KubeError: the API refused.
        """
        now = micro_time()
        host, pid = socket.gethostname(), os.getpid()
        lease = await api.create(
            LEASES,
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.lease,
                    "labels": {**self.labels(), ROLE_LABEL: "owner", MODE_LABEL: self.mode},
                    "annotations": {f"{DOMAIN}/host": host, f"{DOMAIN}/pid": str(pid)},
                },
                "spec": {
                    "holderIdentity": f"{host}/{pid}",
                    "leaseDurationSeconds": int(self.lease_seconds),
                    "acquireTime": now,
                    "renewTime": now,
                },
            },
        )
        uid = (lease.get("metadata") or {}).get("uid")
        if uid:
            self.owner_references = [
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "name": self.lease,
                    "uid": uid,
                }
            ]
        self._register(api, holder)
        if self.token is not None:
            name = f"corral-token-{self.owner}"
            await api.create(
                SECRETS,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": name,
                        "labels": self.labels(),
                        "ownerReferences": self.owner_references,
                    },
                    "type": "Opaque",
                    "stringData": {TOKEN_KEY: self.token},
                },
            )
            self.token_secret = name

    def _register(self, api: KubeAPI, holder: object) -> None:
        self._sweep = [
            sys.executable,
            "-m",
            "corral.providers.kubernetes.gc",
            "--namespace",
            api.namespace,
            "--owner",
            self.owner,
            "--mode",
            self.mode,
            "--claim-version",
            self.kinds[0].version,
            *api.access.arguments(),
        ]
        if self.guard:
            guardian().run_at_death(self._sweep)
        self._finalizer = weakref.finalize(holder, _sweep_blocking, self._sweep)

    async def renew(self, api: KubeAPI) -> None:
        """Renew the Lease once.

        Raises:
            KubeError: the API refused.
        """
        await api.patch(LEASES, self.lease, {"spec": {"renewTime": micro_time()}})

    async def renew_forever(self, api: KubeAPI) -> None:
        """Renew the Lease every third of its duration (until cancelled)."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.renew(api)
            except KubeError as exc:
                log.warning("cannot renew the owner Lease %s: %s", self.lease, exc)

    async def release(self, api: KubeAPI) -> None:
        """Delete every object of the owner and the Lease; drop the exit-time cleanups."""
        try:
            swept = await gc.sweep(api, owner=self.owner, kinds=self.kinds)
        except KubeError as exc:
            log.warning("cannot sweep the objects of owner %s: %s", self.owner, exc)
            return
        if swept.refused:
            for plural, message in swept.refused.items():
                log.warning("cannot sweep the %s of owner %s: %s", plural, self.owner, message)
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        if self.guard and self._sweep is not None:
            guardian().forget_command(self._sweep)


def _sweep_blocking(argv: Sequence[str]) -> None:
    """Run the sweep command of a provider that was not closed (interpreter exit).

    A process of its own: at interpreter exit, threads and executors refuse new work, and
    the provider's event loop is gone.
    """
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return
    if done.returncode == 0:
        with contextlib.suppress(Exception):
            guardian().forget_command(argv)

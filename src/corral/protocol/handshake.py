"""The ``hello``/``welcome`` handshake: protocol version and contract negotiation.

The client states the contract it was built for (version + fingerprint). The server
answers with how it will treat that client:

* ``exact``: same fingerprint;
* ``compatible``: same contract major version (semver), schemas differ compatibly: when
  the client sent its schemas, the server diffs them against its own
  (:func:`corral.contract.diff.diff_schemas`, the client's as the old side) and refuses
  a breaking difference, naming it; without schemas the major version decides;
* ``migrated``: an older major the server has an action migration for;
* ``unchecked``: the client sent no contract (it decodes from the server's schemas);

or refuses with ``CONTRACT_MISMATCH`` at connect time, before any episode starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from corral.contract.diff import diff_schemas
from corral.contract.schema import parse_semver
from corral.errors import ContractMismatch, UnsupportedProtocol
from corral.protocol.codecs import PROTOCOL
from corral.protocol.messages import ContractRef, Hello

RESUME_HEADER = "corral-resume"
"""WebSocket handshake header of a reconnecting client: comma-separated ids of the
sessions it comes back to re-attach. A full server still admits such a client, because
those sessions hold their slots already."""

ROUTE_HEADER = "corral-server"
"""WebSocket handshake header naming the server a client wants (its sessions' home, the
id a ``welcome`` reports): a front door routes by it (:mod:`corral.providers.frontdoor`),
so a client that reconnects through one address comes back to its sessions."""

MAX_RESUME_IDS = 16
"""Session ids a client lists in :data:`RESUME_HEADER` (one live one is enough)."""


class Compat(StrEnum):
    """How the server treats a client's contract."""

    EXACT = "exact"
    COMPATIBLE = "compatible"
    MIGRATED = "migrated"
    UNCHECKED = "unchecked"


def check_protocol(hello: Hello) -> None:
    """Raise ``UnsupportedProtocol`` unless the client speaks ``corral/1``."""
    if hello.protocol != PROTOCOL:
        raise UnsupportedProtocol(
            f"client speaks {hello.protocol!r}; this server speaks {PROTOCOL!r}",
            details={"server": PROTOCOL, "client": hello.protocol},
        )


def negotiate(
    client: ContractRef | None,
    server_version: str,
    server_fingerprint: str,
    migrations: Iterable[int] = (),
    server_schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> Compat:
    """Decide how to treat a client's contract, or raise ``ContractMismatch``."""
    if client is None:
        return Compat.UNCHECKED
    details = {
        "client_version": client.version,
        "client_fingerprint": client.fingerprint,
        "server_version": server_version,
        "server_fingerprint": server_fingerprint,
    }
    if client.fingerprint is not None and client.fingerprint == server_fingerprint:
        return Compat.EXACT
    try:
        client_major = parse_semver(client.version)[0]
    except ValueError as exc:
        raise ContractMismatch(str(exc), details=details) from None
    server_major = parse_semver(server_version)[0]
    if client_major == server_major:
        if client.schemas is not None and server_schemas is not None:
            _refuse_breaking(client.schemas, server_schemas, details)
        return Compat.COMPATIBLE
    if client_major in set(migrations):
        return Compat.MIGRATED
    raise ContractMismatch(
        f"client contract {client.version} is incompatible with server contract "
        f"{server_version} (major versions differ and no migration is registered)",
        details=details,
    )


SHOWN_CHANGES = 3
"""Breaking changes a ``CONTRACT_MISMATCH`` message names (``details`` lists more)."""
_LISTED_CHANGES = 32


def _refuse_breaking(
    client: Mapping[str, Mapping[str, Any]],
    server: Mapping[str, Mapping[str, Any]],
    details: dict[str, Any],
) -> None:
    """Raise ``ContractMismatch`` naming the breaking changes from the client's schemas
    to the server's (an old client's view: what it sends must still be accepted, what it
    receives must still validate with its models)."""
    try:
        changes = diff_schemas(client, server)
    except (RecursionError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ContractMismatch(
            f"the client's contract schemas could not be compared: {type(exc).__name__}",
            details=details,
        ) from None
    breaking = [c for c in changes if c.breaking]
    if not breaking:
        return
    named = "; ".join(f"{c.path}: {c.message}" for c in breaking[:SHOWN_CHANGES])
    more = len(breaking) - SHOWN_CHANGES
    if more > 0:
        named += f"; and {more} more"
    raise ContractMismatch(
        f"client contract {details['client_version']} is incompatible with server contract "
        f"{details['server_version']}: {len(breaking)} breaking change(s): {named}",
        details={
            **details,
            "breaking": [
                {"path": c.path, "kind": c.kind.value, "message": c.message}
                for c in breaking[:_LISTED_CHANGES]
            ],
        },
    )

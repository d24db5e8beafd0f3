"""Who holds a session: server ids, and session ids that carry them.

Behind one front door (an ingress, a balancer) a client that reconnects may land on any
server. So that no server ever has to guess, every server has a routable **id** (a Pod
name, ``--server-id``; the ``corral-server`` header a front door routes by, see
:mod:`corral.providers.frontdoor`) and every session id carries the id of the server
that made it::

    <server id>~<random>~<tag>

``tag`` is a truncated HMAC-SHA256 of ``<server id>~<random>`` under the fleet key
(:class:`SessionIds`): a server of the same fleet can tell a session id one of its
peers minted from a forged one, and answer "it lives on server X" (``SESSION_ELSEWHERE``)
only for the former. Without a fleet key each server tags with a key of its own, so it
verifies only its own ids and treats another server's id as a hint. The id is not a
secret: nothing about a session is reachable without its resume token, which stays a
per-session random secret of the server that holds it.

Everything here is pure (no I/O, no clock): the server's registry and every route that
names a session ask :meth:`SessionIds.locate` the same question.
"""

from __future__ import annotations

import hashlib
import hmac
import platform
import re
import secrets
from dataclasses import dataclass
from enum import Enum

SERVER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""What a server id may be: a DNS-label-like name (a Pod name fits), at most 63 chars."""

SEPARATOR = "~"
"""Between the parts of a session id (no server id or random part contains it)."""

_TAG_BYTES = 12
_RANDOM_BYTES = 16
_HEX = re.compile(r"[0-9a-f]+")


def default_server_id(port: int | None = None) -> str:
    """``<hostname>-<port>``: unique among the servers of one host and stable across a
    restart on the same port (what a front door's configuration names)."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", platform.node()).strip("-._") or "corral"
    suffix = f"-{port}" if port is not None else ""
    return (host[: 63 - len(suffix)] + suffix).strip("-._") or "corral"


class Where(Enum):
    """Where a session id says its session lives, as one server sees it."""

    HERE = "here"
    """Names this server: the registry knows it, or knows it is gone, or it is an id
    of an earlier process of this server."""
    ELSEWHERE = "elsewhere"
    """Minted by another server of the fleet: the client should go there."""
    UNKNOWN = "unknown"
    """Not a session id of this fleet (an old format, a forgery, a typo)."""


@dataclass(frozen=True)
class Located:
    """What :meth:`SessionIds.locate` found: where, and the server id it names."""

    where: Where
    server: str | None = None
    verified: bool = False
    """The tag verified under the fleet key (always False for another server's id
    without a fleet key: then the named server is a hint)."""


class SessionIds:
    """Mints and reads the session ids of one server.

    Args:
        server_id: this server's id (:data:`SERVER_ID`).
        fleet_key: the key every server of the fleet shares (None: a key of this
            process only; other servers' ids are then unverifiable hints).
    """

    def __init__(self, server_id: str, fleet_key: bytes | None = None) -> None:
        if not SERVER_ID.fullmatch(server_id):
            raise ValueError(f"server id {server_id!r} must match {SERVER_ID.pattern}")
        self.server_id = server_id
        self.shared = fleet_key is not None
        self._key = fleet_key if fleet_key is not None else secrets.token_bytes(32)

    def _tag(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return digest[:_TAG_BYTES].hex()

    def mint(self, random: str | None = None) -> str:
        """A new session id of this server.

        Args:
            random: its random part, hex from a CSPRNG (default: 16 bytes of
                :func:`secrets.token_hex`); a server that draws random bytes in bulk
                passes its own.

        Raises:
            ValueError: ``random`` is not lowercase hex of at least 16 bytes.
        """
        if random is None:
            random = secrets.token_hex(_RANDOM_BYTES)
        elif len(random) < 2 * _RANDOM_BYTES or not _HEX.fullmatch(random):
            raise ValueError(f"a session id's random part must be >= {_RANDOM_BYTES} bytes of hex")
        body = f"{self.server_id}{SEPARATOR}{random}"
        return f"{body}{SEPARATOR}{self._tag(body)}"

    def locate(self, session_id: str) -> Located:
        """Where ``session_id`` lives, as far as its form tells (never raises)."""
        parts = session_id.split(SEPARATOR)
        if len(parts) != 3 or not SERVER_ID.fullmatch(parts[0]):
            return Located(Where.UNKNOWN)
        server, _, tag = parts
        body = session_id[: -len(tag) - 1]
        verified = hmac.compare_digest(self._tag(body), tag)
        if server == self.server_id:
            # Unverified, it is an id of an earlier process of this server (restarted
            # without a fleet key) or a forgery: either way, only the registry can say,
            # and it holds no such session.
            return Located(Where.HERE, server, verified)
        if self.shared and not verified:
            return Located(Where.UNKNOWN)
        return Located(Where.ELSEWHERE, server, verified)


def server_of(session_id: str) -> str | None:
    """The server id a session id names, if it has the fleet's form (a client's read:
    nothing is verified)."""
    parts = session_id.split(SEPARATOR)
    if len(parts) == 3 and SERVER_ID.fullmatch(parts[0]):
        return parts[0]
    return None


__all__ = [
    "SEPARATOR",
    "SERVER_ID",
    "Located",
    "SessionIds",
    "Where",
    "default_server_id",
    "server_of",
]

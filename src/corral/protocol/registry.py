"""The server's sessions, sans I/O: capacity, ownership, resume, tombstones, reaping.

:class:`SessionRegistry` decides everything about which sessions exist and who may use
them; the server's session manager only builds and closes environments around it.

* **Capacity**: a slot is *reserved* before an environment is built and becomes the
  session once it is (:meth:`~SessionRegistry.reserve`, :meth:`~SessionRegistry.add`);
  ``active`` counts both, so concurrent opens never overfill the server. Each owner (a
  connection) holds at most ``max_per_owner`` sessions, its pending opens included, and
  each client address (the owner's ``client``, whatever way it opens sessions) at most
  ``max_per_client``, so that one client cannot take every slot (issue 30.4).
  A server that cannot serve a new session for another reason (too many hung
  environment calls) says so through :attr:`~SessionRegistry.unavailable`, and
  ``reserve`` refuses with ``NOT_READY``.
* **Ownership**: a session answers only the connection it is attached to. When that
  connection drops, the session is *detached* and waits ``resume_window_s`` for a client
  to re-attach it with its token (:meth:`~SessionRegistry.attach`).
* **Tombstones**: a closed session leaves its reason behind, so a late request gets
  ``SESSION_LOST`` with the reason rather than a bare ``UNKNOWN_SESSION``.
* **Identity**: session ids are minted by the server's
  :class:`~corral.protocol.identity.SessionIds` (:meth:`~SessionRegistry.mint`), and a
  session this server does not hold is asked of it (:meth:`~SessionRegistry.missing`,
  the one answer of every route): an id another server of the fleet minted is
  ``SESSION_ELSEWHERE`` naming that server; anything else is ``UNKNOWN_SESSION``. The
  answer depends on the id's form and tag only, so it reveals nothing of a session but
  the server id its id already spells.
* **Reaping**: :meth:`~SessionRegistry.expired` names the sessions detached past the
  resume window or idle past ``idle_timeout_s``, for a timer to close.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from corral.errors import (
    CapacityReached,
    NotReady,
    SessionElsewhere,
    SessionLost,
    TooManySessions,
    Unauthorized,
    UnknownSession,
)
from corral.protocol.handshake import MAX_RESUME_IDS
from corral.protocol.identity import SessionIds, Where, default_server_id
from corral.protocol.session import ReplySink, SessionState

S = TypeVar("S", bound=SessionState)

TOMBSTONES = 10_000
"""Closed sessions whose reason is remembered (the oldest are forgotten first)."""


class SessionRegistry(Generic[S]):
    """Every live session of one server, by id, and the rules for using them.

    Args:
        max_sessions: sessions (live, detached, or being built) the server holds.
        max_per_owner: sessions one connection may hold.
        resume_window_s: how long a detached session waits to be re-attached.
        idle_timeout_s: a session with no request for this long expires (None: never).
        on_attach: called with each session a client re-attaches (the server's access
            log: re-attaching is decided here, with no I/O side to report it).
        ids: mints this server's session ids and tells where another's live (default:
            this host's id with a key of this registry's own).
        max_per_client: sessions one client address may hold (None: any); an owner
            says its client's address in a ``client`` attribute (one without is not
            counted: the in-process transport has no address).
    """

    def __init__(
        self,
        *,
        max_sessions: int,
        max_per_owner: int,
        resume_window_s: float,
        idle_timeout_s: float | None,
        on_attach: Callable[[S], None] | None = None,
        ids: SessionIds | None = None,
        max_per_client: int | None = None,
    ) -> None:
        self.ids = ids if ids is not None else SessionIds(default_server_id())
        self.max_sessions = max_sessions
        self.max_per_owner = max_per_owner
        self.max_per_client = max_per_client
        self._clients: dict[str, int] = {}
        """Sessions (and reserved slots) by client address."""
        self.resume_window_s = resume_window_s
        self.idle_timeout_s = idle_timeout_s
        self._on_attach = on_attach
        self.sessions: dict[str, S] = {}
        self.refused = 0
        """How many times a new session or connection was refused for capacity."""
        self.elsewhere = 0
        """How many requests named a session of another server (``SESSION_ELSEWHERE``)."""
        self._reserved = 0
        self._held: dict[ReplySink, int] = {}
        self._pending: dict[ReplySink, int] = {}
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        self.unavailable: Callable[[], str | None] = lambda: None
        """Why the server cannot serve a new session now, capacity aside (None: it can)."""

    # -- capacity ------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Sessions holding a slot (live, detached, or being built)."""
        return len(self.sessions) + self._reserved

    def has_capacity(self) -> bool:
        """True when one more session fits."""
        return self.active < self.max_sessions

    def capacity_error(self) -> CapacityReached:
        """The error for a full server, with the figures a client needs (counted)."""
        self.refused += 1
        return CapacityReached(
            f"server at capacity: {self.active}/{self.max_sessions} sessions",
            details={"active_sessions": self.active, "max_sessions": self.max_sessions},
        )

    def accepts(self, resume_header: str | None) -> bool:
        """Whether a new connection may be accepted (checked at its handshake).

        A full server still accepts a client coming back to re-attach a live session
        (``resume_header`` lists its session ids): that session holds its slot already.
        """
        if self.has_capacity():
            return True
        if not resume_header:
            return False
        ids = resume_header.split(",", MAX_RESUME_IDS)[:MAX_RESUME_IDS]
        return any(sid.strip() in self.sessions for sid in ids)

    def held(self, owner: ReplySink) -> int:
        """Sessions ``owner`` holds, its opens still being built included."""
        return self._held.get(owner, 0) + self._pending.get(owner, 0)

    def reserve(self, owner: ReplySink, held: int | None = None) -> None:
        """Reserve a slot for a session ``owner`` is opening.

        Args:
            held: the sessions ``owner`` holds by its own count (default: this
                registry's count, :meth:`held`).

        Raises:
            TooManySessions: the owner (the connection) holds its maximum, or its client
                address does (``details["scope"] == "client"``).
            CapacityReached: the server is full.
            NotReady: the server cannot serve a new session now (:attr:`unavailable`).
        """
        held = self.held(owner) if held is None else held
        if held >= self.max_per_owner:
            raise TooManySessions(
                f"this connection already holds {held} sessions",
                details={"limit": self.max_per_owner},
            )
        if not self.has_capacity():
            raise self.capacity_error()
        # After capacity: a full server is CAPACITY_REACHED (retry elsewhere) whoever asks.
        client = client_of(owner)
        limit = self.max_per_client
        if client and limit is not None and self._clients.get(client, 0) >= limit:
            self.refused += 1
            raise TooManySessions(
                f"client {client} already holds {self._clients[client]} sessions on this "
                f"server, its limit (of {self.max_sessions}: the rest stay for other clients)",
                details={
                    "limit": limit,
                    "scope": "client",
                    "active_sessions": self._clients[client],
                    "max_sessions": limit,
                },
            )
        reason = self.unavailable()
        if reason is not None:
            self.refused += 1
            raise NotReady(
                f"this server cannot serve a new session now: {reason}",
                details={"reason": reason},
            )
        self._reserved += 1
        _bump(self._pending, owner, 1)
        if client:
            _bump(self._clients, client, 1)

    def release(self, owner: ReplySink) -> None:
        """Give back a slot reserved by ``owner`` that did not become a session."""
        self._reserved -= 1
        _bump(self._pending, owner, -1)
        client = client_of(owner)
        if client:
            _bump(self._clients, client, -1)

    def add(self, session: S, reserved_by: ReplySink) -> None:
        """The slot ``reserved_by`` reserved becomes ``session`` (owned by ``session.owner``);
        it counts for ``reserved_by``'s client for its whole life."""
        self.release(reserved_by)
        self.sessions[session.id] = session
        if session.owner is not None:
            _bump(self._held, session.owner, 1)
        session.client = client_of(reserved_by)
        if session.client:
            _bump(self._clients, session.client, 1)

    def client_sessions(self, client: str) -> int:
        """Sessions (reserved ones included) client address ``client`` holds."""
        return self._clients.get(client, 0)

    # -- finding and moving sessions ----------------------------------------------------

    def get(self, session_id: str, owner: ReplySink, now: float | None = None) -> S:
        """The live session ``session_id`` attached to ``owner`` (marked active at
        ``now``, see :meth:`SessionState.touch`).

        Raises:
            SessionLost: the session existed and was closed (with the reason).
            SessionElsewhere: the id names another server of the fleet.
            UnknownSession: no such session on this connection.
        """
        session = self.sessions.get(session_id)
        if session is None or session.owner is not owner:
            raise self.missing(session_id, "on this connection; open or attach it first")
        session.touch(now)
        return session

    def mint(self, random: str | None = None) -> str:
        """A new session id of this server (``random``: its random part, see
        :meth:`SessionIds.mint`)."""
        return self.ids.mint(random)

    def missing(
        self, session_id: str, where: str
    ) -> SessionLost | SessionElsewhere | UnknownSession:
        """Why ``session_id`` is not a live session here: ``SessionLost`` with the reason
        for one this server closed, ``SessionElsewhere`` naming the server of an id
        another server of the fleet minted (verified under the fleet key), else
        ``UnknownSession``."""
        reason = self._tombstones.get(session_id)
        if reason is not None:
            return SessionLost(
                f"session {session_id} is gone: {reason}",
                details={"reason": reason, "session": session_id},
            )
        found = self.ids.locate(session_id)
        # Only a verified id is another server's: without a fleet key an id naming
        # another server may be anything, and a client that wants to read its server
        # can (``server_of``) without this server vouching for it.
        if found.where is Where.ELSEWHERE and found.verified and found.server is not None:
            self.elsewhere += 1
            return SessionElsewhere(
                f"session {session_id} lives on server {found.server!r}: reconnect there "
                "(through the front door with the corral-server header) and attach it",
                details={"server": found.server, "session": session_id},
            )
        return UnknownSession(f"no session {session_id!r} {where}", details={"session": session_id})

    def attach(self, session_id: str, token: str, owner: ReplySink) -> S:
        """Move a live session to ``owner`` (a reconnecting client).

        Raises:
            TooManySessions: ``owner`` holds its maximum already.
            SessionLost / SessionElsewhere / UnknownSession: as for :meth:`get`.
            Unauthorized: the resume token is wrong.
        """
        session = self.sessions.get(session_id)
        previous = session.owner if session is not None else None
        if previous is not owner and self.held(owner) >= self.max_per_owner:
            raise TooManySessions(
                f"this connection already holds {self.held(owner)} sessions",
                details={"limit": self.max_per_owner},
            )
        if session is None:
            raise self.missing(session_id, "on this server (it may have restarted)")
        # As bytes: compare_digest refuses non-ASCII str, and a token is whatever was sent.
        if not secrets.compare_digest(session.token.encode(), token.encode()):
            raise Unauthorized("wrong resume token for this session")
        if previous is not owner:
            # The session moves here from a dead (or not yet detected dead) connection:
            # the count of each connection follows it, or a re-attach twice over would
            # wrongly exhaust the per-connection limit.
            if previous is not None:
                _bump(self._held, previous, -1)
            _bump(self._held, owner, 1)
        session.owner = owner
        session.detached_at = None
        session.touch()
        if self._on_attach is not None:
            self._on_attach(session)
        return session

    def owned_by(self, owner: ReplySink) -> list[S]:
        """The live sessions attached to ``owner``."""
        return [s for s in self.sessions.values() if s.owner is owner]

    def detach_all(self, owner: ReplySink, now: float | None = None) -> list[S]:
        """The connection ``owner`` dropped: its sessions wait for a re-attach.

        Returns the sessions detached.
        """
        now = time.monotonic() if now is None else now
        detached = self.owned_by(owner)
        for session in detached:
            session.owner = None
            session.detached_at = now
        self._held.pop(owner, None)
        return detached

    def remove(self, session: S, reason: str) -> bool:
        """Close ``session``: free its slot, leave ``reason`` for late requests.

        Returns False when it was closed already.
        """
        if self.sessions.pop(session.id, None) is None:
            return False
        session.machine.close(reason)
        self._tombstones[session.id] = reason
        while len(self._tombstones) > TOMBSTONES:
            self._tombstones.popitem(last=False)
        if session.owner is not None:
            _bump(self._held, session.owner, -1)
        if session.client:
            _bump(self._clients, session.client, -1)
        return True

    # -- timers ------------------------------------------------------------------------

    def expired(self, now: float | None = None) -> list[tuple[S, str]]:
        """Sessions to close now, with why: detached too long, or idle too long."""
        now = time.monotonic() if now is None else now
        idle = self.idle_timeout_s
        victims: list[tuple[S, str]] = []
        for session in self.sessions.values():
            if session.detached_at is not None and (
                now - session.detached_at >= self.resume_window_s
            ):
                victims.append((session, "connection lost and not resumed in time"))
            elif (
                idle is not None
                and now - session.last_active >= idle
                and session.machine.running is None
            ):
                victims.append((session, f"idle for more than {idle:g} s"))
        return victims

    def check_interval(self) -> float:
        """How often :meth:`expired` is worth asking: a quarter of the shortest window,
        between 0.05 and 5 s (the timer's period)."""
        windows = [self.resume_window_s]
        if self.idle_timeout_s is not None:
            windows.append(self.idle_timeout_s)
        return max(0.05, min(5.0, min(windows) / 4))


def client_of(owner: ReplySink) -> str:
    """The client address ``owner`` (a connection, an HTTP session's channel) serves, or
    ``""`` when it has none."""
    client = getattr(owner, "client", "")
    return client if isinstance(client, str) else ""


K = TypeVar("K")


def _bump(counts: dict[K, int], owner: K, by: int) -> None:
    left = counts.get(owner, 0) + by
    if left > 0:
        counts[owner] = left
    else:
        counts.pop(owner, None)

"""Client-side bookkeeping of requests, replies and sessions, sans I/O.

Each request gets a fresh id; a reply is matched to its request by id, so replies may
arrive in any order. A request the caller gave up on (timeout) is *forgotten*: its reply,
if it ever arrives, is counted as stale and dropped, never taken as the answer to the
next call. This is what keeps a slow step from shifting every later reply by one.

Ids are never reused, and a request keeps its id for its whole life: when the connection
drops, the requests still unanswered are re-sent after the reconnect *with their original
ids*, so the server's per-session reply cache answers one that it already ran instead of
running it again (at most once), and runs one that it never saw (never lost).
:class:`SessionBook` keeps what a reconnect needs: the live sessions with their resume
tokens, the server instance they live on, and the sessions known to be gone.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from corral.errors import BadMessage, ErrorCode, SessionLost


@dataclass(slots=True)
class Reply:
    """A reply matched to its request."""

    request_id: int
    message: dict[str, Any]

    @property
    def type(self) -> str:
        """The reply's message type."""
        return str(self.message.get("type"))


@dataclass(slots=True)
class Outstanding:
    """A request waiting for its reply.

    Attributes:
        kind: the request's message type.
        message: the message as sent (with its id), kept for re-sending.
        replay: re-send it after a reconnect; False for requests bound to one socket
            (``hello``, ``attach``), which a reconnect issues afresh.
        sent: the connection generation it was last sent on (-1: not sent yet).
    """

    kind: str
    message: dict[str, Any] | None = None
    replay: bool = True
    sent: int = -1

    @property
    def session(self) -> str | None:
        """The session the request addresses, if it names one."""
        if self.message is None:
            return None
        sid = self.message.get("session")
        return sid if isinstance(sid, str) else None


class RequestTracker:
    """Assigns request ids and matches replies to outstanding requests."""

    def __init__(self, start: int = 1) -> None:
        self._ids = itertools.count(start)
        self._pending: dict[int, Outstanding] = {}
        self.stale = 0
        """How many replies arrived for requests no longer waited for."""

    def new(self, kind: str, *, message: dict[str, Any] | None = None, replay: bool = True) -> int:
        """Reserve an id for a request of ``kind`` and mark it outstanding.

        With ``message``, the id is written into it and the message kept for re-sending.
        """
        request_id = next(self._ids)
        if message is not None:
            message["id"] = request_id
        self._pending[request_id] = Outstanding(kind, message, replay)
        return request_id

    def record(self, request_id: int, message: dict[str, Any]) -> None:
        """Keep ``message`` as the body of outstanding request ``request_id``."""
        entry = self._pending.get(request_id)
        if entry is not None and entry.message is None:
            entry.message = message

    def get(self, request_id: int) -> Outstanding | None:
        """The outstanding request ``request_id``, if it still waits."""
        return self._pending.get(request_id)

    def mark_sent(self, request_id: int, generation: int) -> None:
        """Record that ``request_id`` went out on connection ``generation``."""
        entry = self._pending.get(request_id)
        if entry is not None:
            entry.sent = generation

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id`` (e.g. after a timeout)."""
        self._pending.pop(request_id, None)

    def outstanding(self) -> dict[int, str]:
        """The ids (and kinds) still waiting for a reply."""
        return {rid: entry.kind for rid, entry in self._pending.items()}

    def unsent(self, generation: int) -> list[tuple[int, dict[str, Any]]]:
        """Replayable requests not yet sent on connection ``generation``, oldest first."""
        return [
            (rid, entry.message)
            for rid, entry in sorted(self._pending.items())
            if entry.replay and entry.message is not None and entry.sent != generation
        ]

    def bound_to_socket(self) -> list[int]:
        """Ids of outstanding requests that die with their socket (not replayable)."""
        return [rid for rid, entry in self._pending.items() if not entry.replay]

    def of_sessions(self, sessions: set[str] | dict[str, str]) -> list[int]:
        """Ids of outstanding requests addressing any of ``sessions``."""
        return [rid for rid, entry in self._pending.items() if entry.session in sessions]

    def match(self, message: dict[str, Any]) -> Reply | None:
        """Match a decoded reply; None when it answers nothing outstanding.

        Raises:
            BadMessage: the reply has no usable id and is not an error.
        """
        request_id = message.get("id")
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            if message.get("type") == "error":
                return None
            raise BadMessage(f"reply without an id: {message.get('type')!r}")
        if self._pending.pop(request_id, None) is None:
            self.stale += 1
            return None
        return Reply(request_id, message)


class SessionBook:
    """The sessions one connection carries: live ones (with tokens) and lost ones.

    Fed with every matched reply (:meth:`observe`), it learns sessions from ``opened``
    and ``attached`` replies, drops them on ``closed``, and marks them lost when the
    server says they are gone. A reconnect re-attaches :attr:`live`; a request for a
    lost session fails at once with :class:`SessionLost` and its reason.
    """

    def __init__(self) -> None:
        self.live: dict[str, str] = {}
        """Live session id → resume token."""
        self.lost: dict[str, str] = {}
        """Lost session id → why it is gone."""
        self.instance: str | None = None
        """The server instance the live sessions belong to."""

    def observe(self, message: dict[str, Any]) -> None:
        """Learn from one matched reply."""
        kind = message.get("type")
        sid = message.get("session")
        if not isinstance(sid, str):
            return
        if kind in ("opened", "attached") and isinstance(message.get("token"), str):
            self.live[sid] = message["token"]
            self.lost.pop(sid, None)
        elif kind == "closed":
            self.live.pop(sid, None)
        elif kind == "error":
            code = message.get("code")
            details = message.get("details")
            details = details if isinstance(details, dict) else {}
            if code == ErrorCode.SESSION_LOST:
                self.lose(sid, str(details.get("reason") or message.get("message", "")))
            elif code == ErrorCode.STEP_TIMEOUT:
                self.lose(sid, "a call overran the server's step timeout")

    def lose(self, session: str, reason: str) -> None:
        """Mark ``session`` as gone for ``reason``."""
        self.live.pop(session, None)
        self.lost[session] = reason

    def forget(self, session: str) -> None:
        """Stop tracking ``session`` (closed by this side)."""
        self.live.pop(session, None)
        self.lost.pop(session, None)

    def reason(self, session: str) -> str | None:
        """Why ``session`` is gone, or None if it is not known to be."""
        return self.lost.get(session)

    def lost_error(self, session: str, request_id: int | None = None) -> SessionLost:
        """The :class:`SessionLost` to raise for a request of lost ``session``."""
        reason = self.lost.get(session, "unknown")
        return SessionLost(
            f"session {session} is gone: {reason}",
            details={"reason": reason, "session": session},
            request_id=request_id,
        )

    def welcome(self, instance: str | None) -> list[str]:
        """Record the server ``instance`` of a new handshake.

        Returns the sessions lost because the instance changed (the server restarted, so
        every episode it held is gone); they are marked lost here.
        """
        if instance is None:
            return []
        previous, self.instance = self.instance, instance
        if previous is None or previous == instance:
            return []
        gone = list(self.live)
        for sid in gone:
            self.lose(
                sid,
                f"the server restarted (instance {previous[:12]} is now {instance[:12]}); "
                "its episodes are gone",
            )
        return gone

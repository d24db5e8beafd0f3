"""The sessions one client connection carries, and what becomes of each: a table.

    (unknown) --held--> LIVE --gone / restarted--> LOST --held--> LIVE
    LIVE --closed--> (unknown)

:class:`SessionBook` is the part of :class:`~corral.protocol.client.ClientProtocol` that
knows each session's fate: *live* (the server holds it; a new socket re-attaches it with
its resume token) or *lost* (gone for good: a request for it fails at once with
:class:`~corral.errors.SessionLost` and the reason). :data:`SESSION_RULES` is the one
place that decides a session's next fate (the h11 ``_state.py`` school), and
:data:`ERROR_EVENTS` says which of the server's error codes are news about the session
itself rather than about one request.

What a lost session becomes next is decided here too, which is where the fleet's
decisions go as rows: a reply saying the session lives on another server (an event
``ELSEWHERE`` with a fate ``MOVING``: follow it there), and a session that must leave its
server re-homed by the remedy :func:`corral.protocol.recovery.remedy` picks (events from
``LIVE`` and ``LOST``: re-opened from its snapshot or by verified replay, else it stays
lost and its episode ends truncated).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from corral.errors import ErrorCode, SessionLost
from corral.protocol.messages import Attached, Closed, ErrorReply, Opened, Reply, Restored


class SessionFate(StrEnum):
    """What a connection knows of a session (absent from the book: nothing)."""

    LIVE = "live"
    """The server holds it; a new socket re-attaches it with its token."""
    LOST = "lost"
    """Gone for good; its requests fail with ``SessionLost`` and the reason."""


class SessionEvent(StrEnum):
    """What can happen to a session, as the connection learns it."""

    HELD = "held"
    """An ``opened``, ``restored`` or ``attached`` reply: the server holds it, with this token."""
    CLOSED = "closed"
    """A ``closed`` reply: the session ended as asked."""
    FORGOTTEN = "forgotten"
    """This side stops tracking it (it closed the session, or opens it afresh)."""
    GONE = "gone"
    """The server says it is gone, or would not re-attach it."""
    RESTARTED = "restarted"
    """The server it lived on restarted (a new instance): its episode is gone."""


SESSION_RULES: Mapping[tuple[SessionFate | None, SessionEvent], SessionFate | None] = (
    MappingProxyType(
        {
            (None, SessionEvent.HELD): SessionFate.LIVE,
            (SessionFate.LIVE, SessionEvent.HELD): SessionFate.LIVE,
            (SessionFate.LOST, SessionEvent.HELD): SessionFate.LIVE,
            (None, SessionEvent.CLOSED): None,
            (SessionFate.LIVE, SessionEvent.CLOSED): None,
            (SessionFate.LOST, SessionEvent.CLOSED): SessionFate.LOST,
            (None, SessionEvent.FORGOTTEN): None,
            (SessionFate.LIVE, SessionEvent.FORGOTTEN): None,
            (SessionFate.LOST, SessionEvent.FORGOTTEN): None,
            (None, SessionEvent.GONE): SessionFate.LOST,
            (SessionFate.LIVE, SessionEvent.GONE): SessionFate.LOST,
            (SessionFate.LOST, SessionEvent.GONE): SessionFate.LOST,
            (SessionFate.LIVE, SessionEvent.RESTARTED): SessionFate.LOST,
        }
    )
)
"""(fate, event) → the session's next fate (None: not tracked). A pair missing here does
not happen (a restart only loses live sessions)."""

ERROR_EVENTS: Mapping[str, SessionEvent] = MappingProxyType(
    {ErrorCode.SESSION_LOST: SessionEvent.GONE, ErrorCode.STEP_TIMEOUT: SessionEvent.GONE}
)
"""Error codes that are news about the session named in the reply (a step that overran
the server's timeout closes its session there)."""


def _reason(reply: ErrorReply) -> str:
    if reply.code == ErrorCode.STEP_TIMEOUT:
        return "a call overran the server's step timeout"
    return str(reply.details.get("reason") or reply.message)


class SessionBook:
    """The sessions one connection carries, live (with tokens) and lost (with reasons).

    Every change goes through :data:`SESSION_RULES` (:meth:`apply`); :meth:`observe`
    feeds it the matched replies, :meth:`welcome` a new handshake's server instance.
    """

    def __init__(self) -> None:
        self.live: dict[str, str] = {}
        """Live session id → resume token."""
        self.lost: dict[str, str] = {}
        """Lost session id → why it is gone."""
        self.instance: str | None = None
        """The server instance the live sessions belong to."""

    def fate(self, session: str) -> SessionFate | None:
        """What is known of ``session``."""
        if session in self.live:
            return SessionFate.LIVE
        return SessionFate.LOST if session in self.lost else None

    def apply(
        self, session: str, event: SessionEvent, *, token: str = "", reason: str = ""
    ) -> SessionFate | None:
        """Move ``session`` by ``event`` (its ``token`` when held, the ``reason`` when
        gone); return its new fate."""
        fate = SESSION_RULES[(self.fate(session), event)]
        if fate is SessionFate.LIVE:
            self.lost.pop(session, None)
            self.live[session] = token
        elif fate is SessionFate.LOST:
            self.live.pop(session, None)
            if event is not SessionEvent.CLOSED:
                self.lost[session] = reason
        else:
            self.live.pop(session, None)
            self.lost.pop(session, None)
        return fate

    def observe(self, reply: Reply) -> None:
        """Learn from one matched reply."""
        if isinstance(reply, (Opened, Attached, Restored)):
            self.apply(reply.session, SessionEvent.HELD, token=reply.token)
        elif isinstance(reply, Closed):
            self.apply(reply.session, SessionEvent.CLOSED)
        elif isinstance(reply, ErrorReply) and reply.session is not None:
            event = ERROR_EVENTS.get(reply.code)
            if event is not None:
                self.apply(reply.session, event, reason=_reason(reply))

    def lose(self, session: str, reason: str) -> None:
        """Mark ``session`` as gone for ``reason``."""
        self.apply(session, SessionEvent.GONE, reason=reason)

    def forget(self, session: str) -> None:
        """Stop tracking ``session`` (closed by this side, or to be opened afresh)."""
        self.apply(session, SessionEvent.FORGOTTEN)

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
        reason = (
            f"the server restarted (instance {previous[:12]} is now {instance[:12]}); "
            "its episodes are gone"
        )
        for sid in gone:
            self.apply(sid, SessionEvent.RESTARTED, reason=reason)
        return gone


__all__ = ["ERROR_EVENTS", "SESSION_RULES", "SessionBook", "SessionEvent", "SessionFate"]

"""The sessions one client connection carries, and what becomes of each: a table.

    (unknown) --held--> LIVE --gone / restarted--> LOST --held--> LIVE
    LIVE --elsewhere--> MOVING --held--> LIVE;  MOVING --gone--> LOST
    LIVE --closed--> (unknown)

:class:`SessionBook` is the part of :class:`~corral.protocol.client.ClientProtocol` that
knows each session's fate: *live* (the server holds it; a new socket re-attaches it with
its resume token) or *lost* (gone for good: a request for it fails at once with
:class:`~corral.errors.SessionLost` and the reason). :data:`SESSION_RULES` is the one
place that decides a session's next fate (the h11 ``_state.py`` school), and
:data:`ERROR_EVENTS` says which of the server's error codes are news about the session
itself rather than about one request.

The fleet's rows: a reply saying the session lives on another server
(``SESSION_ELSEWHERE``, the event ``ELSEWHERE``) makes it ``MOVING``, with that server's
id (:attr:`SessionBook.moving`): the connection follows it there (it re-dials naming
that server, see :class:`~corral.protocol.client.ClientProtocol`) and re-attaches it with
its token, or, when it cannot, the session's requests fail with
:class:`~corral.errors.SessionElsewhere` and the pool re-homes the episode by the remedy
:func:`corral.protocol.recovery.remedy` picks.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from corral.errors import ErrorCode, SessionElsewhere, SessionLost
from corral.protocol.messages import Attached, Closed, ErrorReply, Opened, Reply, Restored


class SessionFate(StrEnum):
    """What a connection knows of a session (absent from the book: nothing)."""

    LIVE = "live"
    """The server holds it; a new socket re-attaches it with its token."""
    LOST = "lost"
    """Gone for good; its requests fail with ``SessionLost`` and the reason."""
    MOVING = "moving"
    """It lives on another server of the fleet (named in :attr:`SessionBook.moving`):
    the connection follows it there, its token kept."""


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
    ELSEWHERE = "elsewhere"
    """The server says it lives on another server of the fleet (``SESSION_ELSEWHERE``),
    or the connection landed on another server than the one holding it."""


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
            # The fleet's rows: a session on another server is followed there.
            (None, SessionEvent.ELSEWHERE): None,
            (SessionFate.LIVE, SessionEvent.ELSEWHERE): SessionFate.MOVING,
            (SessionFate.MOVING, SessionEvent.ELSEWHERE): SessionFate.MOVING,
            (SessionFate.LOST, SessionEvent.ELSEWHERE): SessionFate.LOST,
            (SessionFate.MOVING, SessionEvent.HELD): SessionFate.LIVE,
            (SessionFate.MOVING, SessionEvent.CLOSED): None,
            (SessionFate.MOVING, SessionEvent.FORGOTTEN): None,
            (SessionFate.MOVING, SessionEvent.GONE): SessionFate.LOST,
            (SessionFate.MOVING, SessionEvent.RESTARTED): SessionFate.MOVING,
        }
    )
)
"""(fate, event) → the session's next fate (None: not tracked). A pair missing here does
not happen (a restart only loses live sessions). A restart of the server a connection
landed on says nothing of a session that lives elsewhere: it stays ``MOVING``; news of
an unknown session's whereabouts is not taken (a session is tracked from its
``opened``)."""

ERROR_EVENTS: Mapping[str, SessionEvent] = MappingProxyType(
    {
        ErrorCode.SESSION_LOST: SessionEvent.GONE,
        ErrorCode.STEP_TIMEOUT: SessionEvent.GONE,
        ErrorCode.SESSION_ELSEWHERE: SessionEvent.ELSEWHERE,
    }
)
"""Error codes that are news about the session named in the reply (a step that overran
the server's timeout closes its session there)."""


def _reason(reply: ErrorReply) -> str:
    if reply.code == ErrorCode.STEP_TIMEOUT:
        return "a call overran the server's step timeout"
    return str(reply.details.get("reason") or reply.message)


def _holder(reply: ErrorReply) -> str:
    server = reply.details.get("server")
    return server if isinstance(server, str) else ""


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
        self.moving: dict[str, tuple[str, str]] = {}
        """Moving session id → (the id of the server holding it, its resume token)."""
        self.instance: str | None = None
        """The server instance the live sessions belong to."""

    def fate(self, session: str) -> SessionFate | None:
        """What is known of ``session``."""
        if session in self.live:
            return SessionFate.LIVE
        if session in self.moving:
            return SessionFate.MOVING
        return SessionFate.LOST if session in self.lost else None

    def apply(
        self,
        session: str,
        event: SessionEvent,
        *,
        token: str = "",
        reason: str = "",
        server: str = "",
    ) -> SessionFate | None:
        """Move ``session`` by ``event`` (its ``token`` when held, the ``reason`` when
        gone, the ``server`` holding it when elsewhere); return its new fate."""
        before = self.fate(session)
        fate = SESSION_RULES[(before, event)]
        if fate is SessionFate.MOVING:
            if before is SessionFate.LIVE:
                token = self.live.pop(session)
            else:
                held, token = self.moving[session]
                if event is not SessionEvent.ELSEWHERE or not server:
                    server = held
            self.moving[session] = (server, token)
            return fate
        self.moving.pop(session, None)
        if fate is SessionFate.LIVE:
            self.lost.pop(session, None)
            self.live[session] = token
        elif fate is SessionFate.LOST:
            self.live.pop(session, None)
            if event not in (SessionEvent.CLOSED, SessionEvent.ELSEWHERE):
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
                self.apply(reply.session, event, reason=_reason(reply), server=_holder(reply))

    def elsewhere(self, session: str, server: str) -> None:
        """``session`` lives on ``server`` (a refused ``attach``, a wrong landing)."""
        self.apply(session, SessionEvent.ELSEWHERE, server=server)

    def move_all(self, server: str) -> list[str]:
        """Every live session lives on ``server`` (the connection landed elsewhere);
        the sessions moved."""
        moved = list(self.live)
        for sid in moved:
            self.elsewhere(sid, server)
        return moved

    def follow(self, server: str) -> dict[str, str]:
        """The sessions moving to ``server`` (id → token), to re-attach there."""
        return {sid: token for sid, (held, token) in self.moving.items() if held == server}

    def elsewhere_error(self, session: str, request_id: int | None = None) -> SessionElsewhere:
        """The :class:`SessionElsewhere` to raise for a request of moving ``session``
        that the connection does not follow."""
        server = self.moving[session][0] if session in self.moving else ""
        return SessionElsewhere(
            f"session {session} lives on server {server or '(unknown)'}",
            details={"server": server, "session": session},
            request_id=request_id,
        )

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

    def replaced(self, home: str, server: str, instance: object) -> list[str]:
        """The address that led to server ``home`` now leads to ``server`` for good (a
        restart under a new id, a replaced Pod behind a Service): every session held or
        followed there is lost, with that reason; the sessions lost."""
        gone = [*self.live, *self.moving]
        previous = (self.instance or "?")[:12]
        now = str(instance)[:12] if isinstance(instance, str) else "?"
        reason = (
            f"the server restarted or was replaced (server {home}, instance {previous}, is "
            f"now server {server}, instance {now}); its episodes are gone"
        )
        for sid in gone:
            self.apply(sid, SessionEvent.GONE, reason=reason)
        return gone


__all__ = ["ERROR_EVENTS", "SESSION_RULES", "SessionBook", "SessionEvent", "SessionFate"]

"""The requests of one client connection: fresh ids, replies matched by id, replay order.

:class:`RequestTracker` is the part of :class:`~corral.protocol.client.ClientProtocol`
that knows which requests wait for a reply: each request gets a fresh id (never reused);
a reply is matched by id, so replies may arrive in any order; a request the caller gave
up on (timeout, cancellation) is *forgotten*, and its reply, if it ever arrives, is
counted as stale and dropped, never taken as the answer to the next call. It also knows
which requests a new socket must carry again (:meth:`RequestTracker.unsent`, oldest
first, with their original ids) and which sessions have a request outstanding (the
``acked`` flag, :meth:`RequestTracker.holds_replies`).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Container
from dataclasses import dataclass

from corral.protocol.batch import ResetBatch, StepBatch
from corral.protocol.codecs import Frame
from corral.protocol.messages import Reply, Request


@dataclass(slots=True)
class Outstanding:
    """A request waiting for its reply.

    Attributes:
        request: the request as built (with its id).
        frame: its encoded frame, kept for re-sending.
        replay: re-send it after a reconnect; False for requests bound to one socket
            (``hello``, ``attach``), which a reconnect issues afresh.
        sent: the socket generation it was last sent on (-1: not sent yet).
    """

    request: Request
    frame: Frame
    replay: bool = True
    sent: int = -1

    @property
    def session(self) -> str | None:
        """The session the request addresses, if it names one (batches name none)."""
        session = getattr(self.request, "session", None)
        return session if isinstance(session, str) else None


BATCHES = (ResetBatch, StepBatch)
"""The requests that name many sessions (tracked by their sets of sessions)."""


def sessions_of(batch: ResetBatch | StepBatch) -> frozenset[str]:
    """The sessions a batch names."""
    return frozenset([item.session for item in batch.items if item.session is not None])


class RequestTracker:
    """Assigns request ids and matches replies to outstanding requests, and knows which
    sessions have one outstanding (for the ``acked`` flag, :meth:`holds_replies`)."""

    def __init__(self, start: int = 1) -> None:
        self._ids = itertools.count(start)
        self._pending: dict[int, Outstanding] = {}
        # Sessions with outstanding requests: single-session requests counted by session,
        # batches by their sets (a connection has a few batches out, and a batch's set is
        # checked and built in C, not item by item).
        self._singles: dict[str, int] = {}
        self._batches: dict[int, frozenset[str]] = {}
        self.stale = 0
        """How many replies arrived for requests no longer waited for."""

    def next_id(self) -> int:
        """A fresh request id (never reused)."""
        return next(self._ids)

    def holds_replies(self, sessions: Collection[str]) -> bool:
        """True when no request of ``sessions`` is outstanding: this side holds the reply
        of every request it sent them (a new request may say so, ``acked``)."""
        if not self._singles.keys().isdisjoint(sessions):
            return False
        return all(pending.isdisjoint(sessions) for pending in self._batches.values())

    def add(
        self,
        request: Request,
        frame: Frame,
        *,
        replay: bool = True,
        batch_sessions: frozenset[str] | None = None,
    ) -> Outstanding:
        """Mark ``request`` outstanding until its reply (or :meth:`forget`);
        ``batch_sessions``: a batch's sessions, when the caller has them already."""
        entry = Outstanding(request, frame, replay)
        rid = request.id
        self._pending[rid] = entry
        if isinstance(request, BATCHES):
            self._batches[rid] = sessions_of(request) if batch_sessions is None else batch_sessions
        else:
            session = entry.session
            if session is not None:
                self._singles[session] = self._singles.get(session, 0) + 1
        return entry

    def _drop(self, entry: Outstanding) -> None:
        if self._batches.pop(entry.request.id, None) is not None:
            return
        session = entry.session
        if session is not None:
            left = self._singles.get(session, 0) - 1
            if left > 0:
                self._singles[session] = left
            else:
                self._singles.pop(session, None)

    def get(self, request_id: int) -> Outstanding | None:
        """The outstanding request ``request_id``, if it still waits."""
        return self._pending.get(request_id)

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id`` (e.g. after a timeout)."""
        entry = self._pending.pop(request_id, None)
        if entry is not None:
            self._drop(entry)

    def forget_all(self) -> list[int]:
        """Stop waiting for everything; return the ids that were outstanding."""
        ids = list(self._pending)
        self._pending.clear()
        self._singles.clear()
        self._batches.clear()
        return ids

    def outstanding(self) -> dict[int, str]:
        """The ids (and request types) still waiting for a reply."""
        return {rid: entry.request.type for rid, entry in self._pending.items()}

    def unsent(self, generation: int) -> list[Outstanding]:
        """Replayable requests not yet sent on socket ``generation``, oldest first."""
        return [
            entry
            for _, entry in sorted(self._pending.items())
            if entry.replay and entry.sent != generation
        ]

    def bound_to_socket(self) -> list[int]:
        """Ids of outstanding requests that die with their socket (not replayable)."""
        return [rid for rid, entry in self._pending.items() if not entry.replay]

    def of_sessions(self, sessions: Container[str]) -> list[int]:
        """Ids of outstanding requests addressing any of ``sessions``."""
        return [rid for rid, entry in self._pending.items() if entry.session in sessions]

    def match(self, reply: Reply) -> Outstanding | None:
        """The request ``reply`` answers (no longer outstanding), or None: unsolicited
        (an error without id) or stale (counted)."""
        if reply.id is None:
            return None
        entry = self._pending.pop(reply.id, None)
        if entry is None:
            self.stale += 1
        else:
            self._drop(entry)
        return entry


__all__ = ["BATCHES", "Outstanding", "RequestTracker", "sessions_of"]

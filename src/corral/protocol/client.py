"""Client-side bookkeeping of requests and replies, sans I/O.

Each request gets a fresh id; a reply is matched to its request by id, so replies may
arrive in any order. A request the caller gave up on (timeout) is *forgotten*: its reply,
if it ever arrives, is counted as stale and dropped, never taken as the answer to the
next call. This is what keeps a slow step from shifting every later reply by one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from corral.errors import BadMessage, CorralError, error_from_wire


@dataclass(slots=True)
class Reply:
    """A reply matched to its request."""

    request_id: int
    message: dict[str, Any]

    @property
    def type(self) -> str:
        """The reply's message type."""
        return str(self.message.get("type"))

    def error(self) -> CorralError | None:
        """The exception this reply carries, if it is an error reply."""
        if self.type != "error":
            return None
        return error_from_wire(self.message, self.request_id)


class RequestTracker:
    """Assigns request ids and matches replies to outstanding requests."""

    def __init__(self, start: int = 1) -> None:
        self._ids = itertools.count(start)
        self._pending: dict[int, str] = {}
        self.stale = 0
        """How many replies arrived for requests no longer waited for."""

    def new(self, kind: str) -> int:
        """Reserve an id for a request of ``kind`` and mark it outstanding."""
        request_id = next(self._ids)
        self._pending[request_id] = kind
        return request_id

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id`` (e.g. after a timeout)."""
        self._pending.pop(request_id, None)

    def outstanding(self) -> dict[int, str]:
        """The ids (and kinds) still waiting for a reply."""
        return dict(self._pending)

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

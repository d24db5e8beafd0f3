"""How a server connection ends, and what it does with replies its peer does not read.

One policy for every server transport (the native picows link, the ASGI ``/ws`` route):

* **close codes** (:class:`Closing`, :func:`clean_close`): a close the *client* began
  with 1000 or 1001 is clean (its sessions are freed at once); any other ending — a
  code the server chose, a cut socket — keeps the sessions for ``resume_window_s``, so a
  client that reconnects finds them;
* **back-pressure** (:class:`Outflow`): replies wait in the connection's write buffer.
  Past :attr:`Outflow.high` unread bytes the transport stops reading from that peer (TCP
  then pushes back on it) and reads again at or below :attr:`Outflow.low`; past
  :attr:`Outflow.limit` (``ServerConfig.max_outgoing_bytes``) the connection is closed
  with 1008 (:meth:`Outflow.overflow`), so a client that sends and never reads cannot
  grow the server's memory.

The faces only measure their buffer and render the decision (pause, resume, a close
frame); no number or code here is written twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class CloseCode(IntEnum):
    """The RFC 6455 close codes a corral server sends (§7.4.1)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    INVALID_DATA = 1007
    """A text message that is not UTF-8."""
    POLICY_VIOLATION = 1008
    """The peer broke a limit other than size: unread replies, a deadline."""
    MESSAGE_TOO_BIG = 1009
    SERVICE_RESTART = 1012
    """The server is stopping; the client reconnects and resumes its sessions."""
    TRY_AGAIN_LATER = 1013
    """The server is short of a shared resource now (the budget of unfinished messages)."""


CLEAN_CLOSE = frozenset({CloseCode.NORMAL, CloseCode.GOING_AWAY})
"""Close codes that end a connection's sessions at once when the client sends them."""

REASON_BYTES = 123
"""The longest close reason a close frame carries (125 bytes less the code)."""


def clean_close(code: int | None) -> bool:
    """Whether a close the client began with ``code`` frees its sessions at once."""
    return code in CLEAN_CLOSE


@dataclass(frozen=True, slots=True)
class Closing:
    """A decision to close a connection: its code, the reason the peer reads, and the
    label the server's metrics count it under (None: not counted).
    """

    code: int
    reason: str
    counted: str | None = None

    def reason_bytes(self) -> bytes:
        """The reason as a close frame carries it: UTF-8, cut whole characters to fit."""
        data = self.reason.encode()
        if len(data) <= REASON_BYTES:
            return data
        return data[:REASON_BYTES].decode(errors="ignore").encode()


SHUTDOWN = Closing(CloseCode.SERVICE_RESTART, "server shutting down")
"""How a stopping server closes its connections: the clients resume elsewhere or later."""

HIGH_WATER = 1024 * 1024
"""Unread reply bytes past which a connection stops reading from its peer (at most half
of the limit)."""


@dataclass(frozen=True, slots=True)
class Outflow:
    """The back-pressure bounds of one server's connections.

    Args:
        limit: unread reply bytes a connection may hold (``max_outgoing_bytes``); past it
            the connection is closed.
    """

    limit: int

    @property
    def high(self) -> int:
        """Unread bytes past which the transport stops reading from the peer."""
        return min(HIGH_WATER, self.limit // 2)

    @property
    def low(self) -> int:
        """Unread bytes at or below which it reads again."""
        return self.high // 4

    def overflowed(self, unread: int) -> bool:
        """Whether ``unread`` reply bytes are past the limit (close with :meth:`overflow`)."""
        return unread > self.limit

    def overflow(self) -> Closing:
        """The close of a connection whose peer left :attr:`limit` bytes of replies unread."""
        return Closing(
            CloseCode.POLICY_VIOLATION,
            f"replies unread past {self.limit} bytes; read your replies",
            "SLOW_CONSUMER",
        )


__all__ = [
    "CLEAN_CLOSE",
    "HIGH_WATER",
    "REASON_BYTES",
    "SHUTDOWN",
    "CloseCode",
    "Closing",
    "Outflow",
    "clean_close",
]

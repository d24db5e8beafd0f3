"""A connection's incoming messages: fragments reassembled, bounded in size, in time and
in total across connections.

Whatever parses the frames (picows, websockets' parser under uvicorn, corral's own
client reader), what is done with them is decided here, once:

* :class:`Reassembler` — a fragmented message's parts, held until its last frame: a new
  message inside an unfinished one, or a continuation with none open, is a protocol error
  (1002); a message longer than ``max_size`` is refused as soon as its parts say so
  (1009). Client and server both use it.
* :class:`PartialBudget` — the bytes of *unfinished* fragmented messages that all of a
  server's connections hold together. A fragment that would pass it closes its own
  connection with 1013 (try again later); whole messages never count. So a crowd of
  peers each parking a message one fragment short holds at most the budget, not
  ``connections x max_size``.
* :class:`Inflow` — one server connection's deadlines, checked by a periodic sweep the
  I/O face runs (one timer per server, none per frame): a fragmented message must be
  whole within ``message_timeout_s`` of its first fragment; and a frame must arrive
  whole: a connection that completes no frame for half of ``frame_timeout_s`` is
  pinged (:data:`PROBE`) — a peer in the middle of a frame cannot answer — and if still
  no frame completes in the other half it is closed (1008). An idle, healthy peer
  answers the ping and is never disturbed; while the server itself has stopped reading
  from the peer (back-pressure) no deadline runs.

The face's only per-frame work is counting frames (an integer it passes to
:meth:`Inflow.check`); everything timed happens in the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from corral.protocol.outflow import CloseCode, Closing

CONTINUATION, TEXT, BINARY = 0x0, 0x1, 0x2
"""The data opcodes of RFC 6455 (§5.2)."""


class Refused(Exception):
    """The frame breaks a rule: close the connection as :attr:`closing` says."""

    def __init__(self, closing: Closing) -> None:
        super().__init__(closing.reason)
        self.closing = closing


class Assembled(NamedTuple):
    """A whole message: its kind, its bytes, and whether its first frame was compressed
    (RSV1, permessage-deflate: the face inflates it)."""

    text: bool
    data: bytes
    compressed: bool


class PartialBudget:
    """The bytes of unfinished fragmented messages a server holds, across connections.

    Args:
        limit: the most held at once (None: no bound).
    """

    __slots__ = ("held", "limit", "refused")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0
        """Fragments refused because the budget was spent (for metrics and tests)."""

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes, if they fit."""
        if self.limit is not None and self.held + size > self.limit:
            self.refused += 1
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        """Release ``size`` bytes taken before."""
        self.held -= size


class Reassembler:
    """The message a connection is receiving, frame by frame (see the module docstring).

    Args:
        max_size: the longest message, fragments together.
        budget: the server-wide budget its unfinished messages count against.
    """

    __slots__ = (
        "_budget",
        "_compressed",
        "_held",
        "_parts",
        "_text",
        "compression",
        "max_size",
        "pending",
        "size",
        "started",
    )

    def __init__(
        self, max_size: int, budget: PartialBudget | None = None, *, compression: bool = False
    ) -> None:
        self.max_size = max_size
        self.compression = compression
        """permessage-deflate was agreed: a message's first frame may carry RSV1."""
        self._budget = budget
        self._parts: list[bytes] = []
        self._text = False
        self._compressed = False
        self._held = 0
        self.pending = False
        """A fragmented message has begun and not ended (a plain attribute: the faces
        read it on every frame)."""
        self.size = 0
        """Bytes of the unfinished message so far."""
        self.started = 0.0
        """When its first fragment arrived (the ``now`` given to :meth:`feed`)."""

    def feed(
        self, opcode: int, fin: bool, payload: bytes, compressed: bool = False, now: float = 0.0
    ) -> Assembled | None:
        """Take one data frame; return the message it completes, or None.

        Raises:
            Refused: the frame breaks RFC 6455's fragmentation rules (1002), makes the
                message longer than :attr:`max_size` (1009), or would pass the server's
                budget of unfinished messages (1013). The unfinished message is dropped.
        """
        if opcode == CONTINUATION:
            if not self.pending:
                raise Refused(_protocol_error("a continuation frame without a start"))
            if compressed:
                self.abandon()
                raise Refused(_protocol_error("RSV1 set on a continuation frame"))
        elif self.pending:
            self.abandon()
            raise Refused(_protocol_error("a new message inside a fragmented one"))
        elif compressed and not self.compression:
            raise Refused(_protocol_error("compressed frame without permessage-deflate"))
        elif fin:
            if len(payload) > self.max_size:
                raise Refused(self._too_big())
            return Assembled(opcode == TEXT, payload, compressed)
        else:
            self.pending = True
            self._text = opcode == TEXT
            self._compressed = compressed
            self.size = 0
            self.started = now
        parts = self._parts
        size = self.size + len(payload)
        if size > self.max_size:
            self.abandon()
            raise Refused(self._too_big())
        if not fin:
            budget = self._budget
            if budget is not None and not budget.take(len(payload)):
                self.abandon()
                raise Refused(
                    Closing(
                        CloseCode.TRY_AGAIN_LATER,
                        "the server holds its limit of unfinished fragmented messages; "
                        "send whole messages, or retry",
                        "PARTIAL_BUDGET",
                    )
                )
            self._held += len(payload)
            self.size = size
            parts.append(payload)
            return None
        parts.append(payload)
        data = b"".join(parts)
        text, packed = self._text, self._compressed
        self.abandon()
        return Assembled(text, data, packed)

    def abandon(self) -> None:
        """Drop the unfinished message (the connection ends, or broke a rule)."""
        if self._held and self._budget is not None:
            self._budget.give(self._held)
        self._held = 0
        self._parts = []
        self.pending = False
        self.size = 0

    def _too_big(self) -> Closing:
        return Closing(
            CloseCode.MESSAGE_TOO_BIG,
            f"message longer than {self.max_size} bytes",
            "FRAME_TOO_LARGE",
        )


def _protocol_error(reason: str) -> Closing:
    return Closing(CloseCode.PROTOCOL_ERROR, reason)


@dataclass(frozen=True, slots=True)
class InflowLimits:
    """The deadlines of a server's incoming frames and messages.

    Args:
        frame_timeout_s: a connection completing no frame for half of this is pinged;
            closed if still none completes in the other half (None: no frame deadline).
        message_timeout_s: a fragmented message must be whole within this of its first
            fragment (None: no deadline).
    """

    frame_timeout_s: float | None
    message_timeout_s: float | None

    @property
    def tick(self) -> float | None:
        """How often a sweep checks the deadlines (None: nothing to check).

        A quarter of the shortest step (half the frame deadline, the message deadline),
        between 50 ms and 5 s: a deadline is kept to within a quarter of itself.
        """
        steps = [t / 2 for t in (self.frame_timeout_s,) if t is not None]
        steps += [t for t in (self.message_timeout_s,) if t is not None]
        if not steps:
            return None
        return min(5.0, max(0.05, min(steps) / 4))


PROBE_PAYLOAD = b"corral-deadline"
"""The payload of the ping a face sends when the sweep says :data:`PROBE`."""


class Probe:
    """The sweep's ask to ping a quiet peer (see :class:`Inflow`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PROBE"


PROBE = Probe()


class Inflow:
    """One server connection's incoming side: its reassembler and its deadlines.

    Args:
        limits: the deadlines.
        assembler: the connection's reassembler (its unfinished message is timed).
        now: the time the connection opened.
    """

    __slots__ = ("_checked", "_probed", "_quiet_since", "_seen", "assembler", "limits")

    def __init__(self, limits: InflowLimits, assembler: Reassembler, now: float) -> None:
        self.limits = limits
        self.assembler = assembler
        self._seen = 0
        self._quiet_since = now
        self._checked = now
        self._probed: float | None = None

    def check(self, now: float, frames: int, paused: bool = False) -> Probe | Closing | None:
        """What the sweep does with this connection at ``now``.

        Args:
            now: the face's clock.
            frames: how many frames the connection has completed so far (any kind).
            paused: the server is not reading from this peer (back-pressure): its
                frames cannot progress, so no deadline runs meanwhile.

        Returns:
            :data:`PROBE` (send a ping), a :class:`Closing`, or None (nothing to do).
        """
        elapsed, self._checked = now - self._checked, now
        assembler = self.assembler
        if paused:
            self._quiet_since = now
            self._probed = None
            if assembler.pending:
                assembler.started += elapsed
            return None
        limit = self.limits.message_timeout_s
        if limit is not None and assembler.pending and now - assembler.started > limit:
            assembler.abandon()
            return Closing(
                CloseCode.POLICY_VIOLATION,
                f"a fragmented message was not whole within {limit:g} s",
                "MESSAGE_TIMEOUT",
            )
        if frames != self._seen:
            self._seen = frames
            self._quiet_since = now
            self._probed = None
            return None
        limit = self.limits.frame_timeout_s
        if limit is None:
            return None
        if self._probed is None:
            if now - self._quiet_since >= limit / 2:
                self._probed = now
                return PROBE
            return None
        if now - self._probed >= limit / 2:
            assembler.abandon()
            return Closing(
                CloseCode.POLICY_VIOLATION,
                f"no frame arrived whole within {limit:g} s (nor a pong)",
                "FRAME_TIMEOUT",
            )
        return None

    def close(self) -> None:
        """The connection is gone: give back what its unfinished message held."""
        self.assembler.abandon()


__all__ = [
    "BINARY",
    "CONTINUATION",
    "PROBE",
    "PROBE_PAYLOAD",
    "TEXT",
    "Assembled",
    "Inflow",
    "InflowLimits",
    "PartialBudget",
    "Probe",
    "Reassembler",
    "Refused",
]

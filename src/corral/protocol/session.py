"""The per-session lifecycle as a state machine, and the at-most-once reply cache.

    NEW --reset--> READY --step(done)--> ENDED --reset--> READY ...
    any --close / lost--> CLOSED

Rules: ``step`` before the first ``reset`` is ``RESET_REQUIRED``; ``step`` after the
episode ended is ``EPISODE_ENDED`` unless the environment auto-resets; any request while
another of the same session runs is ``SESSION_BUSY``; anything after ``CLOSED`` is
``SESSION_LOST`` with the reason it closed.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import StrEnum

from corral.errors import EpisodeEnded, ResetRequired, SessionBusy, SessionLost
from corral.protocol.batch import BatchItemReply
from corral.protocol.messages import Reply

Remembered = Reply | BatchItemReply
"""What a session's reply cache holds: a reply, or one session's item of a batch reply."""


class Phase(StrEnum):
    """Where a session is in its lifecycle."""

    NEW = "new"
    READY = "ready"
    ENDED = "ended"
    CLOSED = "closed"


class Op(StrEnum):
    """What the server must run for an accepted request."""

    RESET = "reset"
    STEP = "step"
    AUTO_RESET = "auto_reset"
    """A step after the episode ended on an auto-reset env: run ``reset`` instead."""
    STATE = "state"


class SessionMachine:
    """Enforces the lifecycle rules of one session; pure logic, no I/O.

    Call :meth:`begin` before running a request; it returns the :class:`Op` to run or
    raises the error to send. Then call :meth:`finish` (with the episode's ``done``) or
    :meth:`abort` (the operation failed and changed nothing).
    """

    def __init__(self, *, auto_reset: bool = False) -> None:
        self.phase = Phase.NEW
        self.auto_reset = auto_reset
        self.running: int | None = None
        self.closed_reason = ""
        self.episodes = 0
        self.steps = 0

    def begin(self, kind: str, request_id: int) -> Op:
        """Admit request ``request_id`` of ``kind`` (reset/step/state) or raise why not."""
        if self.phase is Phase.CLOSED:
            raise SessionLost(
                f"session is closed: {self.closed_reason}", details={"reason": self.closed_reason}
            )
        if self.running is not None:
            raise SessionBusy(
                f"request {self.running} of this session is still running; "
                "wait for its reply before sending another",
                details={"running": self.running},
            )
        if kind == "reset":
            op = Op.RESET
        elif kind == "state":
            op = Op.STATE
        elif self.phase is Phase.NEW:
            raise ResetRequired("call reset() before step(): this session has no episode yet")
        elif self.phase is Phase.ENDED:
            if not self.auto_reset:
                raise EpisodeEnded(
                    "the episode has ended; call reset() to start a new one",
                    details={"episodes": self.episodes},
                )
            op = Op.AUTO_RESET
        else:
            op = Op.STEP
        self.running = request_id
        return op

    def finish(self, op: Op, done: bool = False) -> None:
        """Record that ``op`` completed; ``done`` is the returned observation's flag."""
        self.running = None
        if self.phase is Phase.CLOSED or op is Op.STATE:
            return
        if op in (Op.RESET, Op.AUTO_RESET):
            self.episodes += 1
        else:
            self.steps += 1
        self.phase = Phase.ENDED if done else Phase.READY

    def abort(self) -> None:
        """Record that the running operation failed without changing the episode."""
        self.running = None

    def close(self, reason: str) -> None:
        """Close the session; later requests raise ``SessionLost`` with ``reason``."""
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.CLOSED
            self.closed_reason = reason


class ReplyCache:
    """The most recent replies of a session by request id, for at-most-once retries.

    A client that re-sends a request after a reconnect gets the remembered reply
    instead of the environment running the request twice.
    """

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._replies: OrderedDict[int, Remembered] = OrderedDict()

    def get(self, request_id: int) -> Remembered | None:
        """The reply already sent for ``request_id``, if remembered."""
        return self._replies.get(request_id)

    def put(self, request_id: int, reply: Remembered) -> None:
        """Remember ``reply``; the oldest entry is dropped past ``size``."""
        self._replies[request_id] = reply
        self._replies.move_to_end(request_id)
        while len(self._replies) > self.size:
            self._replies.popitem(last=False)

    def __len__(self) -> int:
        return len(self._replies)

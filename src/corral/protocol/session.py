"""One session, sans I/O: the lifecycle table, the reply cache, and :meth:`admit`.

    NEW --reset--> READY --step(done)--> ENDED --reset--> READY ...
    any --close / lost--> CLOSED

:data:`LIFECYCLE` is the one place that decides what a session may run next (the h11
``_state.py`` school): for each phase and request kind, the operation to run or the
error that refuses it. ``step`` before the first ``reset`` is ``RESET_REQUIRED``;
``step`` after the episode ended is ``EPISODE_ENDED`` unless the environment
auto-resets (then the step runs ``reset``); ``state`` is always allowed; any request
while another of the same session runs is ``SESSION_BUSY``; anything after ``CLOSED`` is
``SESSION_LOST`` with the reason it closed. :data:`AFTER` says where a completed
operation leaves the session.

:meth:`SessionState.admit` is the one door of a request into a session, for single
requests and batch items alike: a request already answered gets its remembered reply
(at most once, across reconnects), a request still running gets nothing new (its reply
is on its way), and anything else goes through the lifecycle table.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Protocol

from corral.errors import EpisodeEnded, ResetRequired, SessionBusy, SessionError, SessionLost
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


Refusal = Callable[["SessionMachine"], SessionError]
"""Builds the error that refuses a request, from the machine it was refused by."""


def _reset_required(_: SessionMachine) -> SessionError:
    return ResetRequired("call reset() before step(): this session has no episode yet")


def _episode_ended(machine: SessionMachine) -> SessionError:
    return EpisodeEnded(
        "the episode has ended; call reset() to start a new one",
        details={"episodes": machine.episodes},
    )


LIFECYCLE: Mapping[Phase, Mapping[str, Op | Refusal]] = MappingProxyType(
    {
        Phase.NEW: {"reset": Op.RESET, "step": _reset_required, "state": Op.STATE},
        Phase.READY: {"reset": Op.RESET, "step": Op.STEP, "state": Op.STATE},
        Phase.ENDED: {"reset": Op.RESET, "step": _episode_ended, "state": Op.STATE},
    }
)
"""Phase → request kind → the operation to run, or the refusal. ``CLOSED`` refuses all."""

AUTO_RESET_LIFECYCLE: Mapping[Phase, Mapping[str, Op | Refusal]] = MappingProxyType(
    {**LIFECYCLE, Phase.ENDED: {**LIFECYCLE[Phase.ENDED], "step": Op.AUTO_RESET}}
)
"""The table of environments that opted into auto-reset: an ended episode's step resets."""

AFTER: Mapping[Op, tuple[Phase, Phase] | None] = MappingProxyType(
    {
        Op.RESET: (Phase.READY, Phase.ENDED),
        Op.AUTO_RESET: (Phase.READY, Phase.ENDED),
        Op.STEP: (Phase.READY, Phase.ENDED),
        Op.STATE: None,
    }
)
"""Operation → the phase it leaves the session in, ``(not done, done)``; None: unchanged."""


class SessionMachine:
    """Enforces the lifecycle rules of one session by :data:`LIFECYCLE`; pure logic.

    Call :meth:`begin` before running a request; it returns the :class:`Op` to run or
    raises the error to send. Then call :meth:`finish` (with the episode's ``done``) or
    :meth:`abort` (the operation failed and changed nothing).
    """

    __slots__ = ("_table", "auto_reset", "closed_reason", "episodes", "phase", "running", "steps")

    def __init__(self, *, auto_reset: bool = False) -> None:
        self.phase = Phase.NEW
        self.auto_reset = auto_reset
        self._table = AUTO_RESET_LIFECYCLE if auto_reset else LIFECYCLE
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
        rule = self._table[self.phase][kind]
        if not isinstance(rule, Op):
            raise rule(self)
        self.running = request_id
        return rule

    def finish(self, op: Op, done: bool = False) -> None:
        """Record that ``op`` completed; ``done`` is the returned observation's flag."""
        self.running = None
        after = AFTER[op]
        if self.phase is Phase.CLOSED or after is None:
            return
        if op is Op.STEP:
            self.steps += 1
        else:
            self.episodes += 1
        self.phase = after[done]

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

    __slots__ = ("_replies", "size")

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


class ReplySink(Protocol):
    """Where a session's replies go: the connection it is attached to."""

    def send(self, reply: Reply) -> None:
        """Deliver ``reply`` (never raises)."""
        ...


@dataclass(eq=False, kw_only=True)
class SessionState:
    """One session as the protocol sees it: identity, lifecycle, replies, owner.

    The server's session (:class:`corral.server.sessions.Session`) adds the
    environment's runner to it; everything that decides lives here.

    Attributes:
        id / token: the session id and the secret a reconnecting client re-attaches with.
        owner: the connection the session answers on; None while detached.
        detached_at: when it lost its connection (``time.monotonic()``), else None.
    """

    id: str
    token: str
    machine: SessionMachine
    cache: ReplyCache
    owner: ReplySink | None
    created: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    detached_at: float | None = None

    def touch(self) -> None:
        """Mark activity now (any request counts, ``state`` included)."""
        self.last_active = time.monotonic()

    def admit(self, kind: str, request_id: int) -> Op | Remembered | None:
        """Decide what request ``request_id`` of ``kind`` gets; the one door in.

        Returns:
            The :class:`Op` to run (the session is now running it); the remembered
            reply of a request already answered (send it again, run nothing); or None
            for a request that is running now (its reply is on its way).

        Raises:
            SessionError: the lifecycle refuses the request (see :data:`LIFECYCLE`).
        """
        cached = self.cache.get(request_id)
        if cached is not None:
            return cached
        if self.machine.running == request_id:
            return None
        return self.machine.begin(kind, request_id)

    def deliver(self, reply: Reply) -> None:
        """Send a reply to the attached connection; remembered for retries either way."""
        if reply.id is not None:
            self.cache.put(reply.id, reply)
        if self.owner is not None:
            self.owner.send(reply)

    def remember(self, request_id: int, item: BatchItemReply) -> None:
        """Remember this session's item of batch ``request_id`` (sent in the batch reply)."""
        self.cache.put(request_id, item)

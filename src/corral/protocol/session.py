"""One session, sans I/O: the lifecycle table, the reply cache, and :meth:`admit`.

    NEW --reset--> READY --step(done)--> ENDED --reset--> READY ...
    any --close / lost--> CLOSED

:data:`LIFECYCLE` is the one place that decides what a session may run next (the h11
``_state.py`` school): for each phase and request kind, the operation to run or the
error that refuses it. ``step`` before the first ``reset`` is ``RESET_REQUIRED``;
``step`` after the episode ended is ``EPISODE_ENDED`` unless the environment
auto-resets (then the step runs ``reset``); ``autoreset``, the same-step reset a
``step_batch`` may ask for once an item's step ended its episode (see
:mod:`corral.protocol.batch`), runs ``reset`` as a reset would; ``state`` and
``snapshot`` are always allowed and change nothing; any request
while another of the same session runs is ``SESSION_BUSY``; anything after ``CLOSED`` is
``SESSION_LOST`` with the reason it closed. :data:`AFTER` says where a completed
operation leaves the session. A session restored from a snapshot starts where the
snapshotted one was (:class:`Position`, :meth:`SessionMachine.restored`).

:meth:`SessionState.admit` is the one door of a request into a session, for single
requests and batch items alike: a request already answered gets its remembered reply
(at most once, across reconnects), a request still running gets nothing new (its reply
is on its way), and anything else goes through the lifecycle table. A remembered request
is a replay only when the new one is the same request: equal in kind and payload
(:func:`same_request`); another request under an answered or running id is
``REQUEST_ID_REUSED``, never the old reply.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import islice
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from corral.errors import (
    EpisodeEnded,
    RequestIdReused,
    ResetRequired,
    SessionBusy,
    SessionError,
    SessionLost,
)
from corral.protocol.codecs import MsgpackCodec
from corral.protocol.position import Phase, Position

if TYPE_CHECKING:
    # Only for annotations: the reply types are what a session remembers, and the
    # server's connection (not this module) builds and sends them.
    from corral.protocol.batch import BatchItemReply
    from corral.protocol.messages import Reply

Remembered: TypeAlias = "Reply | BatchItemReply"
"""What a session's reply cache holds: a reply, or one session's item of a batch reply."""


class Op(StrEnum):
    """What the server must run for an accepted request."""

    RESET = "reset"
    STEP = "step"
    AUTO_RESET = "auto_reset"
    """A step after the episode ended on an auto-reset env, or the same-step reset of a
    ``step_batch`` with ``autoreset``: run ``reset`` with no options, and no seed but
    the item's ``reset_seed``."""
    STATE = "state"
    SNAPSHOT = "snapshot"
    """Capture the environment's state (:mod:`corral.contract.snapshot`)."""
    RESTORE = "restore"
    """Rebuild a snapshot's state in a new session's environment (no lifecycle row: a
    restore opens a session, it is not a request of one)."""


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
        Phase.NEW: {
            "reset": Op.RESET,
            "step": _reset_required,
            "autoreset": Op.AUTO_RESET,
            "state": Op.STATE,
            "snapshot": Op.SNAPSHOT,
        },
        Phase.READY: {
            "reset": Op.RESET,
            "step": Op.STEP,
            "autoreset": Op.AUTO_RESET,
            "state": Op.STATE,
            "snapshot": Op.SNAPSHOT,
        },
        Phase.ENDED: {
            "reset": Op.RESET,
            "step": _episode_ended,
            "autoreset": Op.AUTO_RESET,
            "state": Op.STATE,
            "snapshot": Op.SNAPSHOT,
        },
    }
)
"""Phase → request kind → the operation to run, or the refusal. ``CLOSED`` refuses all.

``autoreset`` is no message of its own: it is the same-step reset a ``step_batch`` with
``"autoreset": true`` asks for, admitted under the batch's request id right after the
item's step finished with ``done``. Allowed wherever a reset is (it is one, with no
options, seeded by the item's ``reset_seed`` if any); only a closed or busy session
refuses it."""

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
        Op.SNAPSHOT: None,
        Op.RESTORE: None,
    }
)
"""Operation → the phase it leaves the session in, ``(not done, done)``; None: unchanged."""


class SessionMachine:
    """Enforces the lifecycle rules of one session by :data:`LIFECYCLE`; pure logic.

    Call :meth:`begin` before running a request; it returns the :class:`Op` to run or
    raises the error to send. Then call :meth:`finish` (with the episode's ``done``) or
    :meth:`abort` (the operation failed and changed nothing).
    """

    __slots__ = (
        "_table",
        "auto_reset",
        "closed_reason",
        "episode_start",
        "episodes",
        "phase",
        "running",
        "steps",
    )

    def __init__(self, *, auto_reset: bool = False) -> None:
        self.phase = Phase.NEW
        self.auto_reset = auto_reset
        self._table = AUTO_RESET_LIFECYCLE if auto_reset else LIFECYCLE
        self.running: int | None = None
        self.closed_reason = ""
        self.episodes = 0
        self.steps = 0
        self.episode_start = 0
        """``steps`` when the current episode began (its step count is the difference)."""

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
            self.episode_start = self.steps
        self.phase = after[done]

    def abort(self) -> None:
        """Record that the running operation failed without changing the episode."""
        self.running = None

    def position(self) -> Position:
        """Where the session is (what a snapshot of it carries)."""
        return Position(self.phase, self.episodes, self.steps, self.steps - self.episode_start)

    @classmethod
    def restored(cls, position: Position, *, auto_reset: bool = False) -> SessionMachine:
        """The machine of a session restored at ``position`` (checked by the caller,
        :meth:`Position.problem`)."""
        machine = cls(auto_reset=auto_reset)
        machine.phase = position.phase
        machine.episodes = position.episodes
        machine.steps = position.steps
        machine.episode_start = position.steps - position.episode_steps
        return machine

    def close(self, reason: str) -> None:
        """Close the session; later requests raise ``SessionLost`` with ``reason``."""
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.CLOSED
            self.closed_reason = reason


RequestKey = tuple[str, Any]
"""What makes two requests of one session the same request: ``(kind, payload)``.

``kind`` is the message type (``step``, ``step_batch``, ...), so a batch item and a
single request under one id differ; ``payload`` is the action, ``(seed, options)`` or
None, as decoded from the wire.
"""


_CANONICAL = MsgpackCodec()
"""Payload bytes for comparing two payloads that ``==`` cannot (arrays, NaN)."""


def same_request(a: RequestKey, b: RequestKey) -> bool:
    """True when ``a`` and ``b`` are the same request (a re-send, not a reuse of its id).

    Payloads compare equal as decoded values; failing that (or when comparing raises,
    as numpy arrays do), by their msgpack bytes, so a re-sent payload holding NaN (never
    equal to itself) or an array is still the same request.
    """
    if a[0] != b[0]:
        return False
    with contextlib.suppress(Exception):
        if a[1] == b[1]:
            return True
    with contextlib.suppress(Exception):
        return _CANONICAL.encode({"p": a[1]}) == _CANONICAL.encode({"p": b[1]})
    return False


def reused_id(request_id: int, kind: str, earlier: str) -> RequestIdReused:
    """The error for request ``request_id`` (``kind``) that is not the request the
    session knows under that id (``earlier``)."""
    what = f"another {kind!r} request" if kind == earlier else f"a {earlier!r} request"
    return RequestIdReused(
        f"request id {request_id} was already used by {what} of this session; only an "
        "identical re-send is a replay: use a fresh id for a new request",
        details={"id": request_id, "earlier": earlier, "now": kind},
    )


def answered_id(request_id: int, kind: str, acked: int) -> RequestIdReused:
    """The error for request ``request_id`` (``kind``) below the session's acknowledged
    id ``acked``: it was answered, the client said it holds the reply, and the reply is
    forgotten; running it again would break at-most-once."""
    return RequestIdReused(
        f"request id {request_id} of this session was answered and its reply acknowledged "
        f"(a later request, id {acked}, said 'acked'); it is not run twice: use a fresh id "
        "for a new request",
        details={"id": request_id, "now": kind, "acked": acked, "reason": "acked"},
    )


class ReplyCache:
    """The most recent replies of a session by request id, for at-most-once retries.

    A client that re-sends a request after a reconnect gets the remembered reply
    instead of the environment running the request twice. Each reply is kept with
    the :data:`RequestKey` of its request, to tell a re-send from a reused id.

    Past ``size`` entries the oldest quarter goes at once: every batch item and reply
    comes here, and one eviction in ``size // 4`` puts is cheaper than one each (a plain
    dict keeps insertion order; no linked list to maintain). Between ``3/4 size`` and
    ``size`` replies stay remembered.

    Replies forgotten because the client acknowledged them (:meth:`forget_before`) are
    still known to have been answered: :attr:`acked` is the highest acknowledging
    request id, and every lower id of the session was answered and its reply received
    (what ``acked`` says), so a re-send of one is refused rather than run again. One
    int, whatever the number of forgotten ids.
    """

    __slots__ = ("_replies", "acked", "lookup", "size")

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.acked = 0
        """The highest id of a request that said ``acked``: every lower id of this
        session was answered, and the client holds its reply."""
        # Until its first reply a session shares one empty table (a server holds 100,000
        # sessions; most of them hold one reply at a time, many none yet).
        self._replies: dict[int, tuple[RequestKey | None, Remembered]] = _NO_REPLIES
        self.lookup: Callable[[int], tuple[RequestKey | None, Remembered] | None] = _NO_REPLIES.get
        """The request key and reply remembered for a request id, if any: the dict's
        own ``get``, so the check every request and batch item makes costs no frame."""

    def get(self, request_id: int) -> Remembered | None:
        """The reply already sent for ``request_id``, if remembered."""
        entry = self._replies.get(request_id)
        return None if entry is None else entry[1]

    def put(self, request_id: int, reply: Remembered, key: RequestKey | None = None) -> None:
        """Remember ``reply`` (of the request ``key``, when known) as the newest entry;
        the oldest go past ``size`` (see the class docstring)."""
        replies = self._replies
        if replies is _NO_REPLIES:
            replies = self._replies = {}
            self.lookup = replies.get
        elif request_id in replies:  # a new id goes to the end by itself (the common case)
            del replies[request_id]
        replies[request_id] = (key, reply)
        excess = len(replies) - self.size
        if excess > 0:
            for old in list(islice(replies, excess + self.size // 4)):
                del replies[old]

    def forget_before(self, request_id: int) -> None:
        """Drop the replies of requests older than ``request_id``: the client said it holds
        them (an ``acked`` request), so none can be re-sent.

        Replies go oldest first while their ids are lower (a client numbers its requests
        in order); one re-remembered out of order merely stays until evicted. Forgetting a
        reply one round old, rather than ``size`` rounds old, is what keeps the cache's
        memory warm: with 1,024 sessions, eight remembered replies each were megabytes
        swept through the CPU's caches every round (issue 10's flatness).
        """
        if request_id > self.acked:
            self.acked = request_id
        replies = self._replies
        while replies:
            oldest = next(iter(replies))
            if oldest >= request_id:
                return
            del replies[oldest]

    def __len__(self) -> int:
        return len(self._replies)


_NO_REPLIES: dict[int, Any] = {}
"""The reply table of every session that has remembered none yet (never written to)."""


class ReplySink(Protocol):
    """Where a session's replies go: the connection it is attached to."""

    def send(self, reply: Reply) -> None:
        """Deliver ``reply`` (never raises)."""
        ...


@dataclass(eq=False, kw_only=True, slots=True)
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
    running_key: RequestKey | None = None
    """The request key of the request admitted last (the running one, while one runs)."""
    client: str = ""
    """The address of the client that opened it (it counts in that client's limit)."""

    def touch(self, now: float | None = None) -> None:
        """Mark activity now (any request counts, ``state`` included); ``now`` is
        ``time.monotonic()`` when the caller read it already (once for a batch)."""
        self.last_active = time.monotonic() if now is None else now

    def admit(
        self, kind: str, request_id: int, key: RequestKey, acked: bool = False
    ) -> Op | Remembered | None:
        """Decide what request ``request_id`` of ``kind`` gets; the one door in.

        ``key`` is the request's :data:`RequestKey`: only a request with the same key
        as the one remembered (or running) under ``request_id`` is a re-send. ``acked``:
        the client holds the replies of the session's earlier requests, which are
        forgotten first (:meth:`ReplyCache.forget_before`).

        Returns:
            The :class:`Op` to run (the session is now running it); the remembered
            reply of a request already answered (send it again, run nothing); or None
            for a request that is running now (its reply is on its way).

        Raises:
            RequestIdReused: ``request_id`` belongs to another request of the session,
                or is below an acknowledged one (:attr:`ReplyCache.acked`): answered, its
                reply forgotten, and never run twice.
            SessionError: the lifecycle refuses the request (see :data:`LIFECYCLE`).
        """
        cache = self.cache
        if acked:
            cache.forget_before(request_id)
        entry = cache.lookup(request_id)
        if entry is not None:
            earlier, reply = entry
            if earlier is not None and not same_request(earlier, key):
                raise reused_id(request_id, key[0], earlier[0])
            return reply
        if self.machine.running == request_id:
            running = self.running_key
            if running is not None and not same_request(running, key):
                raise reused_id(request_id, key[0], running[0])
            return None
        if request_id < cache.acked:
            raise answered_id(request_id, kind, cache.acked)
        op = self.machine.begin(kind, request_id)
        self.running_key = key
        return op

    def end(self, request_id: int) -> None:
        """Whatever happened, request ``request_id`` no longer runs: if the session still
        counts it as running (it failed before :meth:`SessionMachine.finish`), abort it.

        The one structural release of a call (see :class:`ending`).
        """
        if self.machine.running == request_id:
            self.machine.abort()

    def deliver(self, reply: Reply, *, remember: bool = True) -> None:
        """Send a reply to the attached connection; remembered for retries either way,
        unless ``remember`` is False: the answer to a request refused before the
        environment ran (an invalid action), which a re-send gets again without anything
        running twice, and whose payload (up to a frame) the cache would only hold on to."""
        if reply.id is not None:
            key = self._key_of(reply.id)
            if remember:
                self.cache.put(reply.id, reply, key)
            elif key is not None:
                self.running_key = None  # the refused request's payload goes with it
        if self.owner is not None:
            self.owner.send(reply)

    def remember(self, request_id: int, item: BatchItemReply) -> None:
        """Remember this session's item of batch ``request_id`` (sent in the batch reply)."""
        self.cache.put(request_id, item, self._key_of(request_id))

    def _key_of(self, request_id: int) -> RequestKey | None:
        # The reply answers the request admitted last (one request runs at a time), unless
        # a newer one was admitted since; then nothing is known of its payload.
        running = self.machine.running
        return self.running_key if running is None or running == request_id else None


class ending:
    """``with ending(sessions, request_id):`` runs a call of ``sessions``; whatever happens
    inside, none of them is left running request ``request_id`` after the block.

    The one structural release of an admitted call, for single requests and batches
    alike: a failure anywhere after :meth:`SessionState.admit` (option checks, a bug,
    cancellation) aborts the call (:meth:`SessionState.end`) instead of leaving the
    session ``SESSION_BUSY`` for good (the reaper skips running sessions). A call that
    finished normally was already released by :meth:`SessionMachine.finish`.
    """

    __slots__ = ("request_id", "sessions")

    def __init__(self, sessions: Iterable[SessionState], request_id: int) -> None:
        self.sessions = sessions
        self.request_id = request_id

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for session in self.sessions:
            session.end(self.request_id)

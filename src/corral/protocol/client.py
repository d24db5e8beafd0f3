"""The client side of one ``corral/1`` connection, sans I/O.

:class:`ClientProtocol` makes every decision of a client connection; the socket code
around it (:mod:`corral.client.connection`, or any other transport) only writes the
frames it returns, feeds it the frames that arrive, and tells it when the socket opened
or dropped. It keeps:

* **request tracking** (:class:`RequestTracker`): each request gets a fresh id; a reply
  is matched by id, so replies may arrive in any order. A request the caller gave up on
  (timeout, cancellation) is *forgotten*: its reply, if it ever arrives, is counted as
  stale and dropped, never taken as the answer to the next call. Ids are never reused.
* **the session book** (:class:`SessionBook`): the live sessions with their resume
  tokens, the server instance they live on, and the sessions known to be gone (a request
  for one fails at once with :class:`~corral.errors.SessionLost` and the reason).
* **the reconnect plan.** When an open connection drops, requests bound to that socket
  (``hello``, ``attach``) fail; the others stay outstanding. On the next socket,
  after ``hello``/``welcome``: a new server instance loses every session (its episodes
  are gone); each live session is re-attached with its token (one the server no longer
  has is lost); the requests of lost sessions fail with ``SessionLost``; and every
  request still unanswered is re-sent *with its original id*, so the server's reply
  cache answers one it already ran (at most once) and runs one it never saw (never
  lost). Requests sent while the connection is being re-established wait for that
  re-send. The backoff between attempts (:class:`ReconnectPolicy`) and when to give up
  are decided here too.

The object never blocks and never reads a clock: a transport passes ``now`` where time
matters and fires the delays it is given. Frames are encoded and decoded with the
connection's codec; replies come out typed (:mod:`corral.protocol.messages`), an error
reply already turned into its exception.

The tracker, the session book and the backoff policy are in this module with the object
because they are its state and are never used without it (~680 lines in all).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

from corral.errors import (
    BadMessage,
    CapacityReached,
    ClientClosed,
    ConnectionLost,
    CorralError,
    ErrorCode,
    FrameTooLarge,
    RequestTimeout,
    SessionLost,
    TooManyConnections,
    Unauthorized,
    UnknownSession,
)
from corral.protocol.batch import BatchReply, ResetBatch, StepBatch
from corral.protocol.codecs import PROTOCOL, Codec, Frame
from corral.protocol.handshake import MAX_RESUME_IDS
from corral.protocol.messages import (
    Attach,
    Attached,
    Close,
    Closed,
    ContractRef,
    ErrorReply,
    GetState,
    Hello,
    Open,
    Opened,
    Reply,
    Request,
    Reset,
    Restore,
    Restored,
    Result,
    SnapshotReply,
    StateReply,
    Step,
    TakeSnapshot,
    Welcome,
    parse_reply,
)

_ANSWERS: dict[str, tuple[type[Reply], ...]] = {
    Hello.type: (Welcome,),
    Open.type: (Opened,),
    Attach.type: (Attached,),
    Reset.type: (Result,),
    Step.type: (Result,),
    GetState.type: (StateReply,),
    Close.type: (Closed,),
    TakeSnapshot.type: (SnapshotReply,),
    Restore.type: (Restored,),
    ResetBatch.type: (BatchReply,),
    StepBatch.type: (BatchReply,),
}
"""The reply type that answers each request type (besides ``error``)."""

_RETRYABLE = (ConnectionLost, RequestTimeout, CapacityReached, TooManyConnections)
"""Failures of a reconnect attempt worth another attempt; anything else is final."""


@dataclass(frozen=True)
class ReconnectPolicy:
    """How a dropped connection is re-established: exponential backoff with jitter.

    The wait before attempt ``n`` (from 0) is ``min(max_delay_s, initial_delay_s *
    multiplier**n)``, of which a random fraction up to ``jitter`` is taken off, so that
    many clients cut at the same moment do not all come back in the same instant.

    Attributes:
        initial_delay_s: wait before the first attempt.
        max_delay_s: longest wait between two attempts.
        multiplier: growth of the wait after each failed attempt.
        jitter: the largest fraction of a wait removed at random (0 to 1).
        max_attempts: attempts before giving up (None: bounded by time only).
        give_up_after_s: total time budget; past it, every waiting request fails with
            ``ConnectionLost``. Matches the server's default resume window, after which
            the sessions would be gone anyway.
    """

    initial_delay_s: float = 0.05
    max_delay_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_attempts: int | None = None
    give_up_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.initial_delay_s < 0 or self.max_delay_s < self.initial_delay_s:
            raise ValueError(
                "ReconnectPolicy needs 0 <= initial_delay_s <= max_delay_s, got "
                f"{self.initial_delay_s} and {self.max_delay_s}"
            )
        if self.multiplier < 1:
            raise ValueError(f"ReconnectPolicy.multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"ReconnectPolicy.jitter must be within [0, 1], got {self.jitter}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"ReconnectPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.give_up_after_s <= 0:
            raise ValueError(
                f"ReconnectPolicy.give_up_after_s must be > 0, got {self.give_up_after_s}"
            )

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt`` (0-based)."""
        base = self.initial_delay_s
        for _ in range(attempt):  # a loop, not a power: no float overflow after many attempts
            base = min(self.max_delay_s, base * self.multiplier)
            if base >= self.max_delay_s:
                break
        return base * (1.0 - self.jitter * rng.random())


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


_BATCHES = (ResetBatch, StepBatch)
_ACKING = (Reset, Step)
"""The single-session requests that carry ``acked`` (a ``state`` changes nothing worth
re-sending; ``attach``/``close`` are not steps of an episode)."""


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
        if isinstance(request, _BATCHES):
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

    def of_sessions(self, sessions: set[str] | dict[str, str]) -> list[int]:
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


class SessionBook:
    """The sessions one connection carries: live ones (with tokens) and lost ones.

    Fed with every matched reply (:meth:`observe`), it learns sessions from ``opened``,
    ``restored`` and ``attached`` replies, drops them on ``closed``, and marks them lost when the
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

    def observe(self, reply: Reply) -> None:
        """Learn from one matched reply."""
        if isinstance(reply, (Opened, Attached, Restored)):
            self.live[reply.session] = reply.token
            self.lost.pop(reply.session, None)
        elif isinstance(reply, Closed):
            self.live.pop(reply.session, None)
        elif isinstance(reply, ErrorReply) and reply.session is not None:
            if reply.code == ErrorCode.SESSION_LOST:
                self.lose(reply.session, str(reply.details.get("reason") or reply.message))
            elif reply.code == ErrorCode.STEP_TIMEOUT:
                self.lose(reply.session, "a call overran the server's step timeout")

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


class AfterLoss(Enum):
    """What the transport does after a socket dropped (see :meth:`ClientProtocol.lost`)."""

    NOTHING = "nothing"
    """The socket was not open yet: the connect attempt in progress sees the failure."""
    RECONNECT = "reconnect"
    """Start re-establishing (backoff from :meth:`ClientProtocol.retry_delay`)."""
    FAIL = "fail"
    """No reconnects: fail every waiting request with the loss."""


@dataclass(slots=True)
class Loss:
    """A dropped socket: the requests that died with it, and what to do next."""

    error: ConnectionLost
    failed: list[int]
    """Ids of the socket-bound requests that fail with :attr:`error`."""
    then: AfterLoss


@dataclass(slots=True)
class Answer:
    """A reply matched to its request: the typed reply, or the error it carries."""

    request_id: int
    reply: Reply | None
    error: CorralError | None


class ClientProtocol:
    """The state and decisions of one client connection, across its sockets.

    Args:
        codec: the connection's codec.
        reconnect: the backoff policy; None to fail every waiting request at the first
            drop instead.
        client: what the ``hello`` names as the client (``corral/VERSION``).
        seed: seeds the backoff jitter (tests).
        accept_frame_bytes: the largest frame this side's socket takes, announced in
            the ``hello`` so that the server answers a larger reply with an error
            (``REPLY_TOO_LARGE``) instead of a frame the socket would drop (None: any).
    """

    def __init__(
        self,
        codec: Codec,
        *,
        reconnect: ReconnectPolicy | None = None,
        client: str = "",
        seed: int | None = None,
        accept_frame_bytes: int | None = None,
    ) -> None:
        self.codec = codec
        self.accept_frame_bytes = accept_frame_bytes
        self.policy = reconnect
        self.client = client
        self.tracker = RequestTracker()
        self.sessions = SessionBook()
        self.welcome: Welcome | None = None
        """The last ``welcome`` (schemas kept from an earlier one that had them)."""
        self.generation = 0
        """The current socket's number; each socket of this connection gets the next."""
        self.open = False
        """The socket is up, the handshake and the resume done."""
        self.resuming = False
        """A dropped connection is being re-established: new requests wait for it."""
        self.failed: CorralError | None = None
        """Why the connection gave up (requests fail with it until the next connect)."""
        self.closed = False
        self.reconnects = 0
        """Successful reconnects so far."""
        self.resent = 0
        """Requests re-sent with their original id after a reconnect."""
        self._lost_generation = 0
        self._rng = random.Random(seed)
        self._attempt = 0
        self._resume_started = 0.0

    @property
    def connected(self) -> bool:
        """Open, not failed, not closed."""
        return self.open and self.failed is None and not self.closed

    @property
    def max_frame_bytes(self) -> int | None:
        """The server's frame limit, once welcomed."""
        limit = self.welcome.limits.get("max_frame_bytes") if self.welcome else None
        return limit if isinstance(limit, int) and not isinstance(limit, bool) else None

    # -- requests out -----------------------------------------------------------------

    def next_id(self) -> int:
        """The id for the next request this connection sends."""
        return self.tracker.next_id()

    def send(self, request: Request, *, replay: bool = True) -> Frame | None:
        """Track ``request``; return its frame to write now, or None while it waits for
        the connection to come back (the resume sends it).

        ``replay=False`` binds the request to the current socket (handshake requests):
        it is sent even before the connection is open, and fails if the socket drops.

        Raises:
            ClientClosed / the connection's failure / SessionLost: it cannot go out.
            FrameTooLarge: its frame exceeds the server's limit.
            ConnectionLost: not connected and not reconnecting.
        """
        rid = request.id
        if self.closed:
            raise ClientClosed("this connection was closed", request_id=rid)
        if self.failed is not None:
            raise copy_error(self.failed, rid)
        session = getattr(request, "session", None)
        if isinstance(session, str) and session in self.sessions.lost:
            raise self.sessions.lost_error(session, rid)
        batch_sessions = None
        if isinstance(request, _BATCHES):
            batch_sessions = sessions_of(request)
            request.acked = self.tracker.holds_replies(batch_sessions)
        elif isinstance(request, _ACKING) and isinstance(session, str):
            request.acked = self.tracker.holds_replies((session,))
        frame = self.codec.encode(request.to_wire())
        limit = self.max_frame_bytes
        if limit is not None and len(frame) > limit:
            raise FrameTooLarge(
                f"{request.type!r} message of {len(frame)} bytes exceeds the server's "
                f"frame limit of {limit} bytes",
                details={"size": len(frame), "limit": limit},
                request_id=rid,
            )
        if self.open or not replay:
            entry = self.tracker.add(request, frame, replay=replay, batch_sessions=batch_sessions)
            entry.sent = self.generation
            return frame
        if self.resuming:
            self.tracker.add(request, frame, batch_sessions=batch_sessions)
            return None
        raise ConnectionLost("not connected; call connect() first", request_id=rid)

    def write_failed(self, request_id: int, reason: str) -> ConnectionLost | None:
        """The socket refused ``request_id``'s frame: the error to raise, or None when a
        reconnect re-sends it."""
        entry = self.tracker.get(request_id)
        if entry is not None and entry.replay and self.policy is not None:
            return None
        self.tracker.forget(request_id)
        return ConnectionLost(f"connection closed: {reason}", request_id=request_id)

    def forget(self, request_id: int) -> None:
        """The caller stopped waiting for ``request_id`` (cancelled): never re-send it."""
        self.tracker.forget(request_id)

    def timed_out(self, request: Request, timeout: float) -> RequestTimeout:
        """``request`` got no reply within ``timeout``: forget it; the error to raise."""
        self.tracker.forget(request.id)
        return RequestTimeout(
            f"no reply to {request.type!r} within {timeout:g} s",
            details={"timeout_s": timeout},
            request_id=request.id,
        )

    # -- replies in -------------------------------------------------------------------

    def receive(self, frame: Frame) -> Answer | ErrorReply | None:
        """Read one frame from the server.

        Returns the :class:`Answer` to a request still waited for; a notice the server
        sent without a request id (an :class:`ErrorReply` with ``id`` None); or None
        for a stale reply (its caller gave up).

        Raises:
            CorralError: the frame is unreadable or not a valid reply (drop it).
        """
        reply = parse_reply(self.codec.decode(frame))
        entry = self.tracker.match(reply)
        if entry is None:
            return reply if isinstance(reply, ErrorReply) and reply.id is None else None
        request = entry.request
        if isinstance(reply, ErrorReply):
            self.sessions.observe(reply)
            return Answer(request.id, None, reply.exception())
        if not isinstance(reply, _ANSWERS[request.type]):
            error = BadMessage(
                f"the server answered {request.type!r} with {reply.type!r}",
                details={"request": request.type, "reply": reply.type},
                request_id=request.id,
            )
            return Answer(request.id, None, error)
        self.sessions.observe(reply)
        return Answer(request.id, reply, None)

    # -- sockets ------------------------------------------------------------------------

    def resume_ids(self) -> list[str]:
        """Live sessions to name in a new socket's ``corral-resume`` header."""
        return list(self.sessions.live)[:MAX_RESUME_IDS]

    def connecting(self) -> None:
        """A connect was asked for: forget an earlier failure."""
        if self.closed:
            raise ClientClosed("this connection was closed")
        self.failed = None

    def socket_opened(self) -> int:
        """A new socket is up (before its handshake); return its generation."""
        self.generation += 1
        return self.generation

    def hello(self, contract: ContractRef | None, want_schemas: bool) -> tuple[Hello, Frame]:
        """The socket-bound ``hello`` of a new socket, and its frame."""
        hello = Hello(
            self.next_id(),
            PROTOCOL,
            self.client,
            contract=contract,
            want_schemas=want_schemas,
            max_frame_bytes=self.accept_frame_bytes,
        )
        frame = self.send(hello, replay=False)
        assert frame is not None
        return hello, frame

    def welcomed(self, welcome: Reply | None) -> list[tuple[Attach, Frame]]:
        """Take the ``welcome``; return the ``attach`` requests of the sessions to resume.

        A new server instance loses every live session here (its episodes are gone).

        Raises:
            CorralError: the reply to ``hello`` is not a ``welcome``.
        """
        if not isinstance(welcome, Welcome):
            raise ConnectionLost(f"the server answered hello with {type(welcome).__name__}")
        if self.welcome is not None and welcome.schemas is None:
            welcome = dataclasses.replace(welcome, schemas=self.welcome.schemas)
        self.welcome = welcome
        instance = welcome.server.get("instance")
        self.sessions.welcome(instance if isinstance(instance, str) else None)
        attaches = []
        for sid, token in self.sessions.live.items():
            attach = Attach(self.next_id(), sid, token)
            frame = self.send(attach, replay=False)
            assert frame is not None
            attaches.append((attach, frame))
        return attaches

    def attached(self, attaches: list[Attach], results: list[Reply | BaseException]) -> None:
        """Take the outcome of each ``attach``: a session the server no longer has is lost.

        Raises:
            BaseException: the first other failure (the attempt is retried).
        """
        retry: BaseException | None = None
        for attach, result in zip(attaches, results, strict=True):
            if isinstance(result, SessionLost):
                reason = str(result.details.get("reason") or result.message)
                self.sessions.lose(attach.session, reason)
            elif isinstance(result, (UnknownSession, Unauthorized)):
                self.sessions.lose(
                    attach.session, f"the server does not have it any more ({result.message})"
                )
            elif isinstance(result, BaseException):
                retry = retry or result
        if retry is not None:
            raise retry

    def fail_lost(self) -> list[tuple[int, SessionLost]]:
        """Stop waiting for the requests of lost sessions; each with its error."""
        failed = []
        for rid in self.tracker.of_sessions(self.sessions.lost):
            entry = self.tracker.get(rid)
            self.tracker.forget(rid)
            if entry is not None and entry.session is not None:
                failed.append((rid, self.sessions.lost_error(entry.session, rid)))
        return failed

    def resend(self) -> list[Outstanding]:
        """The requests to write on the new socket now, marked sent.

        Call until it returns nothing: requests queued meanwhile go out too.
        """
        batch = self.tracker.unsent(self.generation)
        for entry in batch:
            if entry.sent >= 0:
                self.resent += 1
            entry.sent = self.generation
        return batch

    def established(self, generation: int) -> None:
        """The new socket's handshake and resume are done: the connection is open.

        Raises:
            ConnectionLost: that socket dropped meanwhile.
        """
        if self._lost_generation == generation:
            raise ConnectionLost("the connection dropped while it was being resumed")
        if self.resuming:
            self.reconnects += 1
        self.open = True
        self.resuming = False

    def lost(self, generation: int, reason: str, now: float) -> Loss | None:
        """Socket ``generation`` dropped; None when that changes nothing (an old socket)."""
        if self.closed or generation != self.generation or self._lost_generation == generation:
            return None
        self._lost_generation = generation
        was_open, self.open = self.open, False
        error = ConnectionLost(reason)
        failed = self.tracker.bound_to_socket()
        for rid in failed:
            self.tracker.forget(rid)
        if not was_open:
            then = AfterLoss.NOTHING
        elif self.policy is None:
            self.give_up(error)
            then = AfterLoss.FAIL
        else:
            self.resuming = True
            self._attempt = 0
            self._resume_started = now
            then = AfterLoss.RECONNECT
        return Loss(error, failed, then)

    def retry_delay(self, now: float) -> float | None:
        """Seconds to wait before the next reconnect attempt; None: give up now."""
        policy = self.policy
        assert policy is not None
        wait = policy.delay(self._attempt, self._rng)
        out_of_attempts = policy.max_attempts is not None and self._attempt >= policy.max_attempts
        if out_of_attempts or now - self._resume_started + wait > policy.give_up_after_s:
            return None
        self._attempt += 1
        return wait

    def retryable(self, error: CorralError) -> bool:
        """A failed reconnect attempt is worth another one (else it is final)."""
        return isinstance(error, _RETRYABLE)

    def exhausted(self, url: str, cause: str, now: float) -> ConnectionLost:
        """The error of a reconnect that gave up (pass it to :meth:`give_up`)."""
        elapsed = now - self._resume_started
        return ConnectionLost(
            f"connection to {url} lost ({cause}) and not re-established after "
            f"{self._attempt} attempt(s) in {elapsed:.1f} s",
            details={"attempts": self._attempt, "elapsed_s": elapsed, "cause": cause},
        )

    def give_up(self, error: CorralError) -> list[int]:
        """Fail the connection with ``error``; return the ids of every waiting request."""
        self.failed = error
        self.open = False
        self.resuming = False
        return self.tracker.forget_all()

    def close(self) -> list[int]:
        """Closed by this side; return the ids of every waiting request."""
        self.closed = True
        self.open = False
        self.resuming = False
        return self.tracker.forget_all()


def copy_error(error: CorralError, request_id: int | None) -> CorralError:
    """``error`` as a fresh exception for ``request_id`` (one exception per waiter)."""
    copy = type(error)(error.message, details=dict(error.details), request_id=request_id)
    if type(copy).code != error.code:
        copy.code = error.code  # type: ignore[misc]  # an unknown code keeps its own name
    return copy


__all__ = [
    "AfterLoss",
    "Answer",
    "ClientProtocol",
    "Loss",
    "Outstanding",
    "ReconnectPolicy",
    "RequestTracker",
    "SessionBook",
    "copy_error",
]

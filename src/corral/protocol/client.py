"""The client side of one ``corral/1`` connection, sans I/O: a state table and its feeders.

    IDLE --connect--> DIALING --opened--> GREETING --welcomed--> ATTACHING --ready--> OPEN
                                                   --ready------------------------->
    OPEN --dropped--> WAITING --timer--> REDIALING --opened--> REGREETING ... --ready--> OPEN
    a first connect that fails --> IDLE;  a resume that cannot go on --> FAILED --connect-->
    any --close--> CLOSED

:class:`ClientProtocol` makes every decision of a client connection; the socket code
around it (:class:`corral.client.connection.Connection`, or any other transport) only
feeds it what happened and does what it returns. From the socket side there are three
entry points: :meth:`~ClientProtocol.opened` (a socket is up: the ``hello`` to write),
:meth:`~ClientProtocol.receive` (a frame arrived) and :meth:`~ClientProtocol.lost` (the
socket dropped, could not be opened, or its handshake failed or overran); from the
caller's side :meth:`~ClientProtocol.connect`, :meth:`~ClientProtocol.send` (a request
out) and :meth:`~ClientProtocol.close`; and from the clock
:meth:`~ClientProtocol.timer_fired` (the reconnect backoff elapsed) and
:meth:`~ClientProtocol.timed_out` (a request's deadline passed). What the transport must
do next comes back as an :class:`Actions` (frames to write, waiters to fail, a socket to
drop, a backoff to wait, an attempt settled), a reply as an :class:`Answer`.

:data:`TRANSITIONS` is the one place that decides where the connection goes next (the
h11 ``_state.py`` school, like :data:`corral.protocol.session.LIFECYCLE`), and
:data:`ADMISSION` what a new request meets in each state: written now (``OPEN``), held
for the resume (``WAITING`` and the ``RE``-states), or refused (not connected, failed,
closed). The handshake is part of the table: the protocol object sends ``hello`` and the
re-attaches itself and reads their replies from the frames, so the transport never
sequences it. The rules it keeps:

* **request ids** (:class:`~corral.protocol.client_requests.RequestTracker`): fresh,
  never reused; replies matched by id in any order; a reply to a request its caller gave
  up on is stale and dropped, never taken as the answer to the next call.
* **sessions** (:class:`~corral.protocol.client_sessions.SessionBook`, a table of its
  own): live ones with their resume tokens, lost ones with the reason; a request for a
  lost session fails at once with :class:`~corral.errors.SessionLost`.
* **the reconnect plan.** When an open connection drops, the requests bound to that
  socket (``hello``, ``attach``) are forgotten; the others stay outstanding. After the
  next ``welcome``: a new server instance loses every session (its episodes are gone);
  each live session is re-attached with its token (one the server no longer has is
  lost); the requests of lost sessions fail with ``SessionLost``; and every request still
  unanswered is re-sent *with its original id*, so the server's reply cache answers one
  it already ran (at most once) and runs one it never saw (never lost). Requests sent
  while the connection is being re-established wait for that re-send. The backoff
  between attempts (:class:`ReconnectPolicy`) and when to give up are decided here.

* **the home server.** Behind a front door a socket may land on any server. The
  connection's sessions live on one server, its *home* (``welcome.server.id``, or the
  one it was built for): every socket after the first names it
  (:data:`~corral.protocol.handshake.ROUTE_HEADER`, :meth:`ClientProtocol.route`), and
  a ``welcome`` from another server while sessions are held is not taken for a restart
  of theirs: they become ``MOVING`` and the attempt is retried — up to
  :data:`MAX_MISROUTES` times in a row, after which the address no longer reaches their
  server and they are lost, as after a restart. An ``attach`` answered
  ``SESSION_ELSEWHERE`` follows the session to the server it names when nothing else is
  held here; else its requests fail with
  :class:`~corral.errors.SessionElsewhere`, for the pool to re-home it.
* **notices.** The ``hello`` asks for them; a ``going_away`` (the server drains, by a
  deadline) is kept (:attr:`ClientProtocol.going_away`) and handed to the transport,
  which tells whoever moves sessions; the connection itself carries on until the
  server closes it.

The object never blocks and never reads a clock: a transport passes ``now`` where time
matters and fires the delays it is given. Frames are encoded and decoded with the
connection's codec; replies come out typed (:mod:`corral.protocol.messages`), an error
reply already turned into its exception.

Over 600 lines because the tables, their states and events, the backoff policy and the
one object they drive are read together; the request tracker and the session book,
which the object only consults, have modules of their own.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from corral.errors import (
    BadMessage,
    CapacityReached,
    ClientClosed,
    ConnectionLost,
    CorralError,
    FrameTooLarge,
    InternalError,
    RequestTimeout,
    SessionElsewhere,
    SessionLost,
    TooManyConnections,
    Unauthorized,
    UnknownSession,
)
from corral.protocol.batch import BatchReply, ResetBatch, StepBatch
from corral.protocol.client_requests import BATCHES, RequestTracker, sessions_of
from corral.protocol.client_sessions import SessionBook
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
    GoingAway,
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
    Open.type: (Opened,),
    Reset.type: (Result,),
    Step.type: (Result,),
    GetState.type: (StateReply,),
    Close.type: (Closed,),
    TakeSnapshot.type: (SnapshotReply,),
    Restore.type: (Restored,),
    ResetBatch.type: (BatchReply,),
    StepBatch.type: (BatchReply,),
}
"""The reply type that answers each request type a caller sends (besides ``error``)."""

_ACKING = (Reset, Step)
"""The single-session requests that carry ``acked`` (a ``state`` changes nothing worth
re-sending; ``attach``/``close`` are not steps of an episode)."""

_RETRYABLE = (ConnectionLost, RequestTimeout, CapacityReached, TooManyConnections)
"""Failures of a reconnect attempt worth another attempt; anything else is final."""

_NOT_ATTACHABLE = (SessionLost, UnknownSession, Unauthorized)

MAX_MISROUTES = 3
"""Sockets in a row that may land on another server than the one they named before its
sessions count as gone: a door may lose the header now and then, but one that keeps
leading elsewhere no longer reaches that server (it was replaced under a new id)."""
"""Refusals of an ``attach`` that lose that session (any other failure fails the attempt)."""


class ConnState(StrEnum):
    """Where a connection is (see the module docstring's diagram)."""

    IDLE = "idle"
    """No socket: never connected, or a connect attempt failed (``connect()`` again)."""
    DIALING = "dialing"
    """``connect()``: the socket is being opened."""
    GREETING = "greeting"
    """``connect()``: the socket is up, ``hello`` sent."""
    ATTACHING = "attaching"
    """``connect()``: welcomed, the sessions this connection still carries re-attaching."""
    OPEN = "open"
    """Established: requests go out at once."""
    WAITING = "waiting"
    """The socket dropped: waiting out the backoff before the next attempt."""
    REDIALING = "redialing"
    """Resuming: the socket is being opened."""
    REGREETING = "regreeting"
    """Resuming: the socket is up, ``hello`` sent."""
    REATTACHING = "reattaching"
    """Resuming: welcomed, the live sessions re-attaching."""
    FAILED = "failed"
    """Gave up (no reconnects, out of budget, or refused for good): requests fail with
    the reason until ``connect()`` again."""
    CLOSED = "closed"
    """Closed by this side; final."""


class ConnEvent(StrEnum):
    """What moves a connection (the entry point that decides it, in brackets)."""

    CONNECT = "connect"
    """The caller asks for a connection [connect]."""
    OPENED = "opened"
    """The socket is up; ``hello`` goes out [opened]."""
    WELCOMED = "welcomed"
    """``welcome`` came, with sessions to re-attach [receive]."""
    READY = "ready"
    """Nothing (more) to re-attach: established [receive]."""
    DROPPED = "dropped"
    """The attempt or the socket failed in a way worth another attempt [lost]."""
    REFUSED = "refused"
    """The attempt failed for good: a wrong token, contract or protocol [lost, receive]."""
    EXHAUSTED = "exhausted"
    """No reconnect policy, or its attempts or time ran out [lost]."""
    TIMER = "timer"
    """The backoff elapsed: dial again [timer_fired]."""
    CLOSE = "close"
    """Closed by this side [close]."""


_S, _E = ConnState, ConnEvent
_FIRST = (_S.DIALING, _S.GREETING, _S.ATTACHING)
_RESUMING = (_S.REDIALING, _S.REGREETING, _S.REATTACHING)

TRANSITIONS: Mapping[tuple[ConnState, ConnEvent], ConnState] = MappingProxyType(
    {
        (_S.IDLE, _E.CONNECT): _S.DIALING,
        (_S.FAILED, _E.CONNECT): _S.DIALING,
        # A first connect: its caller waits, and sees any failure at once.
        (_S.DIALING, _E.OPENED): _S.GREETING,
        (_S.GREETING, _E.WELCOMED): _S.ATTACHING,
        (_S.GREETING, _E.READY): _S.OPEN,
        (_S.ATTACHING, _E.READY): _S.OPEN,
        **{(state, event): _S.IDLE for state in _FIRST for event in (_E.DROPPED, _E.REFUSED)},
        # A drop of an open connection: back off, then the same steps again; requests wait.
        (_S.OPEN, _E.DROPPED): _S.WAITING,
        (_S.OPEN, _E.EXHAUSTED): _S.FAILED,
        (_S.WAITING, _E.TIMER): _S.REDIALING,
        (_S.REDIALING, _E.OPENED): _S.REGREETING,
        (_S.REGREETING, _E.WELCOMED): _S.REATTACHING,
        (_S.REGREETING, _E.READY): _S.OPEN,
        (_S.REATTACHING, _E.READY): _S.OPEN,
        **{(state, _E.DROPPED): _S.WAITING for state in _RESUMING},
        **{(state, _E.REFUSED): _S.FAILED for state in _RESUMING},
        **{(state, _E.EXHAUSTED): _S.FAILED for state in _RESUMING},
        **{(state, _E.CLOSE): _S.CLOSED for state in _S if state is not _S.CLOSED},
    }
)
"""(state, event) → the next state. A pair missing here is a transport bug (an event the
state cannot take), reported as :class:`~corral.errors.InternalError`."""


class Admit(StrEnum):
    """What a new request meets (:data:`ADMISSION`)."""

    SEND = "send"
    """Written now."""
    HOLD = "hold"
    """Kept until the connection is back, then written with the re-sent ones."""
    NOT_CONNECTED = "not_connected"
    """``ConnectionLost``: connect first (or wait for the connect in progress)."""
    FAILED = "failed"
    """The connection's failure, for this request."""
    CLOSED = "closed"
    """``ClientClosed``."""


ADMISSION: Mapping[ConnState, Admit] = MappingProxyType(
    {
        _S.IDLE: Admit.NOT_CONNECTED,
        _S.DIALING: Admit.NOT_CONNECTED,
        _S.GREETING: Admit.NOT_CONNECTED,
        _S.ATTACHING: Admit.NOT_CONNECTED,
        _S.OPEN: Admit.SEND,
        _S.WAITING: Admit.HOLD,
        _S.REDIALING: Admit.HOLD,
        _S.REGREETING: Admit.HOLD,
        _S.REATTACHING: Admit.HOLD,
        _S.FAILED: Admit.FAILED,
        _S.CLOSED: Admit.CLOSED,
    }
)
"""State → what a new request meets there."""

RESUMING: frozenset[ConnState] = frozenset({_S.WAITING, *_RESUMING})
"""The states of a connection re-establishing itself after a drop."""

WITH_SOCKET: frozenset[ConnState] = frozenset({*_FIRST, *_RESUMING, _S.OPEN})
"""The states with a socket of the current generation, being opened or in use."""


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
class Answer:
    """A reply matched to its request: the typed reply, or the error it carries."""

    request_id: int
    reply: Reply | None
    error: CorralError | None


@dataclass(slots=True)
class Actions:
    """What the transport does after a handshake step, a loss, or a failed attempt, in
    this order.

    Attributes:
        write: frames to write on the current socket.
        fail: waiters to fail, each with its error.
        fail_all: fail every waiter with (a copy of) this error.
        drop: drop the current socket (a loss, or a handshake that failed).
        redial_after: fire :meth:`ClientProtocol.timer_fired` after this many seconds.
        settled: the attempt in progress is over (a ``connect()`` waiting on it returns).
        error: how it ended, when it failed (what that ``connect()`` raises).
    """

    write: list[Frame] = field(default_factory=list)
    fail: list[tuple[int, CorralError]] = field(default_factory=list)
    fail_all: CorralError | None = None
    drop: bool = False
    redial_after: float | None = None
    settled: bool = False
    error: BaseException | None = None


class ClientProtocol:
    """The state and decisions of one client connection, across its sockets.

    Args:
        codec: the connection's codec.
        url: the server, for messages.
        reconnect: the backoff policy; None to fail every waiting request at the first
            drop instead.
        client: what the ``hello`` names as the client (``corral/VERSION``).
        seed: seeds the backoff jitter (tests).
        accept_frame_bytes: the largest frame this side's socket takes, announced in
            the ``hello`` so that the server answers a larger reply with an error
            (``REPLY_TOO_LARGE``) instead of a frame the socket would drop (None: any).
        server: the id of the server to reach behind a front door (None: whichever the
            door picks first; the connection's home from then on).
    """

    def __init__(
        self,
        codec: Codec,
        *,
        url: str = "",
        reconnect: ReconnectPolicy | None = None,
        client: str = "",
        seed: int | None = None,
        accept_frame_bytes: int | None = None,
        server: str | None = None,
    ) -> None:
        self.codec = codec
        self.url = url
        self.accept_frame_bytes = accept_frame_bytes
        self.policy = reconnect
        self.client = client
        self.state = ConnState.IDLE
        self.tracker = RequestTracker()
        self.sessions = SessionBook()
        self.welcome: Welcome | None = None
        """The last ``welcome`` (schemas kept from an earlier one that had them)."""
        self.generation = 0
        """The current socket's number; each socket of this connection gets the next."""
        self.failure: CorralError | None = None
        """Why the connection failed (while :attr:`state` is ``FAILED``)."""
        self.reconnects = 0
        """Successful reconnects so far."""
        self.resent = 0
        """Requests re-sent with their original id after a reconnect."""
        self._contract: ContractRef | None = None
        self._want_schemas = False
        self._hello: int | None = None
        """The id of the current socket's ``hello``, until its answer."""
        self._attaching: dict[int, Attach] = {}
        """The current socket's ``attach`` requests still unanswered, by id."""
        self._rng = random.Random(seed)
        self._attempt = 0
        self._resume_started = 0.0
        self._now = 0.0
        """The last clock reading a transport passed (see :meth:`_attempt_failed`)."""
        self._cause = ""
        """Why the connection is resuming (the last failure), for the give-up message."""
        self.home: str | None = server
        """The id of the server this connection's sessions live on (see :meth:`route`)."""
        self.going_away: GoingAway | None = None
        """The home server's drain notice, once one came."""
        self.misroutes = 0
        """Sockets that landed on another server than the home (and were re-dialed)."""
        self._misrouted = 0
        """Misroutes since the last socket that was ready (see :data:`MAX_MISROUTES`)."""

    def _to(self, event: ConnEvent) -> ConnState:
        """Take ``event`` by :data:`TRANSITIONS`; the only place the state changes."""
        state = TRANSITIONS.get((self.state, event))
        if state is None:
            raise InternalError(
                f"a client connection in state {self.state} cannot take {event!r}",
                details={"state": str(self.state), "event": str(event)},
            )
        self.state = state
        return state

    @property
    def connected(self) -> bool:
        """Open: the handshake and the resume done."""
        return self.state is ConnState.OPEN

    @property
    def resuming(self) -> bool:
        """Re-establishing itself after a drop (requests wait for it)."""
        return self.state in RESUMING

    @property
    def closed(self) -> bool:
        """Closed by this side."""
        return self.state is ConnState.CLOSED

    @property
    def max_frame_bytes(self) -> int | None:
        """The server's frame limit, once welcomed."""
        limit = self.welcome.limits.get("max_frame_bytes") if self.welcome else None
        return limit if isinstance(limit, int) and not isinstance(limit, bool) else None

    # -- requests out -----------------------------------------------------------------

    def next_id(self) -> int:
        """The id for the next request this connection sends."""
        return self.tracker.next_id()

    def send(self, request: Request) -> Frame | None:
        """Track ``request``; return its frame to write now, or None while it waits for
        the connection to come back (the resume sends it).

        Raises:
            ClientClosed / the connection's failure / ConnectionLost: it cannot go out
                (see :data:`ADMISSION`).
            SessionLost: its session is gone.
            FrameTooLarge: its frame exceeds the server's limit.
        """
        rid = request.id
        admit = ADMISSION[self.state]
        if admit is Admit.CLOSED:
            raise ClientClosed("this connection was closed", request_id=rid)
        if admit is Admit.FAILED:
            assert self.failure is not None
            raise copy_error(self.failure, rid)
        if admit is Admit.NOT_CONNECTED:
            raise ConnectionLost("not connected; call connect() first", request_id=rid)
        session = getattr(request, "session", None)
        if isinstance(session, str) and session in self.sessions.lost:
            raise self.sessions.lost_error(session, rid)
        if isinstance(session, str) and session in self.sessions.moving and admit is Admit.SEND:
            raise self.sessions.elsewhere_error(session, rid)
        batch_sessions = None
        if isinstance(request, BATCHES):
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
        entry = self.tracker.add(request, frame, batch_sessions=batch_sessions)
        if admit is Admit.HOLD:
            return None
        entry.sent = self.generation
        return frame

    def write_failed(self, request_id: int, reason: str) -> ConnectionLost | None:
        """The socket refused ``request_id``'s frame (it is closing): the error to raise,
        or None when a reconnect re-sends it."""
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

    # -- the caller's side --------------------------------------------------------------

    def connect(self, contract: ContractRef | None, want_schemas: bool) -> int:
        """A connect was asked for (from ``IDLE`` or ``FAILED``): the generation of the
        socket to dial; ``contract`` and ``want_schemas`` go in its ``hello`` (a resume
        sends the same contract, and asks for no schemas).

        Raises:
            ClientClosed: the connection was closed.
        """
        if self.closed:
            raise ClientClosed("this connection was closed")
        self._to(ConnEvent.CONNECT)
        self.failure = None
        self._contract, self._want_schemas = contract, want_schemas
        self.generation += 1
        return self.generation

    def resume_ids(self) -> list[str]:
        """Live sessions to name in a new socket's ``corral-resume`` header."""
        return [*self.sessions.live, *self.sessions.follow(self.home or "")][:MAX_RESUME_IDS]

    def route(self) -> str | None:
        """The server a new socket names in its route header (the home), if known."""
        return self.home

    def close(self) -> list[int]:
        """Closed by this side; return the ids of every waiting request."""
        if self.closed:
            return []
        self._to(ConnEvent.CLOSE)
        self._hello, self._attaching = None, {}
        return self.tracker.forget_all()

    # -- the socket's side --------------------------------------------------------------

    def opened(self, generation: int) -> Frame | None:
        """Socket ``generation`` is up: the ``hello`` to write on it; None when that
        socket is not wanted any more (closed or superseded meanwhile: drop it)."""
        if generation != self.generation or self.state not in (_S.DIALING, _S.REDIALING):
            return None
        self._to(ConnEvent.OPENED)
        hello = Hello(
            self.next_id(),
            PROTOCOL,
            self.client,
            contract=self._contract,
            want_schemas=self._want_schemas,
            max_frame_bytes=self.accept_frame_bytes,
            notices=True,
        )
        self._want_schemas = False  # a resume's hello asks for none: they were adopted
        self._hello = hello.id
        return self._bound(hello)

    def _bound(self, request: Request) -> Frame:
        """Track a request of the handshake: bound to this socket, never re-sent."""
        frame = self.codec.encode(request.to_wire())
        self.tracker.add(request, frame, replay=False).sent = self.generation
        return frame

    def receive(self, frame: Frame) -> Answer | ErrorReply | GoingAway | Actions | None:
        """Read one frame from the server.

        Returns the :class:`Answer` to a request still waited for; the :class:`Actions`
        of a handshake step (a ``welcome``, an ``attached``); a notice the server sent
        without a request id (an :class:`ErrorReply` with ``id`` None, or a
        :class:`GoingAway`, also kept in :attr:`going_away`); or None for a stale reply
        (its caller gave up).

        Raises:
            CorralError: the frame is unreadable or not a valid reply (drop it).
        """
        reply = parse_reply(self.codec.decode(frame))
        if isinstance(reply, GoingAway):
            self.going_away = reply
            return reply
        entry = self.tracker.match(reply)
        if entry is None:
            return reply if isinstance(reply, ErrorReply) and reply.id is None else None
        request = entry.request
        if not entry.replay:
            return self._handshake(request, reply)
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

    def _handshake(self, request: Request, reply: Reply) -> Actions | None:
        """The answer to this socket's ``hello`` or one of its ``attach`` requests."""
        if request.id == self._hello:
            self._hello = None
            if isinstance(reply, ErrorReply):
                return self._attempt_failed(reply.exception())
            if not isinstance(reply, Welcome):
                return self._attempt_failed(
                    ConnectionLost(f"the server answered hello with {type(reply).__name__}")
                )
            return self._welcomed(reply)
        attach = self._attaching.pop(request.id, None)
        if attach is None:  # a handshake request of an earlier socket: never re-sent
            return None
        if isinstance(reply, ErrorReply):
            error = reply.exception()
            if isinstance(error, SessionElsewhere):
                self.sessions.elsewhere(attach.session, str(error.details.get("server") or ""))
                return None if self._attaching else self._ready()
            if not isinstance(error, _NOT_ATTACHABLE):
                return self._attempt_failed(error)
            reason = (
                str(error.details.get("reason") or error.message)
                if isinstance(error, SessionLost)
                else f"the server does not have it any more ({error.message})"
            )
            self.sessions.lose(attach.session, reason)
        elif isinstance(reply, Attached):
            self.sessions.observe(reply)
        else:
            return self._attempt_failed(
                ConnectionLost(f"the server answered attach with {type(reply).__name__}")
            )
        return None if self._attaching else self._ready()

    def _welcomed(self, welcome: Welcome) -> Actions:
        """Adopt the ``welcome``; re-attach the live sessions (a new server instance
        loses them all), or be ready at once. A ``welcome`` of another server than the
        home while sessions are held: they are elsewhere, the attempt is retried."""
        server = welcome.server.get("id")
        if isinstance(server, str):
            held = self.sessions.live or self.sessions.follow(self.home or "")
            if self.home is not None and server != self.home and held:
                self._misrouted += 1
                if self._misrouted <= MAX_MISROUTES:
                    self.sessions.move_all(self.home)
                    self.misroutes += 1
                    return self._attempt_failed(
                        ConnectionLost(
                            f"the front door sent this connection to server {server}; its "
                            f"sessions live on server {self.home}"
                        )
                    )
                # Named, and still led elsewhere: the address no longer reaches the home.
                self.sessions.replaced(self.home, server, welcome.server.get("instance"))
            if self.home != server:
                self.home, self.going_away = server, None
        if self.welcome is not None and welcome.schemas is None:
            welcome = dataclasses.replace(welcome, schemas=self.welcome.schemas)
        self.welcome = welcome
        instance = welcome.server.get("instance")
        if instance != self.sessions.instance:
            self.going_away = None  # a notice of an earlier process of the server
        self.sessions.welcome(instance if isinstance(instance, str) else None)
        frames = []
        back = self.sessions.follow(server) if isinstance(server, str) else {}
        for sid, token in [*self.sessions.live.items(), *back.items()]:
            attach = Attach(self.next_id(), sid, token)
            self._attaching[attach.id] = attach
            frames.append(self._bound(attach))
        if not frames:
            return self._ready()
        self._to(ConnEvent.WELCOMED)
        return Actions(write=frames)

    def _ready(self) -> Actions:
        """The handshake is done: follow sessions that are all elsewhere, fail the
        requests of lost (or elsewhere) sessions, re-send the rest (original ids, oldest
        first), and open."""
        moving = self.sessions.moving
        if moving and not self.sessions.live:
            self.home = next(iter(moving.values()))[0] or self.home
            self.misroutes += 1
            return self._attempt_failed(
                ConnectionLost(f"the sessions live on server {self.home}: following them")
            )
        self._misrouted = 0
        failed: list[tuple[int, CorralError]] = []
        for rid in self.tracker.of_sessions(self.sessions.lost):
            entry = self.tracker.get(rid)
            self.tracker.forget(rid)
            if entry is not None and entry.session is not None:
                failed.append((rid, self.sessions.lost_error(entry.session, rid)))
        for rid in self.tracker.of_sessions(moving):
            entry = self.tracker.get(rid)
            self.tracker.forget(rid)
            if entry is not None and entry.session is not None:
                failed.append((rid, self.sessions.elsewhere_error(entry.session, rid)))
        frames = []
        for entry in self.tracker.unsent(self.generation):
            if entry.sent >= 0:
                self.resent += 1
            entry.sent = self.generation
            frames.append(entry.frame)
        if self.state in RESUMING:
            self.reconnects += 1
        self._to(ConnEvent.READY)
        return Actions(write=frames, fail=failed, settled=True)

    def lost(self, generation: int, error: BaseException, now: float) -> Actions | None:
        """Socket ``generation`` is gone: it dropped (``ConnectionLost``), could not be
        opened (the dialer's error), or its handshake overran (``RequestTimeout``).

        None when that changes nothing (an earlier socket, or one already reported).
        """
        if generation != self.generation or self.state not in WITH_SOCKET:
            return None
        self._now = now
        return self._attempt_failed(error)

    def _attempt_failed(self, error: BaseException) -> Actions:
        """The current socket (or its handshake) failed with ``error``: drop it; a first
        connect reports the failure, a resume backs off or gives up.

        A handshake refused by a reply has no clock reading of its own: the last one
        (the backoff timer's, at most a connect timeout ago) counts for the budget."""
        now = self._now
        for rid in self.tracker.bound_to_socket():
            self.tracker.forget(rid)
        self._hello, self._attaching = None, {}
        retry = isinstance(error, _RETRYABLE)
        if self.state in _FIRST:
            self._to(ConnEvent.DROPPED if retry else ConnEvent.REFUSED)
            return Actions(drop=True, settled=True, error=error)
        cause = error.message if isinstance(error, CorralError) else repr(error)
        if self.state is _S.OPEN:
            self._attempt, self._resume_started = 0, now
        elif not retry:
            failure = (
                error
                if isinstance(error, CorralError)
                else ConnectionLost(f"reconnecting failed: {error!r}")
            )
            return self._give_up(ConnEvent.REFUSED, failure)
        self._cause = cause
        wait = None if self.policy is None else self._next_delay(now)
        if wait is None:
            failure = ConnectionLost(cause) if self.policy is None else self._exhausted(now)
            return self._give_up(ConnEvent.EXHAUSTED, failure)
        self._to(ConnEvent.DROPPED)
        return Actions(drop=True, redial_after=wait)

    def _next_delay(self, now: float) -> float | None:
        """Seconds before the next attempt; None: out of attempts or of time."""
        policy = self.policy
        assert policy is not None
        wait = policy.delay(self._attempt, self._rng)
        out_of_attempts = policy.max_attempts is not None and self._attempt >= policy.max_attempts
        if out_of_attempts or now - self._resume_started + wait > policy.give_up_after_s:
            return None
        self._attempt += 1
        return wait

    def _exhausted(self, now: float) -> ConnectionLost:
        elapsed = now - self._resume_started
        return ConnectionLost(
            f"connection to {self.url} lost ({self._cause}) and not re-established after "
            f"{self._attempt} attempt(s) in {elapsed:.1f} s",
            details={"attempts": self._attempt, "elapsed_s": elapsed, "cause": self._cause},
        )

    def _give_up(self, event: ConnEvent, failure: CorralError) -> Actions:
        self._to(event)
        self.failure = failure
        self.tracker.forget_all()
        return Actions(drop=True, fail_all=failure, settled=True, error=failure)

    def timer_fired(self, now: float) -> int | None:
        """The backoff elapsed: the generation of the socket to dial now (None: the
        connection no longer waits, it was closed meanwhile)."""
        if self.state is not _S.WAITING:
            return None
        self._now = now
        self._to(ConnEvent.TIMER)
        self.generation += 1
        return self.generation


def copy_error(error: CorralError, request_id: int | None) -> CorralError:
    """``error`` as a fresh exception for ``request_id`` (one exception per waiter)."""
    copy = type(error)(error.message, details=dict(error.details), request_id=request_id)
    if type(copy).code != error.code:
        copy.code = error.code  # type: ignore[misc]  # an unknown code keeps its own name
    return copy


__all__ = [
    "ADMISSION",
    "MAX_MISROUTES",
    "RESUMING",
    "TRANSITIONS",
    "WITH_SOCKET",
    "Actions",
    "Admit",
    "Answer",
    "ClientProtocol",
    "ConnEvent",
    "ConnState",
    "ReconnectPolicy",
    "copy_error",
]

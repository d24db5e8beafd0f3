"""The server side of one ``corral/1`` connection, sans I/O: frames in, events and frames out.

:class:`ServerConnection` is everything a server decides about a connection, with no
socket, no event loop and no clock of its own, so that any transport can drive it: the
ASGI ``/ws`` route, a callback-style WebSocket server, or an in-process test transport.

    conn = ServerConnection(codec, registry, greeting, write=send_frame, ...)
    event = conn.receive(frame)          # for every frame that arrives
    if event is not None:                # work that needs the environment
        ...run it, then conn.send(reply) or session.deliver(reply)
    conn.close()                         # the socket is gone

:meth:`~ServerConnection.receive` reads a frame (size limit, decoding, validation), keeps
the handshake (``hello``/``welcome`` and the contract negotiation; nothing else before
it), and answers by itself whatever needs no environment: protocol errors, ``welcome``,
``attached``, replays of answered requests from a session's reply cache, and lifecycle
refusals. What is left comes back as one event: :class:`OpenSession`,
:class:`RestoreSession`, :class:`CloseSession`, :class:`RunCall` or :class:`RunBatch`; the
session's lifecycle has admitted it already
(:meth:`~corral.protocol.session.SessionState.admit`). A ``snapshot`` is a call of its
session; a ``restore`` is checked here (signature, environment, contract, the snapshot
model: :class:`~corral.protocol.snapshot.SnapshotSeal`) and reserves a slot like
``open``. Every request is first asked of the server's drain
(:class:`~corral.protocol.drain.Drain`: a draining server opens and restores nothing);
a client whose ``hello`` asked for notices gets the drain's ``going_away`` once
(:meth:`~ServerConnection.going_away`), also when it connects during the drain. Frames
go out through the ``write`` callback, in the order replies are sent; nothing here awaits.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from corral.contract.environment import ActionMigration
from corral.contract.schema import parse_semver
from corral.errors import (
    BadObservation,
    CorralError,
    FrameTooLarge,
    HandshakeRequired,
    InternalError,
    ReplyTooLarge,
    SessionBusy,
    TooManyConnections,
)
from corral.protocol.batch import (
    BadItem,
    BatchItemReply,
    BatchReply,
    BatchRequest,
    ItemError,
    ItemResult,
    ResetBatch,
    ResetItem,
    StepBatch,
    StepItem,
    check_batch_size,
)
from corral.protocol.codecs import Codec, Frame
from corral.protocol.drain import Drain
from corral.protocol.fields import peek_id, peek_session
from corral.protocol.handshake import Compat, check_protocol, negotiate
from corral.protocol.messages import (
    Attached,
    Close,
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
    StateReply,
    Step,
    TakeSnapshot,
    Welcome,
    parse_request,
)
from corral.protocol.position import Position
from corral.protocol.registry import SessionRegistry
from corral.protocol.session import Op, Remembered, ReplySink, RequestKey, SessionState, reused_id
from corral.protocol.snapshot import SnapshotSeal, unsupported

log = logging.getLogger("corral.server")

S = TypeVar("S", bound=SessionState)

CallRequest = Reset | Step | GetState | TakeSnapshot
"""A request that runs one environment call of one session."""

# Unions for isinstance built once: ``A | B`` in a call would build one per message.
_CALLS = (Reset, Step, GetState, TakeSnapshot)
_BATCHES = (StepBatch, ResetBatch)
_ITEMS = (ItemResult, ItemError)
_STEPS = (Step, StepItem)
_RESETS = (Reset, ResetItem)
_ACKING = (Reset, Step)


class Peer(ReplySink, Protocol):
    """What the server needs of a connection to run its requests (frames or not)."""

    codec: Codec
    migrate: ActionMigration | None


# -- events: what the I/O side runs --------------------------------------------------


@dataclass(slots=True)
class OpenSession:
    """Build a session for ``request``; its slot is reserved already.

    Then add it to the registry and call :meth:`ServerConnection.opened`; if building
    fails, release the reservation (:meth:`SessionRegistry.release`) and answer with
    :meth:`ServerConnection.fail`.
    """

    request: Open


@dataclass(slots=True)
class RestoreSession:
    """Build a session at ``position`` and restore ``snapshot`` (the environment's model,
    validated) in it, for ``request``; its slot is reserved already.

    Then add it to the registry, run the environment's ``restore`` and call
    :meth:`ServerConnection.restored`; on failure, release the reservation (or close the
    session) and answer with :meth:`ServerConnection.fail`.
    """

    request: Restore
    position: Position
    snapshot: Any


@dataclass(slots=True)
class CloseSession(Generic[S]):
    """Close ``session`` (found, and owned by this connection), then answer ``closed``."""

    request: Close
    session: S


@dataclass(slots=True)
class RunCall(Generic[S]):
    """Run ``op`` on ``session`` for ``request``; the session is now running it."""

    request: CallRequest
    session: S
    op: Op


@dataclass(slots=True)
class BatchCall(Generic[S]):
    """One admitted item of a batch: run ``op`` on ``session``, answer at ``index``."""

    index: int
    item: ResetItem | StepItem
    session: S
    op: Op


@dataclass(slots=True)
class RunBatch(Generic[S]):
    """Run a batch's admitted ``calls`` and answer it with one ``batch`` reply.

    ``results`` already holds the items answered without running (refused, malformed,
    or replayed from a session's cache); ``joins`` are items whose same request (a batch
    re-sent after a reconnect) is running now: their answer is the original's.
    """

    request: BatchRequest
    results: list[BatchItemReply | None]
    calls: list[BatchCall[S]] = field(default_factory=list)
    joins: list[tuple[int, S]] = field(default_factory=list)


Event = OpenSession | RestoreSession | CloseSession[S] | RunCall[S] | RunBatch[S]


# -- admission of session requests, shared by every kind of connection -------------


def request_key(
    kind: str, payload: Reset | Step | GetState | TakeSnapshot | ResetItem | StepItem
) -> RequestKey:
    """The :data:`~corral.protocol.session.RequestKey` of a request or batch item."""
    if isinstance(payload, _STEPS):
        return kind, payload.action
    if isinstance(payload, Reset) and payload.task is not None:
        return kind, (payload.seed, payload.options, payload.task)
    if isinstance(payload, _RESETS):
        return kind, (payload.seed, payload.options)
    return kind, None


def admit_call(
    registry: SessionRegistry[S], owner: ReplySink, request: CallRequest
) -> RunCall[S] | Reply | None:
    """Admit a single-session request of ``owner``.

    Returns:
        The call to run; the remembered reply of a request already answered (send it);
        or None for a request that is running now (its reply is on its way).

    Raises:
        CorralError: the session is unknown or lost, or its lifecycle refuses the request.
    """
    session = registry.get(request.session, owner)
    key = request_key(request.type, request)
    # state and snapshot never ack
    acked = request.acked if isinstance(request, _ACKING) else False
    outcome = session.admit(request.type, request.id, key, acked)
    if isinstance(outcome, Op):
        return RunCall(request, session, outcome)
    if isinstance(outcome, _ITEMS):  # remembered without its key: still not a replay
        raise reused_id(request.id, request.type, "batch")
    return outcome


def admit_batch(
    registry: SessionRegistry[S],
    owner: ReplySink,
    request: BatchRequest,
    max_batch: int,
    count_error: Callable[[str], None],
) -> RunBatch[S]:
    """Admit every item of a batch of ``owner``; an item's refusal is that item's answer.

    Raises:
        BatchTooLarge: the batch exceeds ``max_batch`` (nothing runs).
    """
    check_batch_size(request, max_batch)
    kind = "reset" if isinstance(request, ResetBatch) else "step"
    rtype, rid, items, acked = request.type, request.id, request.items, request.acked
    batch: RunBatch[S] = RunBatch(request, [None] * len(items))
    calls, results, joins = batch.calls, batch.results, batch.joins
    # One clock read marks every item's session active (the batch is one moment).
    now = time.monotonic()
    get = registry.get
    seen: set[str] = set()
    for index, item in enumerate(items):
        try:
            if isinstance(item, BadItem):
                raise item.error
            session = get(item.session, owner, now)
            if session.id in seen:
                raise SessionBusy(
                    "this session appears twice in one batch; send one item per session",
                    details={"running": rid},
                )
            seen.add(session.id)
            key = request_key(rtype, item)
            outcome: Op | Remembered | None = session.admit(kind, rid, key, acked)
            if isinstance(outcome, Op):
                calls.append(BatchCall(index, item, session, outcome))
            elif outcome is None:
                joins.append((index, session))
            elif isinstance(outcome, _ITEMS):
                results[index] = outcome  # a re-sent batch: at most once
            else:  # remembered without its key: a single request's reply, not a replay
                raise reused_id(rid, rtype, outcome.type)
        except CorralError as exc:
            count_error(str(exc.code))
            results[index] = ItemError.of(item.session, exc)
    return batch


# -- the connection ----------------------------------------------------------------


class ConnectionGate:
    """Open connections by client address, and the per-client limit on them.

    Args:
        limit: connections one address may hold (None: no limit; behind a reverse
            proxy every client shares the proxy's address).
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.held: dict[str, int] = {}

    def enter(self, address: str) -> TooManyConnections | None:
        """Count a new connection of ``address``, or return the error refusing it."""
        held = self.held.get(address, 0)
        if self.limit is not None and held >= self.limit:
            return TooManyConnections(
                f"client {address} already holds {held} connections to this server",
                details={"limit": self.limit, "address": address},
            )
        self.held[address] = held + 1
        return None

    def leave(self, address: str) -> None:
        """A connection of ``address`` (one :meth:`enter` let in) ended."""
        left = self.held.get(address, 0) - 1
        if left > 0:
            self.held[address] = left
        else:
            self.held.pop(address, None)


@dataclass(frozen=True, slots=True)
class Greeting:
    """What a server says in every ``welcome``, and what it negotiates contracts against."""

    server: dict[str, Any]
    env: dict[str, Any]
    limits: dict[str, Any]
    contract_version: str
    fingerprint: str
    schemas: dict[str, Any]
    migrations: Mapping[int, ActionMigration] = field(default_factory=dict)


class ServerConnection(Generic[S]):
    """One ``corral/1`` connection, server side (see the module docstring).

    Args:
        codec: the codec the connection negotiated (by WebSocket subprotocol).
        registry: the server's sessions.
        greeting: what ``welcome`` says.
        write: takes each outgoing frame, in order; must not raise.
        max_frame_bytes: larger frames are ``FRAME_TOO_LARGE`` (the connection lives on).
        max_batch: items in one batch message.
        count_error: told the code of every error this connection answers with.
        snapshots: seals and opens the server's snapshots (None: the server takes
            none; ``snapshot`` and ``restore`` are ``SNAPSHOT_UNSUPPORTED``).
        drain: the server's drain (None: it never drains).

    Attributes:
        compat: how the handshake treats the client's contract; None before ``hello``.
        migrate: the action migration of a client of an older contract major.
        closed: the transport is gone; replies are dropped, new sessions closed.
        notices: the client's ``hello`` asked for notices (``going_away``).
    """

    def __init__(
        self,
        codec: Codec,
        registry: SessionRegistry[S],
        greeting: Greeting,
        *,
        write: Callable[[Frame], None],
        max_frame_bytes: int,
        max_batch: int,
        count_error: Callable[[str], None] = lambda _: None,
        snapshots: SnapshotSeal | None = None,
        drain: Drain | None = None,
    ) -> None:
        self.codec = codec
        self.snapshots = snapshots
        self.drain = drain
        self.notices = False
        self._told = False
        self.registry = registry
        self.greeting = greeting
        self.max_frame_bytes = max_frame_bytes
        self.max_batch = max_batch
        self.compat: Compat | None = None
        self.migrate: ActionMigration | None = None
        self.closed = False
        self.reply_limit: int | None = None
        """The largest frame the client takes (announced in its ``hello``; None: any)."""
        self.session_hint: str | None = None
        """The session a frame that failed to parse named, if readable."""
        self.client = ""
        """The peer's address, set by the transport: the sessions opened here count in
        that client's limit (:class:`~corral.protocol.registry.SessionRegistry`)."""
        self._write = write
        self._count_error = count_error

    # -- frames in -----------------------------------------------------------------

    def receive(self, frame: Frame) -> Event[S] | None:
        """Take one frame; return the work it needs, or None if it was answered here."""
        try:
            request = self.read(frame)
        except CorralError as exc:
            self.fail(exc, self.session_hint)
            return None
        return self.handle(request)

    def read(self, frame: Frame) -> Request:
        """Decode and validate one frame.

        Raises:
            CorralError: with a stable code, ``request_id`` set when it was readable
                (and :attr:`session_hint` the session id, when that was).
        """
        self.session_hint = None
        size = len(frame)
        if size > self.max_frame_bytes:
            # The transport caps frames at twice the limit, so decoding one to find its
            # id is bounded; the reply then matches the request instead of leaving the
            # client waiting.
            error = FrameTooLarge(
                f"frame of {size} bytes exceeds the limit of {self.max_frame_bytes}",
                details={"size": size, "limit": self.max_frame_bytes},
            )
            with contextlib.suppress(CorralError):
                found = self.codec.decode(frame)
                error.request_id = peek_id(found)
                self.session_hint = peek_session(found)
                del found
            # The error's traceback holds this call's locals, and the local ``error``
            # holds the error: a cycle the tuned GC may not collect for long. Refused
            # frames must be freed at once (issue 11.4), so nothing big stays here.
            del frame
            try:
                raise error
            finally:
                del error
        message = self.codec.decode(frame)
        try:
            return parse_request(message)
        except CorralError as exc:
            exc.request_id = peek_id(message)
            self.session_hint = peek_session(message)
            raise

    def handle(self, request: Request) -> Event[S] | None:
        """Take one typed request (what :meth:`receive` does after :meth:`read`)."""
        try:
            if isinstance(request, Hello):
                self._hello(request)
                return None
            if self.compat is None:
                raise HandshakeRequired(
                    "send 'hello' (and get 'welcome') first", details={"type": request.type}
                )
            if self.drain is not None:
                self.drain.admit(request.type)
            if isinstance(request, _CALLS):
                if request.type == "snapshot":
                    self._snapshots()  # refused before the session is touched
                outcome = admit_call(self.registry, self, request)
                if outcome is None or isinstance(outcome, RunCall):
                    return outcome
                self.send(outcome)  # a retry of an answered request: at most once
                return None
            if isinstance(request, _BATCHES):
                return admit_batch(self.registry, self, request, self.max_batch, self._count_error)
            if isinstance(request, Open):
                self.registry.reserve(self)
                return OpenSession(request)
            if isinstance(request, Restore):
                position, snapshot = self._snapshots().open(request.snapshot)
                self.registry.reserve(self)
                return RestoreSession(request, position, snapshot)
            if isinstance(request, Close):
                return CloseSession(request, self.registry.get(request.session, self))
            # What is left is ``attach``.
            session = self.registry.attach(request.session, request.token, self)
            self.send(Attached(request.id, session.id, session.token))
        except CorralError as exc:
            exc.request_id = request.id
            self.fail(exc, getattr(request, "session", None))
        return None

    def _hello(self, hello: Hello) -> None:
        greeting = self.greeting
        check_protocol(hello)
        self.compat = negotiate(
            hello.contract,
            greeting.contract_version,
            greeting.fingerprint,
            greeting.migrations,
            greeting.schemas,
        )
        if self.compat is Compat.MIGRATED and hello.contract is not None:
            self.migrate = greeting.migrations[parse_semver(hello.contract.version)[0]]
        self.reply_limit = hello.max_frame_bytes
        self.notices = hello.notices
        self.send(
            Welcome(
                hello.id,
                server=greeting.server,
                env=greeting.env,
                limits=greeting.limits,
                compat=str(self.compat),
                schemas=greeting.schemas if hello.want_schemas else None,
            )
        )
        if self.drain is not None and self.drain.draining:
            # A client arriving during the drain (to re-attach, or by a stale route) is
            # told at once, with the time that is left.
            self.going_away(time.monotonic())

    def going_away(self, now: float) -> GoingAway | None:
        """Send the drain's ``going_away`` notice if this connection reads notices and
        was not told yet; return what was sent."""
        if self._told or self.drain is None or self.closed:
            return None
        notice = self.drain.notice(now, self.notices)
        if notice is not None:
            self._told = True
            self.send(notice)
        return notice

    # -- what the I/O side reports back ---------------------------------------------

    def opened(self, request: Open, session: S) -> bool:
        """The session of ``request`` is built (and added to the registry): answer it.

        Returns False when the connection closed meanwhile: nobody can know the
        session's id, so the caller closes it.
        """
        if self.closed:
            return False
        self.send(Opened(request.id, session.id, session.token))
        return True

    def restored(self, request: Restore, session: S, observation: Any) -> bool:
        """The session of ``request`` is built and restored (``observation``, its wire
        object, is what the environment's ``restore`` returned): answer it.

        Returns False when the connection closed meanwhile (the caller closes it).
        """
        if self.closed:
            return False
        self.send(Restored(request.id, session.id, session.token, observation))
        return True

    def _snapshots(self) -> SnapshotSeal:
        """The seal of an environment that declares snapshots.

        Raises:
            SnapshotUnsupported: it declares none (or the server takes none).
        """
        seal = self.snapshots
        if seal is None or not seal.supported:
            raise unsupported(str(self.greeting.env.get("name", "this environment")))
        return seal

    def close(self) -> None:
        """The transport is gone (the caller then detaches or closes the sessions)."""
        self.closed = True

    # -- frames out ----------------------------------------------------------------

    def send(self, reply: Reply) -> None:
        """Encode ``reply`` and write its frame (dropped once closed).

        Every request gets a reply the client can take: a reply the codec cannot
        encode (an object in ``metadata``, an integer beyond 64 bits) becomes a
        ``BAD_OBSERVATION`` error for the same request, and one larger than the frame
        limit the client announced in its ``hello`` becomes ``REPLY_TOO_LARGE``; in a
        batch reply only the items at fault become errors, the others are delivered.
        """
        self._send(reply, repair=True)

    def _send(self, reply: Reply, repair: bool) -> None:
        if self.closed:
            return
        try:
            frame = self.codec.encode(reply.to_wire())
        except Exception as exc:
            if isinstance(reply, ErrorReply):
                log.exception("could not encode an error reply %s", reply.code)
                return
            if isinstance(reply, BatchReply) and repair:
                self._send(self._repaired(reply), repair=False)
                return
            # An environment's value the codec cannot carry is the environment's fault;
            # anything else is corral's.
            cls = BadObservation if isinstance(reply, Result | StateReply) else InternalError
            error = cls(
                f"the {reply.type!r} reply could not be encoded with the {self.codec.name} "
                f"codec: {exc}",
                details={"reply": reply.type},
                request_id=reply.id,
            )
            self.fail(error, getattr(reply, "session", None))
            return
        limit = self.reply_limit
        if limit is not None and len(frame) > limit and not isinstance(reply, ErrorReply):
            if isinstance(reply, BatchReply) and repair:
                self._send(self._repaired(reply), repair=False)
                return
            self.fail(self._too_large(reply.id, len(frame)), getattr(reply, "session", None))
            return
        self._write(frame)

    def _too_large(self, request_id: int | None, size: int) -> ReplyTooLarge:
        return ReplyTooLarge(
            f"the reply of {size} bytes exceeds the client's frame limit of "
            f"{self.reply_limit} bytes (announced in its hello)",
            details={"size": size, "limit": self.reply_limit},
            request_id=request_id,
        )

    def _repaired(self, reply: BatchReply) -> BatchReply:
        """``reply`` with each item the codec cannot encode, or too large for the
        client, replaced by its error (the slow path: only after the whole failed)."""
        # Items are measured on their own; the frame around them is kept under a margin.
        limit = None if self.reply_limit is None else self.reply_limit - 1024
        results: list[BatchItemReply] = []
        total = 0
        for item in reply.results:
            item, size = self._fitted(item, "batch item", limit, total)
            if isinstance(item, ItemResult) and item.reset is not None:
                reset, extra = self._fitted(item.reset, "reset", limit, total + size)
                item = ItemResult(item.session, item.observation, reset)  # the cached one stays
                size += extra
            total += size
            results.append(item)
        return BatchReply(reply.id, results)

    def _fitted(
        self, item: BatchItemReply, what: str, limit: int | None, total: int
    ) -> tuple[BatchItemReply, int]:
        """``item`` (a batch item or its same-step reset, ``what``), or its error when the
        codec cannot encode it or it does not fit after ``total`` bytes; and its size."""
        try:
            size = len(self.codec.encode(item.to_wire()))
        except Exception as exc:
            error: CorralError = BadObservation(
                f"the {what} could not be encoded with the {self.codec.name} codec: {exc}",
                details={"reply": BatchReply.type},
            )
            item, size = ItemError.of(item.session, error), 0
        if limit is not None and isinstance(item, ItemResult) and total + size > limit:
            item, size = ItemError.of(item.session, self._too_large(None, size)), 0
        if isinstance(item, ItemError):
            self._count_error(item.code)
        return item, size

    def fail(self, error: CorralError, session: str | None = None) -> None:
        """Answer with ``error`` (to its ``request_id``) and count it."""
        self._count_error(str(error.code))
        self.send(ErrorReply.of(error, session))

"""The environment service: turns ``corral/1`` requests into environment calls.

It is transport-agnostic. A transport opens a connection with :meth:`EnvService.connect`
(a sans-I/O :class:`~corral.protocol.server.ServerConnection` whose frames out go to the
transport's ``write``), feeds every frame that arrives to :meth:`EnvService.receive`, and
calls :meth:`EnvService.disconnect` when the socket goes. ``receive`` never awaits: the
connection object answers what needs no environment, and the work that does (building
a session, an environment call, a batch, closing) runs as tasks, so one connection
multiplexes many sessions; within a session the lifecycle table keeps requests in order.
A ``snapshot`` is one of a session's calls (the environment's ``snapshot()``, sealed by
the :class:`~corral.protocol.snapshot.SnapshotSeal`); a ``restore`` builds a session at
the snapshot's position and runs the environment's ``restore`` before anyone can reach
it, under the same runner rules and step timeout.

    conn = service.connect(codec, write=frames_out.append)
    service.receive(conn, frame)           # for each frame in; replies arrive via write
    await service.disconnect(conn, clean=True)

A link that carries typed requests instead of frames (the OpenEnv envelope) uses a
:class:`Channel` and :meth:`EnvService.handle`.

Session ids name this server (:class:`~corral.protocol.identity.SessionIds`, signed with
a key derived from the fleet key), so that a server of the same fleet asked about one
answers ``SESSION_ELSEWHERE`` with its holder's id. :meth:`EnvService.drain` drains the
server (:mod:`corral.server.draining`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral import __version__
from corral.auth import fleet_subkey
from corral.contract import Environment
from corral.contract.environment import ActionMigration
from corral.contract.schema import Contract
from corral.contract.wiresafe import make_wire_safe
from corral.errors import (
    BadMessage,
    CorralError,
    ErrorCode,
    HandshakeRequired,
    InternalError,
    PlatformError,
    SessionLost,
    StepTimeout,
)
from corral.protocol import messages as m
from corral.protocol.codecs import Codec, Frame
from corral.protocol.drain import Drain, DrainFigures
from corral.protocol.handshake import Compat
from corral.protocol.identity import SessionIds, default_server_id
from corral.protocol.server import (
    CallRequest,
    CloseSession,
    ConnectionGate,
    Event,
    Greeting,
    OpenSession,
    Peer,
    RestoreSession,
    RunBatch,
    RunCall,
    ServerConnection,
    admit_call,
)
from corral.protocol.session import Op, ending
from corral.protocol.snapshot import SnapshotSeal
from corral.server.admission import Admission
from corral.server.batching import BatchHandler
from corral.server.config import ServerConfig
from corral.server.deadlines import Deadlines
from corral.server.draining import Drainer
from corral.server.env_failures import as_data
from corral.server.runner import EnvFactory, EnvRunner, eager_start
from corral.server.sessions import Session, SessionManager

if TYPE_CHECKING:
    from corral.server.workers import WorkerPool


class PreflightError(PlatformError, RuntimeError):
    """The environment's preflight refused this machine (``Environment.preflight``): the
    server does not start. Not a wire error: no client ever sees it; what corral runs on
    lacks a feature (a ``PlatformError``, still a ``RuntimeError``)."""


_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A Prometheus label name (the keys of an environment's preflight facts)."""

log = logging.getLogger("corral.server")

Connection = ServerConnection[Session]
"""A ``corral/1`` connection of this server."""


@dataclass(eq=False)
class Channel:
    """A link that hands the service typed requests instead of frames (OpenEnv's envelope).

    Its replies go to ``sender`` as wire maps. Such links have no ``hello``: one is
    greeted when it is built with its ``compat`` set.
    """

    codec: Codec
    sender: Callable[[dict[str, Any]], None]
    compat: Compat | None = None
    migrate: ActionMigration | None = None
    owned: int = 0
    client: str = ""
    """The client address its sessions count for (the per-client limit)."""

    def send(self, reply: m.Reply) -> None:
        """Hand ``reply`` over as its wire map."""
        self.sender(reply.to_wire())


def resolve_env(target: Any) -> tuple[type[Environment[Any, Any, Any]], EnvFactory]:
    """Split ``create_app``'s argument into the environment class and a factory.

    ``target`` is an :class:`Environment` subclass, or a zero-argument callable that
    returns an instance (called once here to learn its class).

    Raises:
        TypeError: ``target`` is an instance, or the factory returns a non-environment.
    """
    if isinstance(target, type) and issubclass(target, Environment):
        return target, target
    if isinstance(target, Environment):
        raise TypeError(
            "create_app() takes the environment class or a factory, not an instance: "
            "each session needs its own instance"
        )
    if not callable(target):
        raise TypeError(f"create_app() needs an Environment subclass or factory, got {target!r}")
    probe = target()
    if not isinstance(probe, Environment):
        raise TypeError(f"factory {target!r} returned {type(probe).__name__}, not an Environment")
    env_type = type(probe)
    probe.close()
    return env_type, target


class EnvService:
    """Serves one environment class to many sessions."""

    def __init__(self, target: Any, config: ServerConfig) -> None:
        env_type, factory = resolve_env(target)
        self.env_type = env_type
        try:
            facts = env_type.preflight()
        except Exception as exc:
            raise PreflightError(
                f"{env_type.__name__} cannot run on this machine as configured, so the "
                f"server does not start: {exc}"
            ) from exc
        self.facts: dict[str, str] = dict(facts)
        bad = [key for key in self.facts if not _LABEL.fullmatch(key)]
        if bad:
            raise TypeError(
                f"{env_type.__name__}.preflight() keys must be Prometheus label names "
                f"(letters, digits, '_'): {bad}"
            )
        """What the environment's preflight reported (``/health``, ``/metrics``); a
        preflight that raises stops the server here, before it listens."""
        self.contract: Contract = env_type.contract()
        for model in (self.contract.action, self.contract.observation, self.contract.state):
            make_wire_safe(model)
        self.fingerprint = self.contract.fingerprint
        self.config = config
        key = config.fleet_key
        self.seal = SnapshotSeal(
            env=self.contract.name,
            contract_version=self.contract.version,
            fingerprint=self.fingerprint,
            model=self.contract.snapshot,
            key=None if key is None else fleet_subkey(key, "snapshot"),
            max_bytes=config.snapshot_limit,
        )
        """Seals this server's snapshots and opens the ones it restores."""
        self.instance = uuid.uuid4().hex
        self.server_id = config.server_id or default_server_id(os.getpid())
        """The routable id (``ServerConfig.server_id``; an in-process server without one
        gets ``<hostname>-<pid>``)."""
        self.started = time.time()
        """Wall-clock start time (the status page's uptime)."""
        self.manager = SessionManager(
            factory,
            config,
            auto_reset=env_type.auto_reset,
            thread_affinity=env_type.thread_affinity,
            on_close=self._session_closed,
            ids=SessionIds(
                self.server_id, None if key is None else fleet_subkey(key, "session-ids")
            ),
        )
        self.connections: set[Connection] = set()
        """The open ``corral/1`` connections (a drain tells each it is going away)."""
        self.draining = Drain(self.server_id)
        """The drain's state: every request and ``/ready`` ask it."""
        self.drainer = Drainer(self.draining, self.manager, self.connections)
        self.admission = Admission(env_type, self.contract, factory)
        self.admission.debug = config.debug
        self.rewards = self.admission.rewards
        """Reward and reward-component histograms (``/metrics``)."""
        self.gate = ConnectionGate(config.max_connections_per_client)
        """WebSocket connections by client address (for the per-client limit)."""
        self.greeting = Greeting(
            server=self.server_info(),
            env=self.env_info(),
            limits=config.limits(),
            contract_version=self.contract.version,
            fingerprint=self.fingerprint,
            schemas=self.contract.schemas,
            migrations=env_type.action_migrations,
        )
        self.batches = BatchHandler(self.manager, self.admission, config.step_timeout_s)
        self.deadlines = Deadlines(config.step_timeout_s)
        """The step timeout of the calls :meth:`EnvRunner.start` runs."""
        self._answer_call = self._answer
        """:meth:`_answer`, bound once: every such call's ``then``."""
        self._tasks: set[asyncio.Future[None]] = set()
        self.readiness_checks: list[Callable[[], str | None]] = [
            self.draining.unavailable,
            self._hung_calls,
        ]
        """Each says why no new session can be served now, or None (``/ready``)."""
        self.workers: WorkerPool | None = None
        """The worker processes holding the environments (``--workers``); their state
        goes in ``/health``, ``/ready``, ``/status`` and ``/metrics``."""
        self.manager.registry.unavailable = self.unavailable

    # -- readiness and drain -------------------------------------------------------------

    def _session_closed(self, session: Session, reason: str) -> None:
        if self.draining.draining:
            self.drainer.session_closed()

    async def drain(self, deadline_s: float, reason: str = "draining") -> DrainFigures:
        """Drain the server: open and restore no new session (``NOT_READY``, ``/ready``
        503), tell the clients that read notices it is ``going_away``, keep serving the
        sessions held (steps, ``snapshot``, ``close``) until none is left or
        ``deadline_s`` passes, then close what is left (``SESSION_LOST``, reason
        ``"drained"``). Returns the drain's figures; the server keeps running (refusing
        new sessions) until its owner stops it, as ``corral serve`` does on SIGTERM.

        A second call while a drain runs waits for the first (its deadline stands).
        """
        return await self.drainer.run(deadline_s, reason)

    def _hung_calls(self) -> str | None:
        hung, bound = self.manager.executor.hung, self.config.max_hung_calls
        if hung >= bound:
            return (
                f"{hung} environment calls hung past the step timeout and still hold "
                f"their threads (the bound is {bound})"
            )
        return None

    def unavailable(self) -> str | None:
        """Why a new session cannot be served now, capacity aside; None when it can."""
        for check in self.readiness_checks:
            reason = check()
            if reason is not None:
                return reason
        return None

    def readiness(self) -> tuple[bool, str | None]:
        """``(ready, reason)``: whether a new session can be served now, and why not.

        The truth ``/ready`` tells: not ready at capacity, or while any readiness
        check fails (hung calls at their bound, no worker process alive).
        """
        reason = self.unavailable()
        if reason is None and not self.manager.has_capacity():
            reason = "at capacity"
        return reason is None, reason

    # -- descriptions -------------------------------------------------------------

    def env_info(self) -> dict[str, Any]:
        """The environment's identity as the handshake and ``/metadata`` give it."""
        return {
            "name": self.contract.name,
            "description": self.env_type.description,
            "contract_version": self.contract.version,
            "fingerprint": self.fingerprint,
            "auto_reset": self.env_type.auto_reset,
            "snapshots": self.seal.supported,
        }

    def server_info(self) -> dict[str, Any]:
        """The server's identity: its routable ``id`` (what a front door routes by, stable
        across restarts) and ``instance`` (changes on every restart)."""
        return {
            "name": "corral",
            "version": __version__,
            "id": self.server_id,
            "instance": self.instance,
        }

    # -- connections ----------------------------------------------------------------

    def connect(self, codec: Codec, write: Callable[[Frame], None], client: str = "") -> Connection:
        """A new ``corral/1`` connection of the peer at address ``client``; its frames
        out go to ``write``, in order.

        This is the entry of every transport, the in-process one of tests included:
        feed each frame in to :meth:`receive`, end with :meth:`disconnect`.
        """
        self.manager.stats.connections += 1
        conn: Connection = ServerConnection(
            codec,
            self.manager.registry,
            self.greeting,
            write=write,
            max_frame_bytes=self.config.max_frame_bytes,
            max_batch=self.config.max_batch,
            count_error=self.manager.stats.error,
            snapshots=self.seal,
            drain=self.draining,
        )
        self.connections.add(conn)
        conn.client = client
        return conn

    def receive(self, conn: Connection, frame: Frame) -> None:
        """Take one frame of ``conn``; every outcome is a reply, now or later. Never awaits."""
        self.manager.stats.frames += 1
        try:
            event = conn.receive(frame)
        except Exception as exc:  # a bug must not take the connection down
            self.internal_error(conn, exc)
            return
        if event is not None:
            self.dispatch(conn, event)

    async def disconnect(self, conn: Connection, clean: bool) -> None:
        """``conn`` closed: free its sessions now (clean) or after the resume window."""
        conn.close()
        self.connections.discard(conn)
        self.manager.stats.connections -= 1
        if clean:
            await self.manager.close_owned(conn, "the client disconnected")
        else:
            self.manager.detach_all(conn)

    def dispatch(self, peer: Peer, event: Event[Session]) -> None:
        """Start the work of an admitted ``event``; its reply goes to ``peer``."""
        try:
            if isinstance(event, RunCall):
                self._call(peer, event)
            elif isinstance(event, RunBatch):
                self.batches.submit(peer, event)
            elif isinstance(event, OpenSession):
                assert isinstance(peer, ServerConnection)
                # Started at once too: a fast factory builds the environment here and the
                # session is answered from the frame's callback (no task, no thread hop).
                self._start_now(self._open(peer, event))
            elif isinstance(event, RestoreSession):
                assert isinstance(peer, ServerConnection)
                self._start_now(self._restore(peer, event))
            else:
                self._close(peer, event)
        except Exception as exc:  # a bug: free what was admitted and answer the request
            if isinstance(event, RunCall):
                event.session.end(event.request.id)
            elif isinstance(event, RunBatch):
                for call in event.calls:
                    call.session.end(event.request.id)
            self.internal_error(peer, exc, event.request.id)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_now(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` now up to its first wait; only what waits becomes a kept task."""
        started = eager_start(work)
        if not started.done():
            self._tasks.add(started)
            started.add_done_callback(self._tasks.discard)

    async def _open(self, conn: Connection, event: OpenSession) -> None:
        request = event.request
        try:
            session = await self.manager.build(conn)
        except CorralError as exc:
            exc.request_id = request.id
            conn.fail(exc)
            return
        except Exception as exc:  # a bug: the slot is released; answer the request
            self.internal_error(conn, exc, request.id)
            return
        if not conn.opened(request, session):
            await self.manager.close(session, "the connection closed while it opened")

    async def _restore(self, conn: Connection, event: RestoreSession) -> None:
        request = event.request
        observation: Any = None

        async def restore(session: Session) -> None:
            nonlocal observation
            try:
                value = await session.runner.call(
                    "restore", event.snapshot, timeout=self.config.step_timeout_s
                )
                observation = self.admission.observation(conn, value, Op.RESTORE)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # logged (the env's own) and answered as any call's
                error = self.admission.failure(exc, Op.RESTORE, session)
                if error is exc:
                    raise
                raise error from exc

        started = time.perf_counter()
        try:
            session = await self.manager.build(conn, event.position, restore)
        except CorralError as exc:  # the slot is released, the environment closed
            exc.request_id = request.id
            conn.fail(as_data(exc))  # its frames hold the snapshot: let it go (30.1)
            return
        except Exception as exc:  # a bug: answer the request all the same
            self.internal_error(conn, exc, request.id)
            return
        self.manager.stats.observe(str(Op.RESTORE), time.perf_counter() - started)
        self.manager.stats.restores += 1
        if not conn.restored(request, session, observation):
            await self.manager.close(session, "the connection closed while it restored")

    def _close(self, peer: Peer, event: CloseSession[Session]) -> None:
        session = event.session
        self.manager.retire(session, "closed by the client")

        async def close() -> None:
            try:
                await session.runner.close()
            finally:
                peer.send(m.Closed(event.request.id, session.id))

        self._spawn(close())

    async def shutdown(self) -> None:
        """Cancel the work still running and close every session (server shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.batches.shutdown()
        await self.manager.shutdown()

    # -- links without frames -------------------------------------------------------

    def send_error(self, peer: Peer, exc: CorralError, session: str | None = None) -> None:
        """Send ``exc`` as an error reply and count it."""
        self.manager.stats.error(str(exc.code))
        peer.send(m.ErrorReply.of(exc, session))

    async def handle(self, channel: Channel, request: m.Request) -> None:
        """Run one request of a link without frames: ``reset``, ``step`` or ``state``.

        Every outcome is a reply on ``channel`` (an environment call's, once it ran).
        """
        try:
            if channel.compat is None:
                raise HandshakeRequired("the link is not greeted", details={"type": request.type})
            if not isinstance(request, CallRequest):
                raise BadMessage(
                    f"{request.type!r} is not carried over this link",
                    details={"type": request.type},
                )
            outcome = admit_call(self.manager.registry, channel, request)
        except CorralError as exc:
            exc.request_id = request.id
            self.send_error(channel, exc, getattr(request, "session", None))
            return
        if isinstance(outcome, RunCall):
            self.dispatch(channel, outcome)
        elif outcome is not None:
            channel.send(outcome)  # a retry of an answered request: at most once

    # -- environment calls --------------------------------------------------------------

    def _call(self, peer: Peer, call: RunCall[Session]) -> None:
        """Start an admitted call at once, in the frame's callback.

        A call that completes without waiting (a fast sync env run inline, an async env
        with nothing to await) is answered from here, with no task and no loop iteration
        of its own (the lockstep path). An ``async def`` method that waits runs in its
        own task only, answered from its done callback (:meth:`EnvRunner.start`: a server
        holding 100,000 waiting steps holds one task for each and no timer, issue 34);
        any other call that waits finishes in a task of ours. Either is kept on the
        session, to cancel when it closes.
        """
        request, session, op = call.request, call.session, call.op
        started = time.perf_counter()
        try:
            method, args, kwargs = self.admission.call(peer, op, request)
        except CorralError as exc:
            # Refused before the environment ran: answered, not remembered (a re-send is
            # refused again; the cache would keep the payload).
            with ending((session,), request.id):
                self._fail(session, request.id, self.admission.failure(exc, op, session), False)
            return
        runner = session.runner
        if type(runner) is EnvRunner and runner.is_async(method):
            # The token keeps what the answer needs, not the request and the admitted
            # call: two objects fewer held while the step waits.
            token = (peer, request.id, session, op, started)
            session.task = runner.start(
                method, args, kwargs, self.deadlines, self._answer_call, token
            )
            return
        running = eager_start(self._run(peer, call, started, method, args, kwargs))
        session.task = None if running.done() else running

    async def _run(
        self,
        peer: Peer,
        call: RunCall[Session],
        started: float,
        method: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> None:
        request, session = call.request, call.session
        with ending((session,), request.id):
            try:
                value = await session.runner.call(
                    method, *args, timeout=self.config.step_timeout_s, kwargs=kwargs
                )
            except asyncio.CancelledError:
                self._lost(session, request.id)
                raise
            except Exception as exc:
                if self._failed(session, request.id, call.op, exc):
                    await self.manager.close(session, "a call overran the step timeout")
                return
            self._answered(peer, request.id, session, call.op, started, value)

    def _answer(
        self,
        token: tuple[Peer, int, Session, Op, float],
        value: Any,
        error: BaseException | None,
    ) -> None:
        """The outcome of a call :meth:`EnvRunner.start` ran (``token``: the peer that
        asked, the request's id, the session, the operation, when it started): answer it."""
        peer, request_id, session, op, started = token
        with ending((session,), request_id):
            if isinstance(error, asyncio.CancelledError) or session.machine.closed_reason:
                self._lost(session, request_id)
            elif error is None:
                self._answered(peer, request_id, session, op, started, value)
            elif self._failed(session, request_id, op, error):
                self._spawn(self.manager.close(session, "a call overran the step timeout"))

    def _answered(
        self, peer: Peer, request_id: int, session: Session, op: Op, started: float, value: Any
    ) -> None:
        """The environment returned ``value``: send the call's reply (a result that does
        not check out is the call's error)."""
        admission = self.admission
        reply: m.Reply
        try:
            if op is Op.STATE:
                reply = m.StateReply(request_id, session.id, admission.state(peer, value))
                session.machine.finish(op)
            elif op is Op.SNAPSHOT:
                envelope = self.seal.seal(session.machine.position(), value, time.time())
                reply = m.SnapshotReply(request_id, session.id, envelope)
                session.machine.finish(op)
                self.manager.stats.snapshots += 1
            else:
                payload, done = admission.result(peer, value, op)
                reply = m.Result(request_id, session.id, payload)
                session.machine.finish(op, done)
        except Exception as exc:
            self._failed(session, request_id, op, exc)
            return
        stats = self.manager.stats
        stats.observe(str(op), time.perf_counter() - started)
        stats.count(op)
        session.deliver(reply)

    def _failed(self, session: Session, request_id: int, op: Op, exc: BaseException) -> bool:
        """The call raised ``exc`` (or its result did not check out): answer its error
        (remembered); True when it overran the step timeout (close the session)."""
        error = self.admission.failure(exc, op, session)
        self._fail(session, request_id, error, True)
        return isinstance(error, StepTimeout)

    def _lost(self, session: Session, request_id: int) -> None:
        """The session closed under its call (a drain's deadline): say so, not silence."""
        reason = session.machine.closed_reason
        if reason:
            lost = SessionLost(
                f"session {session.id} is gone: {reason}",
                details={"reason": reason, "session": session.id},
                request_id=request_id,
            )
            session.deliver(m.ErrorReply.of(lost, session.id))

    def _fail(self, session: Session, request_id: int, error: CorralError, remember: bool) -> None:
        """Answer request ``request_id`` of ``session`` with ``error`` (counted)."""
        error.request_id = request_id
        self.manager.stats.error(str(error.code))
        session.end(request_id)
        session.deliver(m.ErrorReply.of(error, session.id), remember=remember)

    def internal_error(self, peer: Peer, exc: BaseException, request_id: int | None = None) -> None:
        """Report a bug in corral to the client without dropping the connection.

        The reply answers ``request_id`` when given, so the caller is not left waiting.
        """
        log.exception("internal error handling a request", exc_info=exc)
        error = InternalError(f"internal server error: {type(exc).__name__}", request_id=request_id)
        self.send_error(peer, error)


__all__ = ["Channel", "EnvService", "ErrorCode", "resolve_env"]

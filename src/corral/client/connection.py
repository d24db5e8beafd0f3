"""One WebSocket connection to a corral server, carrying any number of sessions.

This is the I/O face of :class:`~corral.protocol.client.ClientProtocol`, which makes
every decision (its state table says where the connection goes next): this module only
opens the sockets it is told to, feeds the protocol object every frame that arrives and
every loss, writes the frames it returns, and fires the timers (request timeouts, the
handshake's deadline, the reconnect backoff, keepalive pings). What that gives a caller:

``request`` sends a message and waits for the reply with its id; replies are matched by
id, so many requests (of many sessions) can be in flight at once, and a reply that
arrives after its caller timed out is dropped rather than handed to the next caller.

When the socket drops, the connection reconnects by itself (exponential backoff with
jitter, within a time budget), repeats the handshake, re-attaches every session it
carries with its resume token, and re-sends the requests still unanswered with their
original ids: the server answers one it already ran from its reply cache and runs one it
never saw, so no step is lost and none is applied twice. Callers just see a slower
reply. A session the server no longer has (it restarted, or reaped the session) fails
its requests with :class:`~corral.errors.SessionLost` and the reason, at once.

Behind a front door, every socket after the first names the server holding the
connection's sessions (the ``corral-server`` header; see
:class:`~corral.protocol.client.ClientProtocol`), and the connection follows a session
the server says lives elsewhere. A server's ``going_away`` notice (it drains) goes to
``on_notice``, for whoever moves the sessions off it (the pool, the client).

A keepalive ping every ``ping_interval`` seconds detects a server or network that
stopped answering (a half-open socket) within ``ping_interval + ping_timeout`` and
treats it as a drop.

The socket comes from a :class:`~corral.client.dialers.Dialer`, chosen once (``dialer=``,
else the ``transport=``'s, see :func:`~corral.client.dialers.dialer_for`); every socket
calls back with each frame, which goes to the protocol object in that callback (no
reader task, no queue), and takes writes at once.

Over 500 lines because it is the whole I/O face of one connection (request writing and
deadlines, dialing, the socket's callbacks, timers, keepalive, shutdown) and nothing
else: every decision in it is a call into the protocol object.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from corral import __version__, runtime
from corral.auth import bearer_header, resolve_token
from corral.client.dialers import Dialer, Socket, SocketClosed, dialer_for, keep_alive
from corral.errors import ClientClosed, ConnectionLost, CorralError, RequestTimeout
from corral.protocol.client import (
    Actions,
    Answer,
    ClientProtocol,
    ReconnectPolicy,
    copy_error,
)
from corral.protocol.client_requests import RequestTracker
from corral.protocol.client_sessions import SessionBook
from corral.protocol.codecs import Codec, Frame, get_codec
from corral.protocol.handshake import RESUME_HEADER, ROUTE_HEADER
from corral.protocol.messages import ContractRef, ErrorReply, GoingAway, Reply, Request

log = logging.getLogger("corral.client")


def ws_url(url: str) -> str:
    """Normalise a server URL to its WebSocket endpoint (``http`` → ``ws``, adds ``/ws``)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"unsupported URL scheme in {url!r}; use http(s):// or ws(s)://")
    path = parts.path.rstrip("/")
    if not path.endswith("/ws"):
        path = f"{path}/ws"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def http_url(url: str) -> str:
    """The HTTP base URL of a server given any of its URLs."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    path = path.removesuffix("/ws")
    return urlunsplit((scheme, parts.netloc, path, "", ""))


class Connection:
    """A ``corral/1`` connection: handshake, request/reply matching, resume, shutdown.

    Args:
        url: the server (``http://host:port`` or ``ws://host:port/ws``).
        codec: ``"msgpack"`` or ``"json"``.
        connect_timeout: seconds for the socket, and for its handshake and re-attaches.
        ping_interval: seconds between keepalive pings (None: no keepalive).
        ping_timeout: seconds a pong may take before the socket counts as dead.
        max_frame_bytes: largest frame accepted from the server.
        headers: extra HTTP headers for the WebSocket handshake.
        token: bearer token for a server that requires one (default: ``$CORRAL_TOKEN``,
            or the file named by ``$CORRAL_TOKEN_FILE``).
        reconnect: the :class:`ReconnectPolicy`, True for the default one, False to fail
            every waiting request with ``ConnectionLost`` when the socket drops.
        seed: seeds the backoff jitter (tests).
        transport: ``"auto"`` (default: the native ``picows`` transport when it is
            installed and the loop stays on one thread, else ``asyncio``), ``"picows"``,
            ``"asyncio"`` or ``"websockets"``; ignored with ``dialer``.
        dialer: what opens the sockets (default: the ``transport``'s); the seam of
            :mod:`corral.testing`'s in-process servers.
        server: the id of the server to reach behind a front door (None: the door's
            pick; the connection then stays with it).
        on_notice: called with a server's ``going_away`` notice, on the loop.
    """

    def __init__(
        self,
        url: str,
        *,
        codec: str = "msgpack",
        connect_timeout: float = 10.0,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        max_frame_bytes: int = 64 * 1024 * 1024,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        reconnect: ReconnectPolicy | bool = True,
        seed: int | None = None,
        transport: str = "auto",
        dialer: Dialer | None = None,
        server: str | None = None,
        on_notice: Callable[[GoingAway], None] | None = None,
    ) -> None:
        if ping_interval is not None and ping_interval <= 0:
            raise ValueError(f"ping_interval must be > 0 or None, got {ping_interval}")
        if ping_timeout is not None and ping_timeout <= 0:
            raise ValueError(f"ping_timeout must be > 0 or None, got {ping_timeout}")
        self.url = ws_url(url)
        self.codec: Codec = get_codec(codec)
        self.connect_timeout = connect_timeout
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.max_frame_bytes = max_frame_bytes
        self.headers = headers or {}
        self.token = resolve_token(token)
        self.dialer: Dialer = dialer if dialer is not None else dialer_for(transport)
        """What opens this connection's sockets, chosen once."""
        self.protocol = ClientProtocol(
            self.codec,
            url=self.url,
            reconnect=ReconnectPolicy() if reconnect is True else (reconnect or None),
            client=f"corral/{__version__}",
            seed=seed,
            accept_frame_bytes=max_frame_bytes,
            server=server,
        )
        self.on_notice = on_notice
        """Called with a ``going_away`` notice (the server drains)."""
        self.on_unreachable: Callable[[BaseException], None] | None = None
        """Called when a socket of a resume could not be opened at all (the error): its
        server is unreachable now, whoever owns the sessions may move them."""
        self.going_away_at: float | None = None
        """When (``time.monotonic()``) the home server said it closes, after a notice."""
        self._ws: Socket | None = None
        """The socket of the protocol's current generation, once it is open."""
        self._waiters: dict[int, asyncio.Future[Reply]] = {}
        self._deadlines: dict[int, tuple[float, asyncio.Future[Reply]]] = {}
        """The requests with a timeout: when (the loop's time) each fails, and its future."""
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self._sweeper_loop: asyncio.AbstractEventLoop | None = None
        self._settled: asyncio.Future[BaseException | None] | None = None
        """Resolved when the attempt in progress ends: None (open) or why it failed."""
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._backoff: asyncio.TimerHandle | None = None
        self._dialing: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None

    # -- what the protocol object knows ------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the socket is open, the handshake done and nothing being resumed."""
        return self.protocol.connected

    @property
    def reconnecting(self) -> bool:
        """True while a dropped connection is being re-established."""
        return self.protocol.resuming

    @property
    def welcome(self) -> dict[str, Any]:
        """The server's last ``welcome`` as a map (empty before the first handshake)."""
        welcome = self.protocol.welcome
        return welcome.to_wire() if welcome is not None else {}

    @property
    def tracker(self) -> RequestTracker:
        """The requests waiting for replies (and the count of stale replies)."""
        return self.protocol.tracker

    @property
    def sessions(self) -> SessionBook:
        """The sessions this connection carries, live and lost."""
        return self.protocol.sessions

    @property
    def server_id(self) -> str | None:
        """The id of the server holding this connection's sessions (its home)."""
        return self.protocol.home

    @property
    def going_away(self) -> GoingAway | None:
        """The home server's drain notice, if one came (and the server was not replaced
        since)."""
        return self.protocol.going_away

    @property
    def reconnects(self) -> int:
        """Successful reconnects so far."""
        return self.protocol.reconnects

    @property
    def resent(self) -> int:
        """Requests re-sent with their original id after a reconnect."""
        return self.protocol.resent

    def next_id(self) -> int:
        """The id for the next request (build the request with it, then :meth:`request`)."""
        return self.protocol.next_id()

    # -- requests -----------------------------------------------------------------------

    async def connect(
        self, contract: ContractRef | None = None, *, want_schemas: bool = False
    ) -> dict[str, Any]:
        """Open the socket and complete the handshake; return the ``welcome``.

        While the connection is re-establishing itself this waits for that; after it gave
        up, calling this again starts afresh and re-attaches the sessions it still
        carries.

        Raises:
            CapacityReached: the server refused the connection because it is full.
            TooManyConnections: this address holds too many connections to the server.
            Unauthorized: the server requires a (different) bearer token.
            ConnectionLost: the server could not be reached.
            ContractMismatch / UnsupportedProtocol: the handshake was refused.
        """
        if self.protocol.closed:
            raise ClientClosed("this connection was closed")
        if self.reconnecting and self._settled is not None:
            await asyncio.shield(self._settled)
        if self.connected:
            return self.welcome
        generation = self.protocol.connect(contract, want_schemas)
        settled = self._settled = asyncio.get_running_loop().create_future()
        try:
            await self._dial(generation)
            error = await asyncio.shield(settled)
        except BaseException as exc:  # cancelled: this attempt is abandoned
            if not settled.done():
                self._on_lost(generation, ConnectionLost(f"the connect was abandoned: {exc!r}"))
            raise
        if error is not None:
            raise error
        return self.welcome

    async def request(self, request: Request, timeout: float | None) -> Reply:
        """Send ``request`` (built with :meth:`next_id`) and return its reply.

        A drop of the connection before the reply does not fail the request: it is
        re-sent with the same id once the connection is back. A request made while the
        connection is being re-established waits and goes out once the sessions are
        re-attached.

        Raises:
            CorralError: the server's error reply, as its exception class.
            SessionLost: the session is gone (server restarted, session reaped).
            RequestTimeout: no reply within ``timeout`` (a late reply is then dropped).
            ConnectionLost: the connection failed and could not be re-established.
        """
        frame = self.protocol.send(request)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiters[request.id] = future
        if frame is not None:
            ws = self._ws
            try:
                if ws is None:
                    raise SocketClosed("not connected")
                ws.write(frame)
            except SocketClosed as exc:
                error = self.protocol.write_failed(request.id, str(exc))
                if error is not None:  # else still outstanding: the reconnect re-sends it
                    self._waiters.pop(request.id, None)
                    raise error from None
        if timeout is not None:
            self._expect(request.id, future, timeout)
        try:
            return await future
        except TimeoutError:
            self._waiters.pop(request.id, None)
            assert timeout is not None
            raise self.protocol.timed_out(request, timeout) from None
        except BaseException:
            # A cancelled caller no longer wants the request: it must not be re-sent.
            self.forget(request.id)
            raise
        finally:
            if timeout is not None:
                self._deadlines.pop(request.id, None)

    def _expect(self, request_id: int, future: asyncio.Future[Reply], timeout: float) -> None:
        """Fail ``future`` with ``TimeoutError`` if no reply came ``timeout`` s from now."""
        loop = future.get_loop()
        deadline = loop.time() + timeout
        self._deadlines[request_id] = (deadline, future)
        if deadline < self._sweep_at or self._sweeper_loop is not loop:
            self._arm_sweep(loop, deadline)

    def _arm_sweep(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._sweep_at = when
        self._sweeper_loop = loop
        self._sweeper = loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Time out the requests whose deadline passed; ring again for the next one.

        One timer serves every request in flight: a reply only drops its deadline
        (cancelling and re-arming a timer per request cost more than the rest of a
        fast request's bookkeeping), and the timer, when it rings, re-arms for the
        earliest deadline left.
        """
        rang, loop = self._sweep_at, self._sweeper_loop
        self._sweeper, self._sweep_at, self._sweeper_loop = None, math.inf, None
        later = math.inf
        for request_id, (deadline, future) in list(self._deadlines.items()):
            if deadline <= rang:
                del self._deadlines[request_id]
                if not future.done():
                    future.set_exception(TimeoutError())
            elif deadline < later:
                later = deadline
        if later != math.inf and loop is not None and not loop.is_closed():
            self._arm_sweep(loop, later)

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id``; its reply, if it comes, is dropped."""
        self.protocol.forget(request_id)
        future = self._waiters.pop(request_id, None)
        if future is not None and not future.done():
            future.cancel()

    # -- sockets ------------------------------------------------------------------------

    async def _dial(self, generation: int) -> None:
        """Open the socket of ``generation`` and write its ``hello``; the rest of the
        handshake comes in by frames (a failure goes to the protocol object)."""
        headers = dict(self.headers)
        if self.token is not None:
            headers.update(bearer_header(self.token))
        resume = self.protocol.resume_ids()
        if resume:
            headers[RESUME_HEADER] = ",".join(resume)
        route = self.protocol.route()
        if route is not None:
            headers[ROUTE_HEADER] = route
        try:
            ws = await self.dialer.open(
                self.url,
                self.codec.subprotocol,
                headers,
                self.connect_timeout,
                self.max_frame_bytes,
            )
        except Exception as exc:  # refused, unreachable, or a dialer that cannot serve
            if not isinstance(exc, CorralError):
                log.warning("opening a socket to %s failed: %r", self.url, exc)
            resuming = self.protocol.resuming
            self._on_lost(generation, exc)
            if resuming and self.on_unreachable is not None:
                self.on_unreachable(exc)
            return
        hello = self.protocol.opened(generation)
        if hello is None:  # closed or superseded meanwhile
            ws.abort()
            return
        self._ws = ws
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(
            self.connect_timeout, self._handshake_overran, generation
        )
        if self.ping_interval is not None:
            self._keepalive = loop.create_task(
                self._keep_alive(ws, generation), name="corral-client-keepalive"
            )
        self._write([hello])
        # Last: a socket that already ended reports it here, and is dropped with the rest.
        ws.listen(self._dispatch, _reporter(self, generation))

    def _handshake_overran(self, generation: int) -> None:
        self._on_lost(
            generation,
            RequestTimeout(
                f"no handshake from {self.url} within {self.connect_timeout:g} s",
                details={"timeout_s": self.connect_timeout},
            ),
        )

    def _redial(self) -> None:
        """The backoff elapsed: dial the next socket, if the protocol still wants one."""
        self._backoff = None
        generation = self.protocol.timer_fired(time.monotonic())
        if generation is not None:
            self._dialing = asyncio.get_running_loop().create_task(
                self._dial(generation), name="corral-client-reconnect"
            )

    def _dispatch(self, frame: Frame) -> None:
        """One frame from the server: resolve its waiter, or do the handshake's actions."""
        try:
            out = self.protocol.receive(frame)
        except CorralError as exc:
            log.warning("dropping an unreadable frame from the server: %s", exc)
            return
        if out is None:
            return
        if type(out) is Answer:
            future = self._waiters.pop(out.request_id, None)
            if future is not None and not future.done():
                if out.error is not None:
                    future.set_exception(out.error)
                else:
                    future.set_result(out.reply)  # type: ignore[arg-type]
        elif isinstance(out, Actions):
            self._act(out)
        elif isinstance(out, GoingAway):
            self.going_away_at = time.monotonic() + out.deadline_s
            log.info("%s goes away within %g s (%s)", self.url, out.deadline_s, out.reason)
            if self.on_notice is not None:
                self.on_notice(out)
        elif isinstance(out, ErrorReply):
            log.warning("server reported: %s", out.message)

    async def _keep_alive(self, ws: Socket, generation: int) -> None:
        assert self.ping_interval is not None
        reason = await keep_alive(ws, self.ping_interval, self.ping_timeout)
        if reason is not None:
            log.warning("%s: %s", self.url, reason)
            self._on_lost(generation, ConnectionLost(reason))

    def _on_lost(self, generation: int, error: BaseException) -> None:
        """Socket ``generation`` is gone (or could not be opened): do what the protocol
        object says."""
        actions = self.protocol.lost(generation, error, time.monotonic())
        if actions is not None:
            if isinstance(error, ConnectionLost) and actions.redial_after is not None:
                log.info("connection to %s lost (%s); reconnecting", self.url, error.message)
            self._act(actions)

    def _act(self, actions: Actions) -> None:
        """Do what the protocol object returned, in order."""
        self._write(actions.write)
        for request_id, error in actions.fail:
            self._fail(request_id, error)
        if actions.fail_all is not None:
            self._fail_waiters(actions.fail_all)
        if actions.drop:
            self._drop()
        if actions.redial_after is not None:
            loop = asyncio.get_running_loop()
            self._backoff = loop.call_later(actions.redial_after, self._redial)
            if self._settled is None or self._settled.done():
                self._settled = loop.create_future()  # what a connect() meanwhile waits for
        if actions.settled:
            self._cancel_handshake_timer()
            settled = self._settled
            if settled is not None and not settled.done():
                settled.set_result(actions.error)

    def _write(self, frames: list[Frame]) -> None:
        ws = self._ws
        if ws is None:
            return
        try:
            for frame in frames:
                ws.write(frame)
        except SocketClosed:
            pass  # the socket's end is reported by its own callback

    def _drop(self) -> None:
        """Drop the current socket and what serves it."""
        ws, self._ws = self._ws, None
        self._cancel_handshake_timer()
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None and keepalive is not asyncio.current_task():
            keepalive.cancel()
        if ws is not None:
            with contextlib.suppress(Exception):
                ws.abort()

    def _cancel_handshake_timer(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def _fail(self, request_id: int, error: CorralError) -> None:
        future = self._waiters.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def _fail_waiters(self, error: CorralError) -> None:
        waiters, self._waiters = self._waiters, {}
        for request_id, future in waiters.items():
            if not future.done():
                future.set_exception(copy_error(error, request_id))

    async def close(self) -> None:
        """Close the socket (idempotent); waiting requests fail with ``ClientClosed``."""
        if self.protocol.closed:
            return
        self.protocol.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper, self._sweep_at, self._sweeper_loop = None, math.inf, None
        if self._backoff is not None:
            self._backoff.cancel()
        self._cancel_handshake_timer()
        tasks = [t for t in (self._dialing, self._keepalive) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            await runtime.reap(task)
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await runtime.wait_for(ws.close(), 2.0)
            ws.abort()
        error = ClientClosed("the client was closed")
        self._fail_waiters(error)
        if self._settled is not None and not self._settled.done():
            self._settled.set_result(error)


def _reporter(connection: Connection, generation: int) -> Callable[[str], None]:
    """The socket's ``on_closed``: its loss, reported for its generation."""

    def report(reason: str) -> None:
        connection._on_lost(generation, ConnectionLost(reason))

    return report


__all__ = ["Connection", "http_url", "ws_url"]

"""One WebSocket connection to a corral server, carrying any number of sessions.

This is the I/O face of :class:`~corral.protocol.client.ClientProtocol`, which makes
every decision: it writes the frames the protocol object returns, feeds it every frame
that arrives, reports a dropped socket, and fires the timers (request timeouts, the
reconnect backoff, keepalive pings). What that gives a caller:

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

A keepalive ping every ``ping_interval`` seconds detects a server or network that
stopped answering (a half-open socket) within ``ping_interval + ping_timeout`` and
treats it as a drop.

The socket comes from a dialer: the native one (:mod:`corral.client.picows_socket`) and
the asyncio one (:mod:`corral.client.asyncio_socket`, for a loop that moves between
threads) call back with each frame, which goes to the protocol object in that callback
(no reader task); a ``websockets`` socket (or :mod:`corral.testing`'s in-process one) is
read by a reader task. ``transport=`` chooses (see :func:`default_dialer`).

Over 600 lines because it is the whole I/O face of one connection (socket seam, request
writing, the establish/resume sequence, reader, keepalive, shutdown) and nothing else:
every decision in it is a call into the protocol object.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from corral import __version__
from corral.auth import bearer_header, resolve_token
from corral.blocking import moves_between_threads
from corral.client.asyncio_socket import asyncio_dialer
from corral.client.refusal import refusal
from corral.errors import (
    ClientClosed,
    ConnectionLost,
    CorralError,
    UnsupportedProtocol,
)
from corral.protocol.client import (
    AfterLoss,
    ClientProtocol,
    ReconnectPolicy,
    RequestTracker,
    SessionBook,
    copy_error,
)
from corral.protocol.codecs import Codec, Frame, get_codec
from corral.protocol.handshake import RESUME_HEADER
from corral.protocol.messages import ContractRef, ErrorReply, Reply, Request

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


class Transport(Protocol):
    """The part of a socket's transport a connection uses: dropping it at once."""

    def abort(self) -> None:
        """Close now, without a closing handshake."""
        ...


class Socket(Protocol):
    """What a :class:`Connection` needs of its socket; a websockets ``ClientConnection``
    is one, :mod:`corral.testing`'s in-process socket another."""

    @property
    def subprotocol(self) -> str | None:
        """The subprotocol the server accepted."""
        ...

    @property
    def close_code(self) -> int | None:
        """The close code, once closed."""
        ...

    @property
    def close_reason(self) -> str | None:
        """The close reason, once closed."""
        ...

    @property
    def transport(self) -> Transport:
        """The transport underneath (to abort it)."""
        ...

    async def send(self, message: Frame) -> None:
        """Write one frame; raises ``ConnectionClosed`` once closed."""
        ...

    async def ping(self) -> Awaitable[float]:
        """Send a ping; the result resolves when the pong arrives."""
        ...

    async def close(self) -> None:
        """Close with a closing handshake."""
        ...

    def __aiter__(self) -> AsyncIterator[Frame]:
        """The frames that arrive, until the socket closes (a socket with ``listen``
        delivers them by callback instead; see :class:`Listening`)."""
        ...


class Listening(Protocol):
    """A socket that calls back with each frame (no reader task): the picows and the
    asyncio ones."""

    def listen(self, on_frame: Callable[[Frame], None], on_closed: Callable[[str], None]) -> None:
        """Hand every frame to ``on_frame``; call ``on_closed`` with why, once, at the end."""
        ...

    def write(self, message: Frame) -> None:
        """Write one frame now; raises ``ConnectionClosed`` once closed."""
        ...


TRANSPORTS = ("auto", "picows", "asyncio", "websockets")
"""The client transports: ``auto`` is ``picows`` when it is importable and the loop stays
on one thread, else ``asyncio``."""


def picows_available() -> bool:
    """True when the native transport (``picows``) can be imported."""
    try:
        import picows  # noqa: F401
    except ImportError:
        return False
    return True


def default_dialer(transport: str = "auto", *, one_thread: bool = True) -> Dialer:
    """The dialer of ``transport`` (see :data:`TRANSPORTS`).

    ``one_thread=False`` says the connection's loop moves between threads (the loop of
    the blocking twins, :mod:`corral.blocking`): picows checks that its sockets are used
    from the thread that opened them, so ``auto`` takes the asyncio transport there
    (asyncio's transports belong to a loop, whichever thread runs it).

    Raises:
        ValueError: an unknown transport, ``picows`` asked for but not installed, or
            asked for on a loop that moves between threads.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; use one of {', '.join(TRANSPORTS)}")
    if transport == "picows" and not one_thread:
        raise ValueError(
            "transport='picows' cannot serve a blocking twin (.sync()): its loop moves "
            "between threads and picows sockets stay on one; use 'auto' or 'asyncio'"
        )
    if transport == "websockets":
        return websocket_dialer
    if transport == "asyncio" or (transport == "auto" and not (one_thread and picows_available())):
        return asyncio_dialer
    try:
        from corral.client.picows_socket import picows_dialer
    except ImportError as exc:
        raise ValueError("transport='picows' needs the picows package: pip install picows") from exc
    return picows_dialer


class Dialer(Protocol):
    """Opens a connection's socket (see :func:`websocket_dialer`)."""

    async def __call__(
        self, url: str, subprotocol: str, headers: dict[str, str], timeout: float, max_size: int
    ) -> Socket:
        """A socket to ``url`` speaking ``subprotocol``; raises the refusal as a CorralError."""
        ...


async def websocket_dialer(
    url: str, subprotocol: str, headers: dict[str, str], timeout: float, max_size: int
) -> Socket:
    """A WebSocket to ``url`` on the ``websockets`` library (``transport="websockets"``).

    Raises:
        CapacityReached / TooManyConnections / Unauthorized: the server refused it.
        ConnectionLost: the server could not be reached.
        UnsupportedProtocol: the server did not accept ``subprotocol``.
    """
    try:
        ws = await connect(
            url,
            subprotocols=[subprotocol],  # type: ignore[list-item]
            open_timeout=timeout,
            # Keepalive is the connection's (see Connection._keep_alive): it drops a dead
            # socket at once instead of waiting out a close handshake nobody answers.
            ping_interval=None,
            ping_timeout=None,
            close_timeout=2.0,
            max_size=max_size,
            additional_headers=headers,
            compression=None,
            user_agent_header=f"corral/{__version__}",
        )
    except InvalidStatus as exc:
        response = exc.response
        raise refusal(
            response.status_code, bytes(response.body or b""), response.headers.get("Retry-After")
        ) from None
    except (OSError, TimeoutError, WebSocketException) as exc:
        raise ConnectionLost(f"cannot connect to {url}: {exc}") from None
    if ws.subprotocol != subprotocol:
        await ws.close()
        raise UnsupportedProtocol(
            f"{url} did not accept subprotocol {subprotocol}",
            details={"accepted": ws.subprotocol},
        )
    return ws


class Connection:
    """A ``corral/1`` connection: handshake, request/reply matching, resume, shutdown.

    Args:
        url: the server (``http://host:port`` or ``ws://host:port/ws``).
        codec: ``"msgpack"`` or ``"json"``.
        connect_timeout: seconds for the socket, the handshake and each re-attach.
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
            ``"asyncio"`` or ``"websockets"``.
        dialer: opens the socket (default: the ``transport``'s); the seam of
            :mod:`corral.testing`'s in-process transport.
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
        default_dialer(transport)  # an unknown transport fails here, not at connect time
        self.transport = transport
        self._dialer = dialer
        self.protocol = ClientProtocol(
            self.codec,
            reconnect=ReconnectPolicy() if reconnect is True else (reconnect or None),
            client=f"corral/{__version__}",
            seed=seed,
            accept_frame_bytes=max_frame_bytes,
        )
        self._contract: ContractRef | None = None
        self._ws: Socket | None = None
        self._write_now: Callable[[Frame], None] | None = None
        """The socket's synchronous write, when it has one (the native transport)."""
        self._waiters: dict[int, asyncio.Future[Reply]] = {}
        self._deadlines: dict[int, tuple[float, asyncio.Future[Reply]]] = {}
        """The requests with a timeout: when (the loop's time) each fails, and its future."""
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self._sweeper_loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._reconnector: asyncio.Task[None] | None = None

    # -- what the protocol object knows ------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the socket is open, the handshake done and nothing being resumed."""
        return self.protocol.connected

    @property
    def reconnecting(self) -> bool:
        """True while a dropped connection is being re-established."""
        return self._reconnector is not None and not self._reconnector.done()

    @property
    def writes_at_once(self) -> bool:
        """The socket is a callback-style one (picows, asyncio's Protocol API) and
        connected: a request is written in the caller's step and its reply is one future
        to await, so a blocking twin may drive it without a task (``taskless``)."""
        return self._write_now is not None

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

        After the connection gave up reconnecting, calling this again starts afresh and
        re-attaches the sessions it still carries.

        Raises:
            CapacityReached: the server refused the connection because it is full.
            TooManyConnections: this address holds too many connections to the server.
            Unauthorized: the server requires a (different) bearer token.
            ConnectionLost: the server could not be reached.
            ContractMismatch / UnsupportedProtocol: the handshake was refused.
        """
        if self.protocol.closed:
            raise ClientClosed("this connection was closed")
        if self.reconnecting:
            assert self._reconnector is not None
            await asyncio.shield(self._reconnector)
        if self.connected:
            return self.welcome
        self._contract = contract
        self.protocol.connecting()
        await self._establish(want_schemas=want_schemas)
        return self.welcome

    async def request(
        self, request: Request, timeout: float | None, *, replay: bool = True
    ) -> Reply:
        """Send ``request`` (built with :meth:`next_id`) and return its reply.

        With ``replay`` (the default), a drop of the connection before the reply does not
        fail the request: it is re-sent with the same id once the connection is back. A
        request made while the connection is being re-established waits and goes out once
        the sessions are re-attached.

        Raises:
            CorralError: the server's error reply, as its exception class.
            SessionLost: the session is gone (server restarted, session reaped).
            RequestTimeout: no reply within ``timeout`` (a late reply is then dropped).
            ConnectionLost: the connection failed and could not be re-established.
        """
        frame = self.protocol.send(request, replay=replay)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiters[request.id] = future
        if frame is not None:
            write = self._write_now
            if write is None:
                await self._write(request.id, frame)
            else:  # the callback-style sockets write at once: no coroutine for it
                try:
                    write(frame)
                except ConnectionClosed as exc:
                    self._write_failed(request.id, str(exc))
        return await self._reply(request, future, timeout)

    async def _reply(
        self, request: Request, future: asyncio.Future[Reply], timeout: float | None
    ) -> Reply:
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

    async def _write(self, request_id: int, frame: Frame) -> None:
        ws = self._ws
        if ws is not None:
            try:
                write = self._write_now
                if write is not None:
                    write(frame)
                else:
                    await ws.send(frame)
                return
            except ConnectionClosed as exc:
                reason = str(exc)
        else:
            reason = "not connected"
        self._write_failed(request_id, reason)

    def _write_failed(self, request_id: int, reason: str) -> None:
        error = self.protocol.write_failed(request_id, reason)
        if error is not None:  # else still outstanding: the reconnect re-sends it
            self._waiters.pop(request_id, None)
            raise error

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id``; its reply, if it comes, is dropped."""
        self.protocol.forget(request_id)
        future = self._waiters.pop(request_id, None)
        if future is not None and not future.done():
            future.cancel()

    # -- establishing and re-establishing ---------------------------------------------

    async def _open_socket(self) -> Socket:
        headers = dict(self.headers)
        if self.token is not None:
            headers.update(bearer_header(self.token))
        resume = self.protocol.resume_ids()
        if resume:
            headers[RESUME_HEADER] = ",".join(resume)
        return await self.dialer(
            self.url, self.codec.subprotocol, headers, self.connect_timeout, self.max_frame_bytes
        )

    @property
    def dialer(self) -> Dialer:
        """What opens this connection's sockets: the one given, else the transport's for
        the running loop (see :func:`default_dialer`)."""
        if self._dialer is not None:
            return self._dialer
        loop = asyncio.get_running_loop()
        return default_dialer(self.transport, one_thread=not moves_between_threads(loop))

    async def _establish(self, *, want_schemas: bool = False) -> None:
        """Socket, handshake, then the protocol's resume plan: re-attach, fail, re-send."""
        ws = await self._open_socket()
        generation = self.protocol.socket_opened()
        self._ws = ws
        listen = getattr(ws, "listen", None)
        if listen is not None:  # the native socket calls back: no reader task
            self._write_now = ws.write  # type: ignore[attr-defined]
            listen(self._dispatch, lambda reason: self._on_lost(generation, reason))
        else:
            self._write_now = None
            self._reader = asyncio.create_task(
                self._read(ws, generation), name="corral-client-reader"
            )
        if self.ping_interval is not None:
            self._keepalive = asyncio.create_task(
                self._keep_alive(ws, generation), name="corral-client-keepalive"
            )
        try:
            hello, frame = self.protocol.hello(self._contract, want_schemas)
            welcome = await self._exchange(hello, frame)
            attaches = self.protocol.welcomed(welcome)
            if attaches:
                results = await asyncio.gather(
                    *(self._exchange(attach, frame) for attach, frame in attaches),
                    return_exceptions=True,
                )
                self.protocol.attached([attach for attach, _ in attaches], results)
            for request_id, error in self.protocol.fail_lost():
                self._fail(request_id, error)
            while batch := self.protocol.resend():
                for entry in batch:
                    try:
                        await ws.send(entry.frame)
                    except ConnectionClosed:
                        raise ConnectionLost("the connection dropped while re-sending") from None
            self.protocol.established(generation)
        except BaseException:
            self._ws = None
            self._write_now = None
            with contextlib.suppress(Exception):
                ws.transport.abort()
            raise

    async def _exchange(self, request: Request, frame: Frame) -> Reply:
        """Write a socket-bound request's ``frame`` and wait for its reply."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiters[request.id] = future
        await self._write(request.id, frame)
        return await self._reply(request, future, self.connect_timeout)

    async def _reconnect_loop(self, cause: str) -> None:
        protocol = self.protocol
        while not protocol.closed:
            now = time.monotonic()
            wait = protocol.retry_delay(now)
            if wait is None:
                self._fail_all(protocol.exhausted(self.url, cause, now))
                return
            await asyncio.sleep(wait)
            try:
                await self._establish()
            except CorralError as exc:
                if protocol.retryable(exc):
                    cause = exc.message
                    log.info("reconnect attempt to %s failed: %s", self.url, exc)
                    continue
                self._fail_all(exc)  # refused for good: wrong token, contract, protocol
                return
            except Exception as exc:  # a waiter must never hang on a crashed reconnect
                log.exception("reconnecting to %s failed unexpectedly", self.url)
                self._fail_all(ConnectionLost(f"reconnecting failed: {exc!r}"))
                return
            log.info("reconnected to %s", self.url)
            return

    # -- the socket's tasks ----------------------------------------------------------

    async def _read(self, ws: Socket, generation: int) -> None:
        try:
            async for frame in ws:
                self._dispatch(frame)
            reason = f"closed by the server (code {ws.close_code} {ws.close_reason or ''})"
        except ConnectionClosed as exc:
            reason = f"connection lost: {exc}"
        except Exception as exc:  # the reader must report the loss, whatever happened
            reason = f"connection failed: {exc!r}"
        self._on_lost(generation, reason.strip())

    def _dispatch(self, frame: Frame) -> None:
        try:
            answer = self.protocol.receive(frame)
        except CorralError as exc:
            log.warning("dropping an unreadable frame from the server: %s", exc)
            return
        if answer is None:
            return
        if isinstance(answer, ErrorReply):
            log.warning("server reported: %s", answer.message)
            return
        future = self._waiters.pop(answer.request_id, None)
        if future is not None and not future.done():
            if answer.error is not None:
                future.set_exception(answer.error)
            else:
                future.set_result(answer.reply)  # type: ignore[arg-type]

    async def _keep_alive(self, ws: Socket, generation: int) -> None:
        assert self.ping_interval is not None
        while True:
            await asyncio.sleep(self.ping_interval)
            try:
                async with asyncio.timeout(self.ping_timeout):
                    pong = await ws.ping()
                    await pong
            except TimeoutError:
                reason = (
                    f"no keepalive pong within {self.ping_timeout:g} s "
                    "(the server or the network stopped answering)"
                )
                log.warning("%s: %s", self.url, reason)
                self._on_lost(generation, reason)
                ws.transport.abort()
                return
            except ConnectionClosed:
                return

    def _on_lost(self, generation: int, reason: str) -> None:
        """The socket of ``generation`` is gone: do what the protocol object says."""
        loss = self.protocol.lost(generation, reason, time.monotonic())
        if loss is None:
            return
        self._ws = None
        self._write_now = None
        keepalive = self._keepalive
        if keepalive is not None and keepalive is not asyncio.current_task():
            keepalive.cancel()
        for request_id in loss.failed:
            self._fail(request_id, copy_error(loss.error, request_id))
        if loss.then is AfterLoss.FAIL:
            self._fail_waiters(loss.error)
        elif loss.then is AfterLoss.RECONNECT:
            log.info("connection to %s lost (%s); reconnecting", self.url, reason)
            self._reconnector = asyncio.create_task(
                self._reconnect_loop(reason), name="corral-client-reconnect"
            )

    def _fail(self, request_id: int, error: CorralError) -> None:
        future = self._waiters.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def _fail_all(self, error: CorralError) -> None:
        self.protocol.give_up(error)
        self._fail_waiters(error)

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
        tasks = [t for t in (self._reconnector, self._keepalive) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), 2.0)
            ws.transport.abort()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        self._fail_waiters(ClientClosed("the client was closed"))

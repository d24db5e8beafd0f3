"""One WebSocket connection to a corral server, carrying any number of sessions.

The connection owns the socket, the codec and the request tracker. ``request`` sends a
message with a fresh id and waits for the reply with that id; replies are matched by id,
so many requests (of many sessions) can be in flight at once, and a reply that arrives
after its caller timed out is dropped rather than handed to the next caller.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from corral import __version__
from corral.auth import bearer_header, resolve_token
from corral.errors import (
    CapacityReached,
    ClientClosed,
    ConnectionLost,
    CorralError,
    FrameTooLarge,
    RequestTimeout,
    SessionLost,
    TooManyConnections,
    Unauthorized,
    UnknownSession,
    UnsupportedProtocol,
    error_from_wire,
)
from corral.protocol.client import RequestTracker, SessionBook
from corral.protocol.codecs import PROTOCOL, Codec, Frame, get_codec
from corral.protocol.handshake import MAX_RESUME_IDS, RESUME_HEADER
from corral.protocol.messages import ContractRef

log = logging.getLogger("corral.client")

_RETRYABLE = (ConnectionLost, RequestTimeout, CapacityReached, TooManyConnections)
"""Failures of a reconnect attempt worth another attempt; anything else is final."""


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
        self.reconnect: ReconnectPolicy | None = (
            ReconnectPolicy() if reconnect is True else (reconnect or None)
        )
        self.tracker = RequestTracker()
        self.sessions = SessionBook()
        self.welcome: dict[str, Any] = {}
        self.reconnects = 0
        """Successful reconnects so far."""
        self.resent = 0
        """Requests re-sent with their original id after a reconnect."""
        self._contract: ContractRef | None = None
        self._ws: ClientConnection | None = None
        self._generation = 0
        self._lost_generation = 0
        self._open = False
        self._waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._reconnector: asyncio.Task[None] | None = None
        self._closed = False
        self._failed: CorralError | None = None
        self._rng = random.Random(seed)

    @property
    def connected(self) -> bool:
        """True while the socket is open, the handshake done and nothing being resumed."""
        return self._open and self._failed is None and not self._closed

    @property
    def reconnecting(self) -> bool:
        """True while a dropped connection is being re-established."""
        return self._reconnector is not None and not self._reconnector.done()

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
        if self._closed:
            raise ClientClosed("this connection was closed")
        if self.reconnecting:
            assert self._reconnector is not None
            await asyncio.shield(self._reconnector)
        if self.connected:
            return self.welcome
        self._contract = contract
        self._failed = None
        await self._establish(want_schemas=want_schemas)
        return self.welcome

    async def request(
        self, message: dict[str, Any], timeout: float | None, *, replay: bool = True
    ) -> dict[str, Any]:
        """Send ``message`` with a fresh id and return its reply.

        With ``replay`` (the default), a drop of the connection before the reply does not
        fail the request: it is re-sent with the same id once the connection is back.

        Raises:
            CorralError: the server's error reply, as its exception class.
            SessionLost: the session is gone (server restarted, session reaped).
            RequestTimeout: no reply within ``timeout`` (a late reply is then dropped).
            ConnectionLost: the connection failed and could not be re-established.
        """
        request_id = self.tracker.new(str(message.get("type")), message=message, replay=replay)
        try:
            future = await self.send(message)
        except BaseException:
            self.tracker.forget(request_id)
            raise
        try:
            reply = await _wait(future, timeout)
        except TimeoutError:
            self.forget(request_id)
            raise RequestTimeout(
                f"no reply to {message.get('type')!r} within {timeout:g} s",
                details={"timeout_s": timeout},
                request_id=request_id,
            ) from None
        except BaseException:
            # A cancelled caller no longer wants the request: it must not be re-sent.
            self.forget(request_id)
            raise
        if reply.get("type") == "error":
            raise error_from_wire(reply, request_id)
        return reply

    async def send(self, message: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """Send a message that already has its ``id``; return the future of its reply.

        While the connection is being re-established the message is queued and goes out
        once the sessions are re-attached.
        """
        if self._closed:
            raise ClientClosed("this connection was closed")
        request_id = message["id"]
        if self._failed is not None:
            self.tracker.forget(request_id)
            raise _copy(self._failed, request_id)
        session = message.get("session")
        if isinstance(session, str) and self.sessions.reason(session) is not None:
            self.tracker.forget(request_id)
            raise self.sessions.lost_error(session, request_id)
        frame = self.codec.encode(message)
        limit = self.welcome.get("limits", {}).get("max_frame_bytes")
        if isinstance(limit, int) and len(frame) > limit:
            self.tracker.forget(request_id)
            raise FrameTooLarge(
                f"{message.get('type')!r} message of {len(frame)} bytes exceeds the server's "
                f"frame limit of {limit} bytes",
                details={"size": len(frame), "limit": limit},
                request_id=request_id,
            )
        self.tracker.record(request_id, message)
        entry = self.tracker.get(request_id)
        bound = entry is not None and not entry.replay
        if not (self._open or bound or self.reconnecting):
            self.tracker.forget(request_id)
            raise ConnectionLost("not connected; call connect() first", request_id=request_id)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = future
        if self._open or bound:
            await self._transmit(request_id, frame)
        return future

    async def _transmit(self, request_id: int, frame: Frame) -> None:
        ws, generation = self._ws, self._generation
        entry = self.tracker.get(request_id)
        replayable = entry is not None and entry.replay and self.reconnect is not None
        if ws is None:
            if not replayable:
                self._drop(request_id)
                raise ConnectionLost("not connected", request_id=request_id)
            return  # the reconnect sends it
        # Marked before the await so that a concurrent replay never sends it twice here.
        self.tracker.mark_sent(request_id, generation)
        try:
            await ws.send(frame)
        except ConnectionClosed as exc:
            if not replayable:
                self._drop(request_id)
                raise ConnectionLost(f"connection closed: {exc}", request_id=request_id) from None
            # Still outstanding: the reconnect re-sends it with the same id.

    def _drop(self, request_id: int) -> None:
        self.tracker.forget(request_id)
        self._waiters.pop(request_id, None)

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id``; its reply, if it comes, is dropped."""
        self.tracker.forget(request_id)
        future = self._waiters.pop(request_id, None)
        if future is not None and not future.done():
            future.cancel()

    # -- establishing and re-establishing ---------------------------------------------

    async def _open_socket(self) -> ClientConnection:
        headers = dict(self.headers)
        if self.token is not None:
            headers.update(bearer_header(self.token))
        if self.sessions.live:
            headers[RESUME_HEADER] = ",".join(list(self.sessions.live)[:MAX_RESUME_IDS])
        try:
            ws = await connect(
                self.url,
                subprotocols=[self.codec.subprotocol],  # type: ignore[list-item]
                open_timeout=self.connect_timeout,
                # Keepalive is ours (see _keep_alive): it drops a dead socket at once
                # instead of waiting out a close handshake the peer will never answer.
                ping_interval=None,
                ping_timeout=None,
                close_timeout=2.0,
                max_size=self.max_frame_bytes,
                additional_headers=headers,
                compression=None,
                user_agent_header=f"corral/{__version__}",
            )
        except InvalidStatus as exc:
            raise _refusal(exc) from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise ConnectionLost(f"cannot connect to {self.url}: {exc}") from None
        if ws.subprotocol != self.codec.subprotocol:
            await ws.close()
            raise UnsupportedProtocol(
                f"{self.url} did not accept subprotocol {self.codec.subprotocol}",
                details={"accepted": ws.subprotocol},
            )
        return ws

    async def _establish(self, *, want_schemas: bool = False) -> None:
        """Socket, handshake, re-attach the sessions, re-send what is unanswered."""
        ws = await self._open_socket()
        self._generation += 1
        generation = self._generation
        self._ws = ws
        self._reader = asyncio.create_task(self._read(ws, generation), name="corral-client-reader")
        if self.ping_interval is not None:
            self._keepalive = asyncio.create_task(
                self._keep_alive(ws, generation), name="corral-client-keepalive"
            )
        try:
            hello: dict[str, Any] = {
                "type": "hello",
                "protocol": PROTOCOL,
                "client": f"corral/{__version__}",
                "schemas": want_schemas,
            }
            if self._contract is not None:
                hello["contract"] = {
                    "version": self._contract.version,
                    "fingerprint": self._contract.fingerprint,
                }
            welcome = await self.request(hello, timeout=self.connect_timeout, replay=False)
            if self.welcome and not want_schemas and "schemas" in self.welcome:
                welcome.setdefault("schemas", self.welcome["schemas"])
            self.welcome = welcome
            server = welcome.get("server")
            instance = server.get("instance") if isinstance(server, dict) else None
            self.sessions.welcome(instance if isinstance(instance, str) else None)
            await self._reattach()
            self._fail_lost_requests()
            await self._replay(ws, generation)
            if self._lost_generation == generation:
                raise ConnectionLost("the connection dropped while it was being resumed")
        except BaseException:
            self._ws = None
            with contextlib.suppress(Exception):
                ws.transport.abort()
            raise
        self._open = True

    async def _reattach(self) -> None:
        live = list(self.sessions.live.items())
        if not live:
            return
        results = await asyncio.gather(
            *(
                self.request(
                    {"type": "attach", "session": sid, "token": token},
                    timeout=self.connect_timeout,
                    replay=False,
                )
                for sid, token in live
            ),
            return_exceptions=True,
        )
        retry: BaseException | None = None
        for (sid, _), result in zip(live, results, strict=True):
            if isinstance(result, SessionLost):
                self.sessions.lose(sid, str(result.details.get("reason") or result.message))
            elif isinstance(result, (UnknownSession, Unauthorized)):
                self.sessions.lose(sid, f"the server does not have it any more ({result.message})")
            elif isinstance(result, BaseException):
                retry = retry or result
        if retry is not None:
            raise retry

    def _fail_lost_requests(self) -> None:
        for request_id in self.tracker.of_sessions(self.sessions.lost):
            entry = self.tracker.get(request_id)
            session = entry.session if entry is not None else None
            self.tracker.forget(request_id)
            future = self._waiters.pop(request_id, None)
            if session is not None and future is not None and not future.done():
                future.set_exception(self.sessions.lost_error(session, request_id))

    async def _replay(self, ws: ClientConnection, generation: int) -> None:
        # Loops until nothing is left, so requests queued while this runs go out too
        # before the connection is declared open.
        while batch := self.tracker.unsent(generation):
            for request_id, message in batch:
                entry = self.tracker.get(request_id)
                if entry is None:
                    continue  # answered or given up meanwhile
                if entry.sent >= 0:
                    self.resent += 1
                self.tracker.mark_sent(request_id, generation)
                try:
                    await ws.send(self.codec.encode(message))
                except ConnectionClosed:
                    raise ConnectionLost("the connection dropped while re-sending") from None

    async def _reconnect_loop(self, cause: str) -> None:
        policy = self.reconnect
        assert policy is not None
        started = time.monotonic()
        attempt = 0
        while not self._closed:
            wait = policy.delay(attempt, self._rng)
            elapsed = time.monotonic() - started
            out_of_attempts = policy.max_attempts is not None and attempt >= policy.max_attempts
            if out_of_attempts or elapsed + wait > policy.give_up_after_s:
                self._fail_all(
                    ConnectionLost(
                        f"connection to {self.url} lost ({cause}) and not re-established "
                        f"after {attempt} attempt(s) in {elapsed:.1f} s",
                        details={"attempts": attempt, "elapsed_s": elapsed, "cause": cause},
                    )
                )
                return
            await asyncio.sleep(wait)
            attempt += 1
            try:
                await self._establish()
            except _RETRYABLE as exc:
                cause = exc.message
                log.info("reconnect attempt %d to %s failed: %s", attempt, self.url, exc)
                continue
            except CorralError as exc:  # refused for good: wrong token, contract, protocol
                self._fail_all(exc)
                return
            except Exception as exc:  # a waiter must never hang on a crashed reconnect
                log.exception("reconnecting to %s failed unexpectedly", self.url)
                self._fail_all(ConnectionLost(f"reconnecting failed: {exc!r}"))
                return
            self.reconnects += 1
            log.info("reconnected to %s after %d attempt(s)", self.url, attempt)
            return

    # -- the socket's tasks ----------------------------------------------------------

    async def _read(self, ws: ClientConnection, generation: int) -> None:
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
            message = self.codec.decode(frame)
            reply = self.tracker.match(message)
        except CorralError as exc:
            log.warning("dropping an unreadable frame from the server: %s", exc)
            return
        if reply is None:
            if message.get("type") == "error" and message.get("id") is None:
                log.warning("server reported: %s", message.get("message"))
            return
        self.sessions.observe(message)
        future = self._waiters.pop(reply.request_id, None)
        if future is not None and not future.done():
            future.set_result(message)

    async def _keep_alive(self, ws: ClientConnection, generation: int) -> None:
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
        """The socket of ``generation`` is gone: resume, or fail what waits."""
        if self._closed or generation != self._generation or self._lost_generation == generation:
            return
        self._lost_generation = generation
        was_open, self._open = self._open, False
        self._ws = None
        keepalive = self._keepalive
        if keepalive is not None and keepalive is not asyncio.current_task():
            keepalive.cancel()
        error = ConnectionLost(reason)
        for request_id in self.tracker.bound_to_socket():
            self.tracker.forget(request_id)
            future = self._waiters.pop(request_id, None)
            if future is not None and not future.done():
                future.set_exception(_copy(error, request_id))
        if not was_open:
            return  # a connect or reconnect attempt in progress sees the failure itself
        if self.reconnect is None:
            self._fail_all(error)
            return
        log.info("connection to %s lost (%s); reconnecting", self.url, reason)
        self._reconnector = asyncio.create_task(
            self._reconnect_loop(reason), name="corral-client-reconnect"
        )

    def _fail_all(self, error: CorralError) -> None:
        self._failed = error
        self._open = False
        waiters, self._waiters = self._waiters, {}
        for request_id, future in waiters.items():
            self.tracker.forget(request_id)
            if not future.done():
                future.set_exception(_copy(error, request_id))

    async def close(self) -> None:
        """Close the socket (idempotent); waiting requests fail with ``ClientClosed``."""
        if self._closed:
            return
        self._closed = True
        self._open = False
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
        self._fail_all(ClientClosed("the client was closed"))


def _copy(error: CorralError, request_id: int) -> CorralError:
    """``error`` as a fresh exception for ``request_id`` (one exception per waiter)."""
    copy = type(error)(error.message, details=dict(error.details), request_id=request_id)
    if type(copy).code != error.code:
        copy.code = error.code  # type: ignore[misc]  # an unknown code keeps its own name
    return copy


async def _wait(future: asyncio.Future[dict[str, Any]], timeout: float | None) -> dict[str, Any]:
    """Await a reply future for at most ``timeout`` seconds (``TimeoutError`` after).

    One timer handle instead of ``asyncio.wait_for``'s extra future and callbacks: this
    runs once per request.
    """
    if timeout is None:
        return await future
    timer = asyncio.get_running_loop().call_later(timeout, _expire, future)
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[dict[str, Any]]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _refusal(exc: InvalidStatus) -> CorralError:
    response = exc.response
    body = bytes(response.body or b"")
    with contextlib.suppress(Exception):
        import orjson

        payload = orjson.loads(body)
        if isinstance(payload, dict) and "code" in payload:
            error = error_from_wire(payload)
            retry = response.headers.get("Retry-After")
            if retry is not None:
                error.details["retry_after_s"] = float(retry)
            return error
    if response.status_code == 503:
        return CapacityReached("server refused the connection: at capacity (HTTP 503)")
    if response.status_code == 401:
        return Unauthorized("server refused the connection: a bearer token is required (HTTP 401)")
    return ConnectionLost(
        f"server refused the WebSocket handshake with HTTP {response.status_code}",
        details={"status": response.status_code, "body": body[:500].decode(errors="replace")},
    )

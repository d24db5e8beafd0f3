"""A connection to an OpenEnv server, with the interface the client uses from ``Connection``.

:class:`~corral.client.async_client.AsyncEnvClient` first offers corral's subprotocol;
a server that accepts the WebSocket without choosing it (an ``openenv-core`` server)
gets this connection instead, which speaks OpenEnv's envelope (see
:mod:`corral.protocol.openenv`). The client's typed API is unchanged.

Limits of the OpenEnv envelope, by its design:

* one session per connection, and no request ids: requests run strictly one at a
  time, and a request that times out leaves the connection unusable (its late reply
  could otherwise be taken for the next answer), so it is closed (``ConnectionLost``
  afterwards);
* no resume after a dropped connection, no batching, no multiplexing;
* no contract negotiation: nothing checks at connect time that the client's models
  match the server's; a mismatch shows up as ``BadObservation`` / ``InvalidAction``.

The socket comes from the same :class:`~corral.client.dialers.Dialer` as the corral
connection it replaces (offering no subprotocol), and ``GET /schema`` goes through its
HTTP face.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from typing import Any

import httpx

from corral import runtime
from corral.auth import bearer_header
from corral.client.connection import Connection, http_url, ws_url
from corral.client.dialers import Dialer, Socket, SocketClosed, dialer_for, keep_alive
from corral.errors import (
    CapacityReached,
    ClientClosed,
    ConnectionLost,
    CorralError,
    RequestTimeout,
    UnsupportedProtocol,
)
from corral.protocol import messages as m
from corral.protocol.codecs import Frame, JsonCodec
from corral.protocol.messages import ContractRef
from corral.protocol.openenv import (
    FATAL_CODES,
    PROTOCOL_NAME,
    client_frame,
    client_reply,
    openenv_code,
)

log = logging.getLogger("corral.client")

_SETTLE_STEP = 0.05


def is_openenv_refusal(exc: UnsupportedProtocol) -> bool:
    """True when ``exc`` says the server accepted the WebSocket without a subprotocol."""
    return "accepted" in exc.details and exc.details["accepted"] is None


class _Mailbox:
    """The frames of an OpenEnv socket, read one at a time (its envelope has no ids)."""

    def __init__(self) -> None:
        self._frames: deque[Frame] = deque()
        self._ended: str | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put(self, frame: Frame) -> None:
        self._frames.append(frame)
        self._wake()

    def end(self, why: str) -> None:
        self._ended = why
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self, timeout: float | None) -> Frame:
        """The next frame (one that came before the end too).

        Raises:
            TimeoutError: none within ``timeout``.
            SocketClosed: the socket ended, nothing left to read.
        """
        async with asyncio.timeout(timeout):
            while not self._frames:
                if self._ended is not None:
                    raise SocketClosed(self._ended)
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            return self._frames.popleft()


class OpenEnvConnection:
    """One OpenEnv session over one WebSocket (see the module docstring for its limits).

    Args:
        url: the server (``http://host:port`` or ``ws://host:port/ws``).
        connect_timeout: seconds to connect (and for the first exchange).
        ping_interval / ping_timeout: WebSocket keepalive.
        max_frame_bytes: largest frame accepted from the server.
        headers: extra HTTP headers for the handshake and for ``GET /schema``.
        settle_s: how long to keep retrying while the server reports
            ``CAPACITY_REACHED`` at connect; used right after a probe connection, whose
            slot the server frees only once it has seen that socket close.
        dialer: what opens the socket and reads ``/schema`` (default: ``auto``'s).
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 10.0,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        max_frame_bytes: int = 64 * 1024 * 1024,
        headers: dict[str, str] | None = None,
        settle_s: float = 0.0,
        dialer: Dialer | None = None,
    ) -> None:
        self.url = ws_url(url)
        self.http_url = http_url(url)
        self.codec = JsonCodec()
        self.connect_timeout = connect_timeout
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.max_frame_bytes = max_frame_bytes
        self.headers = headers or {}
        self.settle_s = settle_s
        self.dialer = dialer if dialer is not None else dialer_for("auto")
        self.welcome: dict[str, Any] = {}
        self.session = f"openenv-{uuid.uuid4().hex[:12]}"
        """A local name for the one session (OpenEnv never tells its id)."""
        self._ws: Socket | None = None
        self._inbox = _Mailbox()
        self._keepalive: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._ids = 0
        self._closed = False
        self._lost: CorralError | None = None

    @classmethod
    def replacing(cls, connection: Connection) -> OpenEnvConnection:
        """The OpenEnv connection to use instead of a refused corral ``connection``."""
        return cls(
            connection.url,
            connect_timeout=connection.connect_timeout,
            ping_interval=connection.ping_interval,
            ping_timeout=connection.ping_timeout,
            max_frame_bytes=connection.max_frame_bytes,
            # The bearer token travels too: a corral server behind auth refuses without it.
            headers={
                **connection.headers,
                **(bearer_header(connection.token) if connection.token is not None else {}),
            },
            settle_s=2.0,
            dialer=connection.dialer,
        )

    @property
    def connected(self) -> bool:
        """True while the socket is open and usable."""
        return self._ws is not None and self._lost is None and not self._closed

    async def connect(
        self, contract: ContractRef | None = None, *, want_schemas: bool = False
    ) -> dict[str, Any]:
        """Open the socket (the server creates the session) and return a ``welcome``.

        The first exchange is a ``state`` request, so that a full server's
        ``CAPACITY_REACHED`` (which OpenEnv sends after accepting) surfaces here. The
        ``contract`` cannot be checked over OpenEnv and is ignored; with
        ``want_schemas`` the models' schemas are read from ``GET /schema``.

        Raises:
            CapacityReached: the server is full.
            ConnectionLost: the server could not be reached.
        """
        if self._closed:
            raise ClientClosed("this connection was closed")
        deadline = time.monotonic() + self.settle_s
        delay = _SETTLE_STEP
        while True:
            try:
                await self._open_socket()
                break
            except CapacityReached:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.4)
        schemas = await self._schemas() if want_schemas else None
        # OpenEnv has no handshake: this stands for one (nothing was checked).
        welcome = m.Welcome(0, {"name": PROTOCOL_NAME}, {}, {}, "unchecked", schemas, PROTOCOL_NAME)
        self.welcome = welcome.to_wire()
        return self.welcome

    async def _open_socket(self) -> None:
        ws = await self.dialer.open(
            self.url, None, self.headers, self.connect_timeout, self.max_frame_bytes
        )
        inbox = self._inbox = _Mailbox()
        ws.listen(inbox.put, inbox.end)
        self._ws = ws
        self._lost = None
        if self.ping_interval is not None:
            self._keepalive = asyncio.get_running_loop().create_task(
                self._keep_alive(ws, self.ping_interval), name="corral-openenv-keepalive"
            )
        try:
            await self.request(m.GetState(self.next_id(), self.session), self.connect_timeout)
        except CorralError:
            self._ws = None
            await self._drop(ws)
            raise

    async def _keep_alive(self, ws: Socket, interval: float) -> None:
        reason = await keep_alive(ws, interval, self.ping_timeout)
        if reason is not None and ws is self._ws:
            log.warning("%s: %s", self.url, reason)
            self._lost = ConnectionLost(reason)
            ws.abort()

    async def _schemas(self) -> dict[str, Any]:
        try:
            async with self.dialer.http(headers=self.headers, timeout=self.connect_timeout) as http:
                response = await http.get(f"{self.http_url}/schema")
                response.raise_for_status()
                body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ConnectionLost(
                f"cannot read the schemas from {self.http_url}/schema: {exc}; pass the "
                "models to the client (env= or action_type=/observation_type=/state_type=)"
            ) from None
        return {key: body.get(key) or {} for key in ("action", "observation", "state")}

    def next_id(self) -> int:
        """The id for the next request (OpenEnv's wire has none: they stay local)."""
        self._ids += 1
        return self._ids

    async def request(self, message: m.Request, timeout: float | None) -> m.Reply:
        """Send one corral request in its OpenEnv form and return corral's reply.

        ``open`` is answered locally (the socket is the session); ``close`` has no
        reply on OpenEnv's wire.

        Raises:
            CorralError: the server's error, as its exception class.
            RequestTimeout: no reply in time (the connection is then closed).
            ConnectionLost: the connection failed or the server ended the session.
            UnsupportedProtocol: the request has no OpenEnv form (attach, batches).
        """
        kind = message.type
        request_id = message.id
        async with self._lock:
            if kind == "open":
                return m.Opened(request_id, self.session, "")
            frame = client_frame(message.to_wire())
            ws = self._socket()
            try:
                try:
                    ws.write(self.codec.encode(frame))
                except SocketClosed:
                    if kind == "close":
                        return m.Closed(request_id, self.session)
                    # The server may have closed right after an error frame (OpenEnv does
                    # after CAPACITY_REACHED): it is still read below, else the end is.
                if kind == "close":
                    return m.Closed(request_id, self.session)
                raw = await self._inbox.next(timeout)
            except TimeoutError:
                self._lost = ConnectionLost(
                    f"an earlier {kind!r} timed out; the OpenEnv connection has no request "
                    "ids, so it was closed to keep replies in order"
                )
                await self._drop(ws)
                raise RequestTimeout(
                    f"no reply to {kind!r} within {timeout:g} s (the connection was closed)",
                    details={"timeout_s": timeout},
                    request_id=request_id,
                ) from None
            except SocketClosed as exc:
                self._lost = self._lost or ConnectionLost(f"connection closed: {exc}")
                raise ConnectionLost(self._lost.message, request_id=request_id) from None
            try:
                reply = client_reply(kind, raw, request_id=request_id, session=self.session)
                return m.parse_reply(reply)
            except CorralError as exc:
                if openenv_code(str(exc.code)) in FATAL_CODES:
                    # OpenEnv closes the socket after these: the session is over.
                    self._lost = ConnectionLost(f"the server ended the session: {exc.message}")
                raise

    def _socket(self) -> Socket:
        if self._closed:
            raise ClientClosed("this connection was closed")
        if self._lost is not None or self._ws is None:
            raise self._lost or ConnectionLost("not connected")
        return self._ws

    async def _drop(self, ws: Socket) -> None:
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None and keepalive is not asyncio.current_task():
            keepalive.cancel()
        with contextlib.suppress(Exception):
            await runtime.wait_for(ws.close(), 2.0)
        ws.abort()

    async def close(self) -> None:
        """Close the socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._ws is not None:
            await self._drop(self._ws)
        self._lost = ClientClosed("the client was closed")

"""An in-process transport: real clients wired to a real server's service, no socket.

    async with InProcessServer(CounterEnv, max_sessions=4) as server:
        async with server.client() as env:           # an AsyncEnvClient, typed from the env
            await env.reset(seed=1)
            await env.step(CountAction(amount=2))

    with InProcessServer(CounterEnv) as server:       # from plain (non-async) code
        with server.sync_client() as env:             # a SyncEnvClient
            env.reset()

Everything but the socket is the real thing: the client is an
:class:`~corral.client.AsyncEnvClient` with its typed face, its
:class:`~corral.protocol.client.ClientProtocol` and its connection (timeouts, resume,
reconnects); the server is an :class:`~corral.server.service.EnvService` with its
:class:`~corral.protocol.server.ServerConnection`, session registry, runner and reply
cache, fed through :meth:`~corral.server.service.EnvService.receive`, the entry the
``/ws`` route uses. A socket is a pair of in-memory frame queues, so a test about an
environment or its contract runs in milliseconds and starts no thread or process.

The upgrade is decided as on a socket: :func:`~corral.protocol.upgrade.admit_upgrade`
(through the service's :class:`~corral.server.edge.Edge`: bearer token, subprotocol, the
per-address gate, room for sessions), and a refusal raises the error a socket's client
would (:func:`~corral.client.refusal.refusal`). What it does not exercise, by
construction: the WebSocket itself (framing, HTTP status lines, keepalive pings), the HTTP
routes, and process boundaries. Tests of those use a real server on 127.0.0.1.

A server lives on one event loop: the loop of the async code that uses it, or, for
:meth:`InProcessServer.sync_client` and ``with``, corral's background loop (where the
blocking twins run their async implementation).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from types import TracebackType
from typing import Any, Self

import orjson
from websockets.exceptions import ConnectionClosedError

from corral.blocking import run_blocking
from corral.client.connection import Socket
from corral.client.env_client import AsyncEnvClient, SyncEnvClient
from corral.client.refusal import refusal
from corral.protocol.access import Refusal, RequestHead
from corral.protocol.codecs import Codec, Frame
from corral.server.config import ServerConfig
from corral.server.edge import Edge
from corral.server.service import EnvService

URL = "http://in-process.invalid"
"""The nominal URL of an in-process server (never resolved)."""

ADDRESS = "in-process"
"""The client address in-process connections are counted under (the per-address gate)."""


class _Aborter:
    def __init__(self, socket: InProcessSocket) -> None:
        self._socket = socket

    def abort(self) -> None:
        self._socket.drop()


class InProcessSocket:
    """One client connection to an :class:`InProcessServer`: frames in memory both ways.

    It behaves as the WebSocket does for the client: :meth:`send` raises
    ``ConnectionClosed`` once closed, iteration ends on a clean close and raises on a
    drop; the server sees a clean disconnect or, after :meth:`drop`, an unclean one (its
    sessions then wait for a resume, as after a network cut).
    """

    def __init__(self, service: EnvService, codec: Codec, address: str = ADDRESS) -> None:
        self._service = service
        self._address = address
        self._frames: deque[Frame] = deque()
        self._arrived: asyncio.Future[None] | None = None
        self.closing: asyncio.Task[None] | None = None
        """The server-side disconnect after a drop, while it runs."""
        self.subprotocol: str | None = codec.subprotocol
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.transport = _Aborter(self)
        self.conn = service.connect(codec, self._deliver)

    @property
    def closed(self) -> bool:
        """The socket is closed (either side, cleanly or not)."""
        return self.close_code is not None

    def _deliver(self, frame: Frame) -> None:
        """The server writes a frame."""
        if self.closed:
            return
        self._frames.append(frame)
        self._wake()

    def _wake(self) -> None:
        arrived = self._arrived
        if arrived is not None and not arrived.done():
            arrived.set_result(None)

    async def send(self, message: Frame) -> None:
        """The client writes a frame; the server reads it at once."""
        if self.closed:
            raise ConnectionClosedError(None, None)
        self._service.receive(self.conn, message)

    async def ping(self) -> Awaitable[float]:
        """Answered at once: nothing in memory goes half-open."""
        pong: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        pong.set_result(0.0)
        return pong

    async def close(self) -> None:
        """A clean close: the server frees this connection's sessions."""
        if self.closed:
            return
        self.close_code, self.close_reason = 1000, ""
        self._wake()
        self._service.gate.leave(self._address)
        await self._service.disconnect(self.conn, True)

    def drop(self) -> None:
        """Cut the socket without a close: the client reconnects, the server keeps the
        sessions for the resume window."""
        if self.closed:
            return
        self.close_code, self.close_reason = 1006, "dropped"
        self._wake()
        self._service.gate.leave(self._address)
        self.closing = asyncio.get_running_loop().create_task(
            self._service.disconnect(self.conn, False)
        )

    async def _frames_until_closed(self) -> AsyncIterator[Frame]:
        while True:
            if self._frames:
                yield self._frames.popleft()
            elif self.close_code == 1000:
                return
            elif self.closed:
                raise ConnectionClosedError(None, None)
            else:
                self._arrived = asyncio.get_running_loop().create_future()
                try:
                    await self._arrived
                finally:
                    self._arrived = None

    def __aiter__(self) -> AsyncIterator[Frame]:
        return self._frames_until_closed()


class InProcessServer:
    """A corral server for ``env`` with no socket: clients dial it in memory.

    Args:
        env: what :func:`~corral.server.create_app` takes: the environment class or a
            factory.
        config: the server's settings; or give them as keyword arguments
            (``max_sessions=4``, ``step_timeout_s=1``, ...).
    """

    def __init__(self, env: Any, config: ServerConfig | None = None, **settings: Any) -> None:
        if config is not None and settings:
            raise TypeError("pass a ServerConfig or its settings as keywords, not both")
        self.service = EnvService(env, config or ServerConfig(**settings))
        self.edge = Edge(self.service)
        """Decides each dial as a socket's upgrade is decided."""
        self.url = URL
        self.sockets: list[InProcessSocket] = []
        """Every socket dialed so far (closed ones included)."""
        self._started = False

    async def dial(
        self, url: str, subprotocol: str, headers: dict[str, str], timeout: float, max_size: int
    ) -> Socket:
        """Open a socket to this server (the clients' dialer).

        Raises:
            CorralError: the refusal a socket's client gets for the same upgrade
                (``CapacityReached`` when full and resuming none of its sessions,
                ``Unauthorized``, ``TooManyConnections``, ``UnsupportedProtocol``, ...).
        """
        if not self._started:
            self._started = True
            self.service.manager.start()  # the reaper, as the app's start-up does
        pairs = [*headers.items(), ("Sec-WebSocket-Protocol", subprotocol)]
        head = RequestHead.of("GET", "/ws", pairs, client=ADDRESS, websocket=True)
        answer = self.edge.admit(head)
        if isinstance(answer, Refusal):
            retry = dict(answer.headers).get("Retry-After")
            raise refusal(answer.status, orjson.dumps(answer.wire()), retry)
        assert answer.codec is not None  # no fallback here: no codec is a refusal
        socket = InProcessSocket(self.service, answer.codec, answer.address)
        self.sockets.append(socket)
        return socket

    def client(self, **kwargs: Any) -> AsyncEnvClient[Any, Any, Any]:
        """An :class:`~corral.client.AsyncEnvClient` of this server.

        Its models are the environment's unless given (``env=None`` and no types: read
        from the server's schemas); ``kwargs`` are the client's (``timeout=``,
        ``reconnect=``, ``codec=``, ...). Keepalive pings are off by default.
        """
        kwargs.setdefault("env", self.service.env_type)
        kwargs.setdefault("ping_interval", None)
        return AsyncEnvClient(self.url, dialer=self.dial, **kwargs)

    def sync_client(self, **kwargs: Any) -> SyncEnvClient[Any, Any, Any]:
        """The blocking twin of :meth:`client` (it runs on corral's background loop)."""
        return self.client(**kwargs).sync()

    def drop_connections(self) -> int:
        """Cut every open socket as a network failure would; return how many."""
        live = [s for s in self.sockets if not s.closed]
        for socket in live:
            socket.drop()
        return len(live)

    async def aclose(self) -> None:
        """Stop the work still running and close every session."""
        for socket in self.sockets:
            closing = socket.closing
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing
        await self.service.shutdown()

    def close(self) -> None:
        """:meth:`aclose` from blocking code (the server ran on the background loop)."""
        run_blocking(self.aclose(), 30.0)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["URL", "InProcessServer", "InProcessSocket"]

"""In-process servers: real clients, pools and fleets wired to real services, no socket.

    async with InProcessServer(CounterEnv, max_sessions=4) as server:
        async with server.client() as env:           # an AsyncEnvClient, typed from the env
            await env.reset(seed=1)
            await env.step(CountAction(amount=2))
        async with server.pool(8) as pool:           # an EnvPool over the same server
            await pool.reset(seed=0)

    with InProcessServer(CounterEnv) as server:       # from plain (non-async) code
        with server.sync_client() as env:             # a SyncEnvClient
            env.reset()

    async with InProcessNetwork() as network:        # a fleet: several servers by URL
        a, b = network.serve(CounterEnv), network.serve(CounterEnv)
        async with EnvPool(8, [a.url, b.url], env=CounterEnv, dialer=network) as pool:
            await a.go_away()                        # server j goes away ...
            a.come_back()                            # ... and comes back
        # a fleet that starts, stops and replaces its servers itself:
        pool = EnvPool(8, network.launcher(CounterEnv), servers=2, dialer=network)
        # several servers behind one front door (routing by the corral-server header):
        door = network.door(a, b)
        pool = EnvPool(8, [door] * 2, env=CounterEnv, dialer=network)

Everything but the socket is the real thing. The clients are the same code as over the
network (:class:`~corral.client.AsyncEnvClient`, :class:`~corral.client.EnvPool` with its
fleet, their :class:`~corral.client.connection.Connection` and
:class:`~corral.protocol.client.ClientProtocol`: timeouts, resume, reconnects, health
checks, replacement); only the :class:`~corral.client.dialers.Dialer` differs:
:class:`InProcessNetwork` is one, reaching its servers by URL. A server is an
:class:`~corral.server.service.EnvService` with its
:class:`~corral.protocol.server.ServerConnection`, session registry, runner and reply
cache, fed through :meth:`~corral.server.service.EnvService.receive`, the entry the
``/ws`` route uses; its HTTP routes (``/health``, ``/schema``, ``/metadata``, the task
routes) are the app :func:`~corral.server.create_app` builds, reached through httpx's
ASGI transport (built on the first HTTP request: building the routes costs more than the
rest of a test). A socket is a pair of in-memory frame paths: a frame the client writes
is read by the server at once, the server's frames arrive in a later turn of the loop, as
a socket's would. A test about an environment, a pool or an adapter runs in milliseconds
and starts no thread or process.

The upgrade is decided as on a socket: :func:`~corral.protocol.upgrade.admit_upgrade`
(through the server's :class:`~corral.server.edge.Edge`: bearer token, Origin, subprotocol,
the per-address gate, room for sessions), and a refusal raises the error a socket's client
would (:func:`~corral.client.dialers.refusal.refusal`). What it does not exercise, by
construction: the WebSocket itself (framing, HTTP status lines, keepalive pings), the HTTP
server, worker processes, and process boundaries. Tests of those use a real server on
127.0.0.1.

A server lives on one event loop: the loop of the async code that uses it, or, for
:meth:`InProcessServer.sync_client` and ``with``, corral's background loop (where the
blocking twins run their async implementation).

Over 500 lines because the socket, the server, the network that routes to its servers
(the dialer) and the handle a fleet starts them with are one in-process stand-in for
the network and its hosts, used together.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlsplit

import httpx
import orjson

from corral.blocking import run_blocking
from corral.client.dialers import Dialer, Inbox, OnClosed, OnFrame, SocketClosed
from corral.client.dialers.refusal import refusal
from corral.client.env_client import AsyncEnvClient, SyncEnvClient
from corral.errors import ConnectionLost
from corral.protocol.access import Refusal, RequestHead
from corral.protocol.codecs import Codec, Frame
from corral.protocol.handshake import ROUTE_HEADER
from corral.server.app import create_app
from corral.server.config import ServerConfig
from corral.server.edge import Edge
from corral.server.service import EnvService

if TYPE_CHECKING:
    from fastapi import FastAPI

    from corral.client.pool import EnvPool

URL = "http://in-process.invalid"
"""The URL of an :class:`InProcessServer` of its own (never resolved)."""

ADDRESS = "in-process"
"""The client address in-process connections are counted under (the per-address gate)."""


class InProcessSocket:
    """One client connection to an :class:`InProcessServer`: frames in memory both ways.

    It behaves as a dialer's socket does for the client (the
    :class:`~corral.client.dialers.Socket` shape): a write once closed raises
    :class:`~corral.client.dialers.SocketClosed`, the end is reported once, in a later
    turn of the loop; the server sees a clean disconnect or, after :meth:`drop`, an
    unclean one (its sessions then wait for a resume, as after a network cut).
    """

    def __init__(self, service: EnvService, codec: Codec, address: str = ADDRESS) -> None:
        self._service = service
        self._address = address
        self._loop = asyncio.get_running_loop()
        self._inbox = Inbox()
        self.closing: asyncio.Task[None] | None = None
        """The server-side disconnect after a drop, while it runs."""
        self.subprotocol: str | None = codec.subprotocol
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.conn = service.connect(codec, self._deliver)

    @property
    def closed(self) -> bool:
        """The socket is closed (either side, cleanly or not)."""
        return self.close_code is not None

    def _deliver(self, frame: Frame) -> None:
        """The server writes a frame: the client reads it in a later turn of the loop."""
        if not self.closed:
            self._loop.call_soon(self._arrive, frame)

    def _arrive(self, frame: Frame) -> None:
        if not self.closed:  # a frame in flight when the socket went is lost with it
            self._inbox.deliver(frame)

    def listen(self, on_frame: OnFrame, on_closed: OnClosed) -> None:
        """Hand every frame to ``on_frame``; ``on_closed`` once at the end."""
        self._inbox.listen(on_frame, on_closed)

    def write(self, message: Frame) -> None:
        """The client writes a frame; the server reads it at once."""
        if self.closed:
            raise SocketClosed()
        self._service.receive(self.conn, message)

    async def send(self, message: Frame) -> None:
        """:meth:`write` (memory never pushes back)."""
        self.write(message)

    async def ping(self) -> Awaitable[float]:
        """Answered at once: nothing in memory goes half-open."""
        if self.closed:
            raise SocketClosed()
        pong: asyncio.Future[float] = self._loop.create_future()
        pong.set_result(self._loop.time())
        return pong

    async def close(self) -> None:
        """A clean close: the server frees this connection's sessions."""
        if self.closed:
            return
        self._end(1000, "", "closed by this side")
        await self._service.disconnect(self.conn, True)

    def abort(self) -> None:
        """Drop the connection from this side (as a client aborting its transport)."""
        self.drop("connection lost: aborted")

    def drop(self, why: str = "connection lost: the in-process socket was cut") -> None:
        """Cut the socket without a close: the client reconnects, the server keeps the
        sessions for the resume window."""
        if self.closed:
            return
        self._end(1006, "dropped", why)
        self.closing = self._loop.create_task(self._service.disconnect(self.conn, False))

    def _end(self, code: int, reason: str, why: str) -> None:
        self.close_code, self.close_reason = code, reason
        self._service.gate.leave(self._address)
        self._loop.call_soon(self._inbox.end, why)


class InProcessServer:
    """A corral server for ``env`` with no socket: clients dial it in memory.

    Args:
        env: what :func:`~corral.server.create_app` takes: the environment class or a
            factory.
        config: the server's settings; or give them as keyword arguments
            (``max_sessions=4``, ``step_timeout_s=1``, ...).
        network: the network it joins (:meth:`InProcessNetwork.serve` passes it;
            default: a network of its own, where it answers at :data:`URL`).
    """

    def __init__(
        self,
        env: Any,
        config: ServerConfig | None = None,
        *,
        network: InProcessNetwork | None = None,
        **settings: Any,
    ) -> None:
        if config is not None and settings:
            raise TypeError("pass a ServerConfig or its settings as keywords, not both")
        self.env = env
        self.config = config or ServerConfig(**settings)
        self.service = EnvService(env, self.config)
        self.edge = Edge(self.service)
        """Decides each dial as a socket's upgrade is decided."""
        if network is None:
            self.network = InProcessNetwork()
            self.url = self.network.join(self, URL)
        else:
            self.network = network
            self.url = network.join(self)
        self.sockets: list[InProcessSocket] = []
        """Every socket dialed so far (closed ones included)."""
        self.reachable = True
        """Dials and HTTP requests reach it (see :meth:`go_away`)."""
        self.alive = True
        """Its "process" runs (see :meth:`kill`)."""
        self._started = False
        self._app: FastAPI | None = None
        self._http: httpx.ASGITransport | None = None
        self._building: asyncio.Future[None] | None = None
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None
        self.closed = False
        """Closed (stopped, or killed): it left its network."""

    @property
    def manager(self) -> Any:
        """The service's session manager (its sessions, stats and reaper)."""
        return self.service.manager

    @property
    def dialer(self) -> InProcessNetwork:
        """What reaches this server: its network (a :class:`~corral.client.dialers.Dialer`)."""
        return self.network

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self.service.manager.start()  # the reaper, as the app's start-up does

    async def accept(self, subprotocol: str | None, headers: Mapping[str, str]) -> InProcessSocket:
        """Take a new connection, decided as the ``/ws`` route's upgrade is.

        Raises:
            CorralError: the refusal a socket's client gets for the same upgrade
                (``CapacityReached`` when full and resuming none of its sessions,
                ``Unauthorized``, ``TooManyConnections``, ``UnsupportedProtocol``, ...).
        """
        self._start()
        pairs = list(headers.items())
        if subprotocol:
            pairs.append(("Sec-WebSocket-Protocol", subprotocol))
        head = RequestHead.of("GET", "/ws", pairs, client=ADDRESS, websocket=True)
        answer = self.edge.admit(head)
        if isinstance(answer, Refusal):
            retry = dict(answer.headers).get("Retry-After")
            raise refusal(answer.status, orjson.dumps(answer.wire()), retry)
        assert answer.codec is not None  # no fallback here: no codec is a refusal
        socket = InProcessSocket(self.service, answer.codec, answer.address)
        self.sockets.append(socket)
        return socket

    async def http_transport(self) -> httpx.AsyncBaseTransport:
        """The server's HTTP routes (the app is built, and started, on first use)."""
        if self._http is None:
            if self._building is None:
                self._building = asyncio.ensure_future(self._build_app())
            await asyncio.shield(self._building)
            assert self._http is not None
        return self._http

    async def _build_app(self) -> None:
        self._start()
        # Built in a thread: the routes take a while to build (pydantic models for each),
        # and the loop keeps serving the sockets meanwhile.
        app = await asyncio.to_thread(create_app, self.env, self.config, service=self.service)
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        self._app, self._lifespan = app, lifespan
        self._http = httpx.ASGITransport(app=app)

    # -- clients ------------------------------------------------------------------------

    def client(self, **kwargs: Any) -> AsyncEnvClient[Any, Any, Any]:
        """An :class:`~corral.client.AsyncEnvClient` of this server.

        Its models are the environment's unless given (``env=None`` and no types: read
        from the server's schemas); ``kwargs`` are the client's (``timeout=``,
        ``reconnect=``, ``codec=``, ...). Keepalive pings are off by default.
        """
        kwargs.setdefault("env", self.service.env_type)
        kwargs.setdefault("ping_interval", None)
        return AsyncEnvClient(self.url, dialer=self.network, **kwargs)

    def sync_client(self, **kwargs: Any) -> SyncEnvClient[Any, Any, Any]:
        """The blocking twin of :meth:`client` (it runs on corral's background loop)."""
        return self.client(**kwargs).sync()

    def pool(self, n: int, **kwargs: Any) -> EnvPool[Any, Any, Any]:
        """An :class:`~corral.client.EnvPool` of ``n`` sessions on this server.

        Its models are the environment's unless given; ``kwargs`` are the pool's
        (``autoreset_mode=``, ``sessions_per_connection=``, ...). No progress bar by
        default. ``.sync()`` gives its blocking twin.
        """
        from corral.client.pool import EnvPool

        kwargs.setdefault("env", self.service.env_type)
        kwargs.setdefault("progress", False)
        return EnvPool(n, self.url, dialer=self.network, **kwargs)

    # -- what happens to a server -------------------------------------------------------

    def drop_connections(self) -> int:
        """Cut every open socket as a network failure would; return how many."""
        live = [s for s in self.sockets if not s.closed]
        for socket in live:
            socket.drop()
        return len(live)

    def go_away(self) -> int:
        """Become unreachable (a network partition, a stalled host): every socket is cut,
        new dials fail with ``ConnectionLost`` and HTTP requests with a connect error.
        The sessions wait for a resume, as over a real network; :meth:`come_back` ends
        it. Returns how many sockets were cut."""
        self.reachable = False
        return self.drop_connections()

    def come_back(self) -> None:
        """Be reachable again (after :meth:`go_away`), with the sessions it still holds."""
        if not self.alive:
            raise RuntimeError(f"{self.url} was killed; it cannot come back")
        self.reachable = True

    async def kill(self) -> None:
        """End the server for good, as a crashed process: unreachable, its handle no
        longer alive (see :meth:`InProcessNetwork.launcher`), its sessions gone."""
        self.alive = False
        self.go_away()
        await self.aclose()

    async def restart(self) -> None:
        """Restart in place (same URL, a new server instance): every session is gone, so
        clients re-attaching find none (``SessionLost``)."""
        # Refuse dials until the new instance is in place, as a real server's port is
        # closed while it restarts: a client re-dialing at once must not reach the old
        # instance's shutdown and hear "shutting down" instead of "restarted".
        self.reachable = False
        self.drop_connections()
        try:
            await self._shutdown()
            self.service = EnvService(self.env, self.config)
            self._started = False
            self._app = self._http = self._lifespan = self._building = None
        finally:
            self.reachable = self.alive

    # -- closing ------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        if self._building is not None:  # an app being built is started, then stopped
            with contextlib.suppress(Exception):
                await self._building
        for socket in self.sockets:
            closing = socket.closing
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing
        lifespan = self._lifespan
        if lifespan is not None:
            await lifespan.__aexit__(None, None, None)  # the app's shutdown: the service's
        else:
            await self.service.shutdown()

    async def aclose(self) -> None:
        """Stop the work still running and close every session (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.reachable = False
        await self._shutdown()
        self.network.leave(self)

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


class InProcessNetwork(Dialer):
    """In-process servers by URL, and the dialer that reaches them (sockets and HTTP).

    A server joins with :meth:`serve` (a URL of its own,
    ``http://server-N.in-process.invalid``); a URL no server answers (it went away, was
    killed or never was) fails to dial with ``ConnectionLost`` and its HTTP requests
    with a connect error, as a host that does not answer would.
    """

    name = "in-process"

    def __init__(self) -> None:
        self._servers: dict[str, InProcessServer] = {}
        self._numbers = itertools.count(1)
        self._doors: dict[str, list[InProcessServer]] = {}
        self._turns = itertools.count()

    def door(self, *servers: InProcessServer) -> str:
        """A front door's URL before ``servers``, as :mod:`corral.providers.frontdoor`
        renders one: a socket naming a server in the ``corral-server`` header goes to
        it (refused when it does not answer, as a proxy's 502), any other socket and
        every HTTP request to the next server that answers, in turn."""
        url = f"http://door-{next(self._numbers)}.in-process.invalid"
        self._doors[urlsplit(url).netloc] = list(servers)
        return url

    def _through(self, url: str, headers: Mapping[str, str]) -> InProcessServer | None:
        """The server a request to a door reaches (see :meth:`door`)."""
        behind = self._doors[urlsplit(url).netloc]
        wanted = headers.get(ROUTE_HEADER)
        if wanted is not None:
            named = [s for s in behind if s.service.server_id == wanted]
            if named:
                return named[0] if named[0].reachable else None
        answering = [s for s in behind if s.reachable]
        if not answering:
            return None
        return answering[next(self._turns) % len(answering)]

    def join(self, server: InProcessServer, url: str | None = None) -> str:
        """Give ``server`` a URL on this network (``url``, or the next free
        ``server-N``); called by the server itself.

        Raises:
            ValueError: ``url`` is taken.
        """
        if url is None:
            url = f"http://server-{next(self._numbers)}.in-process.invalid"
        netloc = urlsplit(url).netloc
        if netloc in self._servers:
            raise ValueError(f"{url} is taken on this in-process network")
        self._servers[netloc] = server
        return url

    def leave(self, server: InProcessServer) -> None:
        """``server`` closed: its URL answers no more."""
        netloc = urlsplit(server.url).netloc
        if self._servers.get(netloc) is server:
            del self._servers[netloc]

    @property
    def servers(self) -> list[InProcessServer]:
        """The servers on the network now, in the order they joined."""
        return list(self._servers.values())

    def serve(
        self, env: Any, config: ServerConfig | None = None, **settings: Any
    ) -> InProcessServer:
        """A new server for ``env`` on this network (settings as :class:`InProcessServer`)."""
        return InProcessServer(env, config, network=self, **settings)

    def launcher(
        self, env: Any, config: ServerConfig | None = None, **settings: Any
    ) -> Callable[[], InProcessHandle]:
        """A factory of :class:`InProcessHandle` objects, the ``target`` of an
        :class:`~corral.client.EnvPool` (with ``servers=`` and ``dialer=`` this network)
        that starts, stops and replaces its servers itself."""
        return lambda: InProcessHandle(self, env, config, settings)

    def _reach(self, url: str, headers: Mapping[str, str] | None = None) -> InProcessServer | None:
        if urlsplit(url).netloc in self._doors:
            return self._through(url, headers or {})
        server = self._servers.get(urlsplit(url).netloc)
        return server if server is not None and server.reachable else None

    async def open(
        self,
        url: str,
        subprotocol: str | None,
        headers: Mapping[str, str],
        timeout: float,
        max_size: int,
    ) -> InProcessSocket:
        """A socket to the server at ``url`` (see :meth:`Dialer.open`)."""
        server = self._reach(url, headers)
        if server is None:
            raise ConnectionLost(f"cannot connect to {url}: no in-process server answers there")
        return await server.accept(subprotocol, headers)

    def http_transport(self) -> httpx.AsyncBaseTransport:
        """Requests go to the server their URL names, through its app."""
        return _Routes(self)

    async def aclose(self) -> None:
        """Close every server still on the network."""
        for server in self.servers:
            await server.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Routes(httpx.AsyncBaseTransport):
    """An HTTP transport over an :class:`InProcessNetwork`: each request to its server's
    app, a connect error where no server answers."""

    def __init__(self, network: InProcessNetwork) -> None:
        self._network = network

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        server = self._network._reach(str(request.url))
        if server is None:
            raise httpx.ConnectError(
                f"no in-process server answers at {request.url.host}", request=request
            )
        transport = await server.http_transport()
        return await transport.handle_async_request(request)


class InProcessHandle:
    """A server of an :class:`InProcessNetwork` that a pool's fleet starts, stops and
    replaces (a :class:`~corral.client.fleet.ServerHandle`, as a local process is)."""

    def __init__(
        self,
        network: InProcessNetwork,
        env: Any,
        config: ServerConfig | None,
        settings: Mapping[str, Any],
    ) -> None:
        self.network = network
        self.env = env
        self.config = config
        self.settings = dict(settings)
        self.server: InProcessServer | None = None

    async def start(self) -> str:
        """Start the server; its URL."""
        self.server = self.network.serve(self.env, self.config, **self.settings)
        return self.server.url

    async def stop(self) -> None:
        """Stop the server (idempotent)."""
        if self.server is not None:
            await self.server.aclose()

    async def alive(self) -> bool:
        """False once the server was killed (or stopped)."""
        return self.server is not None and self.server.alive and not self.server.closed


__all__ = ["URL", "InProcessHandle", "InProcessNetwork", "InProcessServer", "InProcessSocket"]

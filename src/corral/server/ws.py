"""The ``/ws`` endpoint: the ASGI WebSocket face of the sans-I/O protocol.

The codec is picked by subprotocol (``corral.v1.msgpack`` or ``corral.v1.json``). A
full server refuses the connection at the handshake with HTTP 503 and ``Retry-After``,
never after accepting it, except for a client that comes back to re-attach sessions it
already holds (its ``corral-resume`` header names them; they hold their slots already).
A client address over ``max_connections_per_client`` is refused with HTTP 429. Both
decisions are the protocol's (the session registry and the connection gate).

Past the handshake this module only moves bytes: every frame that arrives goes to
:meth:`~corral.server.service.EnvService.receive`, and the frames the connection writes
are sent, in order, by one writer task (Starlette's ``send`` is a coroutine, and
concurrent sessions must never interleave a frame). Replies waiting to be written are
bounded: past 1 MiB the connection stops reading requests until the peer reads, and
past ``ServerConfig.max_outgoing_bytes`` it is closed with 1008.

This is the ASGI transport (``ServerConfig.transport="asgi"``, or when picows is
missing); :mod:`corral.server.native` is the default one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.errors import CorralError, UnsupportedProtocol
from corral.protocol.codecs import Codec, Frame, codec_for_subprotocols
from corral.protocol.handshake import RESUME_HEADER
from corral.protocol.messages import ErrorReply
from corral.server.service import EnvService

FallbackHandler = Callable[[WebSocket], Awaitable[None]]

_CLEAN_CLOSE = {1000, 1001}


async def refuse(websocket: WebSocket, error: CorralError, status: int, reason: str) -> None:
    """Refuse a WebSocket at the handshake with ``status`` and ``error`` as the body."""
    body = ErrorReply.of(error).to_wire()
    response = JSONResponse(body, status_code=status, headers={"Retry-After": "1"})
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:  # the server cannot send an HTTP response: close with "try again later"
        await websocket.close(code=1013, reason=reason)


async def refuse_capacity(websocket: WebSocket, service: EnvService) -> None:
    """Refuse a WebSocket at the handshake because the server is full."""
    await refuse(websocket, service.manager.capacity_error(), 503, "server at capacity")


async def serve_native(websocket: WebSocket, service: EnvService, codec: Codec) -> None:
    """Run one ``corral/1`` connection until it closes."""
    await websocket.accept(subprotocol=codec.subprotocol)
    outbox = Outbox(service.config.max_outgoing_bytes)
    client = websocket.client.host if websocket.client is not None else ""
    conn = service.connect(codec, outbox.put, client=client)
    send = websocket.send_bytes if codec.binary else websocket.send_text
    writer = asyncio.create_task(_write(send, outbox), name="corral-ws-writer")  # type: ignore[arg-type]
    clean = False
    try:
        while True:
            if outbox.size > outbox.high:
                # The peer does not read its replies: stop reading its requests until it
                # does (uvicorn then stops reading the socket: TCP back-pressure).
                await outbox.drained()
            if outbox.overflow:
                service.manager.stats.error("SLOW_CONSUMER")
                with contextlib.suppress(Exception):
                    reason = f"replies unread past {outbox.limit} bytes; read your replies"
                    await asyncio.wait_for(websocket.close(code=1008, reason=reason), 1.0)
                break
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                clean = message.get("code", 1000) in _CLEAN_CLOSE
                break
            frame = message.get("bytes")
            service.receive(conn, message.get("text", "") if frame is None else frame)
    except WebSocketDisconnect as exc:
        clean = exc.code in _CLEAN_CLOSE
    finally:
        await service.disconnect(conn, clean)
        outbox.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer, 1.0)
        writer.cancel()


class Outbox:
    """The frames of one connection waiting to be written, in order, bounded in bytes.

    A lighter stand-in for ``asyncio.Queue`` on the per-reply path: ``put`` appends and
    wakes the writer at most once; the writer takes everything queued at each wake-up.
    Past :attr:`high` queued bytes the reader waits (:meth:`drained`); past ``limit`` the
    box overflows: it drops what it holds and the connection is closed.
    """

    def __init__(self, limit: int) -> None:
        self._items: deque[Frame] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self.closed = False
        self.overflow = False
        self.limit = limit
        self.high = min(1024 * 1024, limit // 2)
        self.size = 0
        """Bytes queued or being written."""

    def put(self, frame: Frame) -> None:
        """Queue ``frame`` (ignored once closed)."""
        if self.closed:
            return
        self._items.append(frame)
        self.size += len(frame)
        if self.size > self.limit:
            self.overflow = True
            self._items.clear()
            self.close()
            return
        self._wake()

    def close(self) -> None:
        """Stop the writer once the queued frames are written."""
        self.closed = True
        self._wake()
        self._drained_now()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def written(self, frame: Frame) -> None:
        """``frame`` is written: the reader may go on once a quarter of ``high`` is left."""
        self.size -= len(frame)
        if self.size <= self.high // 4:
            self._drained_now()

    def _drained_now(self) -> None:
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drained(self) -> None:
        """Wait until the queued bytes fall to a quarter of ``high`` (or the box closes)."""
        if self.closed or self.size <= self.high // 4:
            return
        self._drain = asyncio.get_running_loop().create_future()
        try:
            await self._drain
        finally:
            self._drain = None

    async def take(self) -> list[Frame]:
        """Everything queued, waiting for at least one frame; empty once closed."""
        while not self._items and not self.closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items = list(self._items)
        self._items.clear()
        return items


async def _write(send: Callable[[Frame], Awaitable[None]], outbox: Outbox) -> None:
    while True:
        frames = await outbox.take()
        if not frames or outbox.overflow:
            return
        for frame in frames:
            try:
                await send(frame)
            except Exception:
                return  # the connection is gone; the reader loop sees the disconnect
            outbox.written(frame)


async def ws_endpoint(
    websocket: WebSocket, service: EnvService, fallback: FallbackHandler | None
) -> None:
    """Route a WebSocket to the native protocol or, without a corral subprotocol, the fallback."""
    address = websocket.client.host if websocket.client is not None else ""
    refusal = service.gate.enter(address)
    if refusal is not None:
        service.manager.stats.error(str(refusal.code))
        await refuse(websocket, refusal, 429, "too many connections")
        return
    try:
        await _serve(websocket, service, fallback)
    finally:
        service.gate.leave(address)


async def _serve(
    websocket: WebSocket, service: EnvService, fallback: FallbackHandler | None
) -> None:
    codec = codec_for_subprotocols(list(websocket.scope.get("subprotocols", [])))
    if codec is None and fallback is not None:
        # The fallback speaks another protocol and reports a full server in its own way
        # (OpenEnv: an error frame after accepting, then close 1000).
        await fallback(websocket)
    elif not service.manager.registry.accepts(websocket.headers.get(RESUME_HEADER)):
        await refuse_capacity(websocket, service)
    elif codec is not None:
        await serve_native(websocket, service, codec)
    else:
        error = UnsupportedProtocol("ask for subprotocol corral.v1.msgpack or corral.v1.json")
        await websocket.send_denial_response(
            JSONResponse(ErrorReply.of(error).to_wire(), status_code=400)
        )

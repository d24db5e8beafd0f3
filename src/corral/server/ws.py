"""The ``/ws`` endpoint: WebSocket I/O around the sans-I/O protocol and the service.

The codec is picked by subprotocol (``corral.v1.msgpack`` or ``corral.v1.json``). A
full server refuses the connection at the handshake with HTTP 503 and ``Retry-After``,
never after accepting it, except for a client that comes back to re-attach sessions it
already holds (its ``corral-resume`` header names them; they hold their slots already).
A client address over ``max_connections_per_client`` is refused with HTTP 429. One
reader loop parses frames; session requests run as tasks; one writer task sends replies
in order, so concurrent sessions never interleave a frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.errors import CorralError, TooManyConnections, UnsupportedProtocol
from corral.protocol.codecs import Codec, codec_for_subprotocols
from corral.protocol.handshake import MAX_RESUME_IDS, RESUME_HEADER
from corral.protocol.messages import ErrorReply
from corral.protocol.server import FrameReader
from corral.server.service import Channel, EnvService

log = logging.getLogger("corral.server")

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


def resumes_live_session(websocket: WebSocket, service: EnvService) -> bool:
    """True when the handshake names a session of this server that is still live."""
    header = websocket.headers.get(RESUME_HEADER)
    if not header:
        return False
    ids = header.split(",", MAX_RESUME_IDS)[:MAX_RESUME_IDS]
    return any(sid.strip() in service.manager.sessions for sid in ids)


async def serve_native(websocket: WebSocket, service: EnvService, codec: Codec) -> None:
    """Run one ``corral/1`` connection until it closes."""
    await websocket.accept(subprotocol=codec.subprotocol)
    outbox = Outbox()
    channel = Channel(codec=codec, sender=outbox.put)
    writer = asyncio.create_task(_write(websocket, codec, outbox), name="corral-ws-writer")
    reader = FrameReader(codec, service.config.max_frame_bytes)
    clean = False
    service.manager.stats.connections += 1
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                clean = message.get("code", 1000) in _CLEAN_CLOSE
                break
            frame = message.get("bytes")
            if frame is None:
                frame = message.get("text", "")
            try:
                request = reader.read(frame)
            except CorralError as exc:
                service.send_error(channel, exc, reader.session_hint)
                continue
            try:
                await service.handle(channel, request)
            except Exception as exc:  # a bug must not take the connection down
                service.internal_error(channel, exc, request.id)
    except WebSocketDisconnect as exc:
        clean = exc.code in _CLEAN_CLOSE
    finally:
        service.manager.stats.connections -= 1
        await service.disconnect(channel, clean)
        outbox.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer, 1.0)
        writer.cancel()


class Outbox:
    """The replies of one connection waiting to be written, in order.

    A lighter stand-in for ``asyncio.Queue`` on the per-reply path: ``put`` appends and
    wakes the writer at most once; the writer takes everything queued at each wake-up.
    """

    def __init__(self) -> None:
        self._items: deque[dict[str, Any]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    def put(self, message: dict[str, Any]) -> None:
        """Queue ``message`` (ignored once closed)."""
        if self.closed:
            return
        self._items.append(message)
        self._wake()

    def close(self) -> None:
        """Stop the writer once the queued messages are written."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[dict[str, Any]]:
        """Everything queued, waiting for at least one message; empty once closed."""
        while not self._items and not self.closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items = list(self._items)
        self._items.clear()
        return items


async def _write(websocket: WebSocket, codec: Codec, outbox: Outbox) -> None:
    send = websocket.send_bytes if codec.binary else websocket.send_text
    while True:
        messages = await outbox.take()
        if not messages:
            return
        for message in messages:
            try:
                frame = codec.encode(message)
            except Exception:
                log.exception("could not encode a reply of type %s", message.get("type"))
                continue
            try:
                await send(frame)  # type: ignore[arg-type]
            except Exception:
                return  # the connection is gone; the reader loop sees the disconnect


async def ws_endpoint(
    websocket: WebSocket, service: EnvService, fallback: FallbackHandler | None
) -> None:
    """Route a WebSocket to the native protocol or, without a corral subprotocol, the fallback."""
    offered = list(websocket.scope.get("subprotocols", []))
    codec = codec_for_subprotocols(offered)
    address = websocket.client.host if websocket.client is not None else ""
    limit = service.config.max_connections_per_client
    held = service.connections.get(address, 0)
    if limit is not None and held >= limit:
        error = TooManyConnections(
            f"client {address} already holds {held} connections to this server",
            details={"limit": limit, "address": address},
        )
        service.manager.stats.error(str(error.code))
        await refuse(websocket, error, 429, "too many connections")
        return
    service.connections[address] = held + 1
    try:
        await _serve(websocket, service, codec, fallback)
    finally:
        left = service.connections[address] - 1
        if left:
            service.connections[address] = left
        else:
            del service.connections[address]


async def _serve(
    websocket: WebSocket, service: EnvService, codec: Codec | None, fallback: FallbackHandler | None
) -> None:
    if codec is None and fallback is not None:
        # The fallback speaks another protocol and reports a full server in its own way
        # (OpenEnv: an error frame after accepting, then close 1000).
        await fallback(websocket)
    elif not service.manager.has_capacity() and not resumes_live_session(websocket, service):
        await refuse_capacity(websocket, service)
    elif codec is not None:
        await serve_native(websocket, service, codec)
    else:
        error = UnsupportedProtocol("ask for subprotocol corral.v1.msgpack or corral.v1.json")
        response = JSONResponse(ErrorReply.of(error).to_wire(), status_code=400)
        await websocket.send_denial_response(response)

"""The ``/ws`` endpoint: WebSocket I/O around the sans-I/O protocol and the service.

The codec is picked by subprotocol (``corral.v1.msgpack`` or ``corral.v1.json``). A
full server refuses the connection at the handshake with HTTP 503 and ``Retry-After``,
never after accepting it. One reader loop parses frames; session requests run as tasks;
one writer task sends replies in order, so concurrent sessions never interleave a frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.errors import CorralError
from corral.protocol.codecs import Codec, codec_for_subprotocols
from corral.protocol.server import FrameReader
from corral.server.service import Channel, EnvService

log = logging.getLogger("corral.server")

FallbackHandler = Callable[[WebSocket], Awaitable[None]]

_CLEAN_CLOSE = {1000, 1001}


async def refuse_capacity(websocket: WebSocket, service: EnvService) -> None:
    """Refuse a WebSocket at the handshake because the server is full."""
    error = service.manager.capacity_error()
    body = {"type": "error", "id": None, **error.to_wire()}
    response = JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:  # the server cannot send an HTTP response: close with "try again later"
        await websocket.close(code=1013, reason="server at capacity")


async def serve_native(websocket: WebSocket, service: EnvService, codec: Codec) -> None:
    """Run one ``corral/1`` connection until it closes."""
    await websocket.accept(subprotocol=codec.subprotocol)
    outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    channel = Channel(codec=codec, sender=outbox.put_nowait)
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
                service.internal_error(channel, exc)
    except WebSocketDisconnect as exc:
        clean = exc.code in _CLEAN_CLOSE
    finally:
        service.manager.stats.connections -= 1
        await service.disconnect(channel, clean)
        outbox.put_nowait(None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer, 1.0)
        writer.cancel()


async def _write(
    websocket: WebSocket, codec: Codec, outbox: asyncio.Queue[dict[str, Any] | None]
) -> None:
    send = websocket.send_bytes if codec.binary else websocket.send_text
    while True:
        message = await outbox.get()
        if message is None:
            return
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
    if codec is None and fallback is not None:
        # The fallback speaks another protocol and reports a full server in its own way
        # (OpenEnv: an error frame after accepting, then close 1000).
        await fallback(websocket)
        return
    if not service.manager.has_capacity():
        await refuse_capacity(websocket, service)
        return
    if codec is not None:
        await serve_native(websocket, service, codec)
    else:
        response = JSONResponse(
            {
                "type": "error",
                "code": "UNSUPPORTED_PROTOCOL",
                "message": "ask for subprotocol corral.v1.msgpack or corral.v1.json",
            },
            status_code=400,
        )
        await websocket.send_denial_response(response)

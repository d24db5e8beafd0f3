"""The ``/ws`` endpoint: the ASGI WebSocket face of the sans-I/O protocol.

The upgrade is decided by :func:`~corral.protocol.upgrade.admit_upgrade` (through the
server's :class:`~corral.server.edge.Edge`), as on the native transport: Host, Origin and
credentials, the codec by subprotocol (``corral.v1.msgpack`` or ``corral.v1.json``; none
goes to the fallback, OpenEnv's envelope), the per-address gate (429) and room for
sessions (503 and ``Retry-After``, except for a client whose ``corral-resume`` header
names a live session). This route only renders the answer.

Past the handshake this module only moves bytes: every frame that arrives goes to
:meth:`~corral.server.service.EnvService.receive`, and the frames the connection writes
are sent, in order, by one writer task (Starlette's ``send`` is a coroutine, and
concurrent sessions must never interleave a frame). Replies waiting to be written follow
the server's :class:`~corral.protocol.outflow.Outflow`: past its high mark the
connection stops reading requests until the peer reads, and past
``ServerConfig.max_outgoing_bytes`` it is closed with 1008. Incoming frames are
reassembled and timed below ASGI, in :mod:`corral.server.uvicorn_ws`.

This is the ASGI transport (``ServerConfig.transport="asgi"``, or when picows is
missing); :mod:`corral.server.native` is the default one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from corral import runtime
from corral.protocol.access import Refusal
from corral.protocol.codecs import Codec, Frame
from corral.protocol.outflow import Outflow, clean_close
from corral.server.auth import refuse, request_head
from corral.server.edge import Edge

FallbackHandler = Callable[[WebSocket], Awaitable[None]]


async def serve_native(websocket: WebSocket, edge: Edge, codec: Codec) -> None:
    """Run one ``corral/1`` connection until it closes."""
    service = edge.service
    await websocket.accept(subprotocol=codec.subprotocol)
    outbox = Outbox(edge.outflow)
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
                closing = edge.outflow.overflow()
                edge.closing(closing, websocket.client.host if websocket.client else "")
                with contextlib.suppress(Exception):
                    await runtime.wait_for(
                        websocket.close(code=closing.code, reason=closing.reason), 1.0
                    )
                break
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                clean = clean_close(message.get("code", 1000))
                break
            frame = message.get("bytes")
            service.receive(conn, message.get("text", "") if frame is None else frame)
    except WebSocketDisconnect as exc:
        clean = clean_close(exc.code)
    finally:
        await service.disconnect(conn, clean)
        outbox.close()
        with contextlib.suppress(Exception):
            await runtime.wait_for(writer, 1.0)
        writer.cancel()


class Outbox:
    """The frames of one connection waiting to be written, in order, bounded in bytes.

    A lighter stand-in for ``asyncio.Queue`` on the per-reply path: ``put`` appends and
    wakes the writer at most once; the writer takes everything queued at each wake-up.
    Past :attr:`high` queued bytes the reader waits (:meth:`drained`); past ``limit`` the
    box overflows: it drops what it holds and the connection is closed (the marks are the
    server's :class:`~corral.protocol.outflow.Outflow`).
    """

    def __init__(self, outflow: Outflow) -> None:
        self._items: deque[Frame] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self.closed = False
        self.overflow = False
        self.outflow = outflow
        self.high = outflow.high
        self.size = 0
        """Bytes queued or being written."""

    def put(self, frame: Frame) -> None:
        """Queue ``frame`` (ignored once closed)."""
        if self.closed:
            return
        self._items.append(frame)
        self.size += len(frame)
        if self.outflow.overflowed(self.size):
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
        """``frame`` is written: the reader may go on once the low mark is reached."""
        self.size -= len(frame)
        if self.size <= self.outflow.low:
            self._drained_now()

    def _drained_now(self) -> None:
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drained(self) -> None:
        """Wait until the queued bytes fall to the low mark (or the box closes)."""
        if self.closed or self.size <= self.outflow.low:
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


async def ws_endpoint(websocket: WebSocket, edge: Edge, fallback: FallbackHandler | None) -> None:
    """Render :meth:`Edge.admit`'s answer: refuse, serve ``corral/1``, or hand the socket
    to the fallback (a client that offered no corral subprotocol)."""
    answer = edge.admit(request_head(websocket.scope), fallback=fallback is not None)
    if isinstance(answer, Refusal):
        await refuse(websocket, answer)
        return
    try:
        if answer.codec is not None:
            await serve_native(websocket, edge, answer.codec)
        elif fallback is not None:
            # The fallback speaks another protocol and reports a full server in its own
            # way (OpenEnv: an error frame after accepting, then close 1000).
            await fallback(websocket)
    finally:
        edge.service.gate.leave(answer.address)

"""The socket side of the ASGI transport: uvicorn's WebSocket protocol with corral's inflow.

uvicorn (``websockets-sansio``) parses frames with websockets' sans-I/O parser and, left
alone, gathers a fragmented message's parts without limit of time or total. This
subclass keeps everything of uvicorn's but what happens to data frames: they go to the
connection's :class:`~corral.protocol.inflow.Reassembler` — the same one the native
transport uses, counted in the same server-wide budget of unfinished messages
(:class:`~corral.server.edge.Edge`) — and the connection joins the server's deadline
sweep, which pings a quiet peer and closes one whose frame or message is late
(:class:`~corral.protocol.inflow.Inflow`). Every WebSocket uvicorn serves for a corral
app — ``corral/1`` on the ASGI transport, OpenEnv's ``/ws`` envelope, the ``/mcp``
socket — gets these bounds. websockets already bounds each message at uvicorn's
``ws_max_size`` and inflates permessage-deflate frames before they reach these
handlers.

:func:`protocol_factory` is what :func:`corral.server.serve.install_front` gives uvicorn
as its WebSocket protocol class.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame
from websockets.protocol import State

from corral.protocol.inflow import (
    BINARY,
    CONTINUATION,
    PROBE,
    PROBE_PAYLOAD,
    TEXT,
    Assembled,
    Refused,
)
from corral.protocol.outflow import CloseCode, Closing
from corral.server.edge import Edge


class EdgeWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with corral's incoming-message rules.

    Args:
        edge: the server's edge (the reassembly bound, the budget, the sweep).
        (the rest): uvicorn's.
    """

    def __init__(self, *args: Any, edge: Edge, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.edge = edge
        self.frames_in = 0
        """Frames completed so far (data frames and pongs)."""
        self.inflow = edge.inflow(self.loop.time())

    def connection_made(self, transport: Any) -> None:
        """Join the deadline sweep."""
        super().connection_made(transport)
        self.edge.sweep.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        """Leave the sweep and give back what an unfinished message held."""
        self.edge.sweep.discard(self)
        self.inflow.close()
        super().connection_lost(exc)

    # -- frames in -----------------------------------------------------------------

    def handle_text(self, event: Frame) -> None:
        """A text frame: to the reassembler."""
        self._data(TEXT, event)

    def handle_bytes(self, event: Frame) -> None:
        """A binary frame: to the reassembler."""
        self._data(BINARY, event)

    def handle_cont(self, event: Frame) -> None:
        """A continuation frame: to the reassembler."""
        self._data(CONTINUATION, event)

    def handle_pong(self, event: Frame) -> None:
        """A pong completes a frame too (the answer to a deadline probe)."""
        self.frames_in += 1
        super().handle_pong(event)

    def _data(self, opcode: int, event: Frame) -> None:
        self.frames_in += 1
        try:
            message = self.inflow.assembler.feed(
                opcode, event.fin, bytes(event.data), False, self.loop.time()
            )
        except Refused as exc:
            self._close(exc.closing)
            return
        if message is not None:
            self._deliver(message)

    def _deliver(self, message: Assembled) -> None:
        """Hand a whole message to the app, pausing reads until it takes it (as uvicorn)."""
        if self.close_sent:
            return  # past a close the app sent: reads stay on until the peer's close
        if message.text:
            try:
                text = message.data.decode()
            except UnicodeDecodeError:
                self._close(Closing(CloseCode.INVALID_DATA, "text message is not valid UTF-8"))
                return
            self.queue.put_nowait({"type": "websocket.receive", "text": text})
        else:
            self.queue.put_nowait({"type": "websocket.receive", "bytes": message.data})
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    # -- the sweep -----------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Render what the inflow decides at ``now`` (only while the socket is open)."""
        if self.conn.state is not State.OPEN or self.close_sent:
            return
        verdict = self.inflow.check(now, self.frames_in, self.read_paused)
        if verdict is PROBE:
            self.conn.send_ping(PROBE_PAYLOAD)
            self.transport.write(b"".join(self.conn.data_to_send()))
        elif isinstance(verdict, Closing):
            self._close(verdict)

    def _close(self, closing: Closing) -> None:
        """Fail the connection with ``closing``'s code; uvicorn tells the app it is gone."""
        if self.close_sent or self.transport.is_closing():
            return
        client = self.client[0] if self.client else ""
        if closing.counted is not None:
            self.edge.closing(closing, client)
        self.inflow.close()
        self.conn.fail(closing.code, closing.reason_bytes().decode())
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.transport.close()


def protocol_factory(edge: Edge) -> Callable[..., EdgeWebSocketProtocol]:
    """The WebSocket protocol class uvicorn builds for each upgraded connection."""
    return functools.partial(EdgeWebSocketProtocol, edge=edge)


__all__ = ["EdgeWebSocketProtocol", "protocol_factory"]

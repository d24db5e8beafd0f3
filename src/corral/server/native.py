"""The native ``corral/1`` transport: WebSocket connections on picows, outside ASGI.

picows is a callback-style WebSocket library: a frame arrives as a call, and a reply is
written with a plain method call on the transport. No reader loop, no writer task, no
ASGI message dicts: a frame goes straight to :meth:`EnvService.receive`, and what the
connection emits is written from the same call when it is answered at once (a welcome,
an error, a replay) or from the task that ran the environment.

This module only moves bytes and renders decisions made in :mod:`corral.protocol`,
through the server's :class:`~corral.server.edge.Edge`:

* the upgrade (:class:`NativeDoor`): :func:`~corral.protocol.upgrade.admit_upgrade`
  decides (Host, Origin, credentials, subprotocol, the per-address gate, room for
  sessions, permessage-deflate); the door answers 101 with a link, or the refusal's
  status, headers and structured body;
* frames in (:class:`NativeLink`): a whole uncompressed message goes straight to the
  service (the per-frame cost is a frame count); fragments go to the connection's
  :class:`~corral.protocol.inflow.Reassembler` (bounded per message, and server-wide by
  the budget of unfinished messages) and compressed messages are inflated within the
  same bound (:mod:`corral.protocol.deflate`);
* deadlines: the server's one :class:`~corral.server.edge.Sweep` asks each link's
  :class:`~corral.protocol.inflow.Inflow` what to do — ping a quiet peer, close one whose
  frame or message is late — and the link does it;
* keepalive: picows pings an idle peer and drops it when the pong is late;
* back-pressure (:class:`~corral.protocol.outflow.Outflow`): the socket's write buffer
  limits are the policy's high and low marks; past the high one the link stops reading
  from that peer (TCP pushes back on it) and resumes once drained; past
  ``max_outgoing_bytes`` the connection is closed with 1008.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
from typing import Any

import orjson
from picows import (
    WSAutoPingStrategy,
    WSCloseCode,
    WSFrame,
    WSListener,
    WSMsgType,
    WSTransport,
    WSUpgradeRequest,
    WSUpgradeResponse,
    WSUpgradeResponseWithListener,
)
from picows.picows import WSProtocol  # type: ignore[attr-defined]

from corral.protocol.access import Refusal, RequestHead
from corral.protocol.deflate import Deflater, InflateTooLarge
from corral.protocol.inflow import PROBE, PROBE_PAYLOAD, Inflow, Refused
from corral.protocol.outflow import SHUTDOWN, CloseCode, Closing, clean_close
from corral.protocol.upgrade import Accept
from corral.server.edge import Edge
from corral.server.service import Connection

log = logging.getLogger("corral.server")

_ABORT_AFTER_S = 1.0
"""Grace a closing peer gets to read the close frame before the socket is aborted."""

_FIN, _RSV1, _TEXT, _BINARY = 0x80, 0x40, 0x1, 0x2
_LENGTH16 = struct.Struct("!BBH")
_LENGTH64 = struct.Struct("!BBQ")


def _head(first: int, size: int) -> bytes:
    """A server frame's header (RFC 6455 5.2: final, unmasked) before ``size`` bytes;
    ``first``: the opcode, with RSV1 for a compressed message."""
    if size < 126:
        return bytes((_FIN | first, size))
    if size < 65536:
        return _LENGTH16.pack(_FIN | first, 126, size)
    return _LENGTH64.pack(_FIN | first, 127, size)


class NativeLink(WSListener):
    """One native ``corral/1`` connection: picows frames in, protocol frames out."""

    def __init__(self, door: NativeDoor, accept: Accept, deflater: Deflater | None):
        super().__init__()
        assert accept.codec is not None  # the front door sends only corral upgrades here
        self.door = door
        self.edge = door.edge
        self.service = door.service
        self.codec = accept.codec
        self.address = accept.address
        self.deflater = deflater
        self.ws: WSTransport | None = None
        self.conn: Connection | None = None
        self.frames_in = 0
        """Frames completed so far, of any kind (the deadlines' only per-frame input)."""
        now = asyncio.get_running_loop().time()  # picows decides upgrades on the loop
        self.inflow: Inflow = self.edge.inflow(now, compression=deflater is not None)
        self._assembler = self.inflow.assembler
        self._opcode = _BINARY if self.codec.binary else _TEXT
        self._queued: list[bytes] = []
        """Frames (headers and payloads) written this turn of the loop, not yet sent."""
        self._closing_sent = False
        self._loop = asyncio.get_running_loop()
        self._raw: asyncio.Transport | None = None
        self._paused = False
        self._closing = False

    # -- picows callbacks ----------------------------------------------------------

    def on_ws_connected(self, transport: WSTransport) -> None:
        """The 101 answer is sent: open the protocol connection."""
        self.ws = transport
        raw = transport.underlying_transport
        self._raw = raw
        outflow = self.edge.outflow
        raw.set_write_buffer_limits(high=outflow.high, low=outflow.low)
        self.conn = self.service.connect(self.codec, self.write, client=self.address)
        self.door.links.add(self)
        self.edge.sweep.add(self)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        """One frame in: whole uncompressed messages go straight to the service."""
        self.frames_in += 1
        if frame.fin and not frame.rsv1 and not self._assembler.pending:
            kind = frame.msg_type
            if kind is WSMsgType.BINARY:
                self.service.receive(self.conn, frame.get_payload_as_bytes())  # type: ignore[arg-type]
                return
            if kind is WSMsgType.TEXT:
                self._receive_text(frame.get_payload_as_bytes())
                return
        self._frame(frame)

    def is_user_specific_pong(self, frame: WSFrame) -> bool:
        """picows's keepalive consumes the pong it waits for: count it as a frame too."""
        self.frames_in += 1
        return frame.msg_type is WSMsgType.PONG

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        """The socket is gone: free the gate's count, the budget and the sessions."""
        self.door.links.discard(self)
        self.edge.sweep.discard(self)
        self.service.gate.leave(self.address)
        self.inflow.close()
        conn = self.conn
        if conn is None:
            return
        # Clean only when the client closed first with 1000/1001: a close the server began
        # (a keepalive timeout, back-pressure, a deadline, shutdown) keeps the sessions.
        handshake = transport.close_handshake
        clean = (
            handshake is not None
            and handshake.recv is not None
            and handshake.recv_then_sent
            and clean_close(_code(handshake.recv.code))
        )
        self.door.spawn(self.service.disconnect(conn, clean))

    def pause_writing(self) -> None:
        """The write buffer is past its high-water mark: stop reading from the peer."""
        if self._raw is not None and not self._paused and not self._raw.is_closing():
            self._paused = True
            self._raw.pause_reading()

    def resume_writing(self) -> None:
        """The write buffer drained: read from the peer again."""
        if self._raw is not None and self._paused and not self._raw.is_closing():
            self._paused = False
            self._raw.resume_reading()

    # -- the sweep -----------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Render what the inflow decides at ``now``: a ping, a close, or nothing."""
        verdict = self.inflow.check(now, self.frames_in, self._paused)
        if verdict is None or self._closing:
            return
        if verdict is PROBE:
            if self.ws is not None:
                self.ws.send_ping(PROBE_PAYLOAD)
            return
        assert isinstance(verdict, Closing)
        self.close(verdict)

    # -- frames out ----------------------------------------------------------------

    def write(self, frame: bytes | str) -> None:
        """Send one frame the connection emits (never raises).

        Frames are framed here and go out together once per turn of the loop: one write
        (one system call) for all the replies a turn produced, where a write per reply
        cost a system call each, and the peer a wake-up each (issue 34: 10,000 replies a
        second, most of a turn's are many). Order is kept, and anything picows itself
        sends (a close, a ping) waits for what is queued (:meth:`_flush`).
        """
        if self.ws is None or self._closing:
            return
        try:
            data = frame.encode() if isinstance(frame, str) else frame
            first = self._opcode
            if self.deflater is not None:
                packed = self.deflater.deflate(data)
                if packed is not None:
                    data, first = packed, first | _RSV1
            queued = self._queued
            queued.append(_head(first, len(data)))
            queued.append(data)
            if len(queued) == 2:
                self._loop.call_soon(self._flush)
        except Exception:  # the socket is gone; on_ws_disconnected follows
            log.debug("write on a closed native link", exc_info=True)

    def _flush(self) -> None:
        """Write the frames queued this turn, in one write."""
        queued, self._queued = self._queued, []
        raw = self._raw
        if not queued or raw is None or self._closing_sent or raw.is_closing():
            return
        try:
            raw.writelines(queued)
            outflow = self.edge.outflow
            if outflow.overflowed(raw.get_write_buffer_size()):
                self.close(outflow.overflow())
        except Exception:  # the socket is gone; on_ws_disconnected follows
            log.debug("write on a closed native link", exc_info=True)

    def shutdown(self) -> None:
        """The server stops: close with 1012 (service restart) so the client resumes."""
        self.close(SHUTDOWN)

    def close(self, closing: Closing) -> None:
        """Send ``closing``'s close frame and drop the socket soon after, read or not."""
        ws = self.ws
        if ws is None or self._closing:
            return
        self._closing = True
        if closing.counted is not None:
            self.edge.closing(closing, self.address)
        self._flush()  # the replies already given go before the close frame
        self._closing_sent = True
        ws.send_close(WSCloseCode(closing.code), closing.reason_bytes())
        raw = self._raw
        if raw is not None:
            if not raw.is_closing():
                raw.pause_reading()
            asyncio.get_running_loop().call_later(_ABORT_AFTER_S, raw.abort)

    # -- the rare paths ------------------------------------------------------------

    def _receive_text(self, data: bytes) -> None:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            self.close(Closing(CloseCode.INVALID_DATA, "text frame is not valid UTF-8"))
            return
        self.service.receive(self.conn, text)  # type: ignore[arg-type]

    def _frame(self, frame: WSFrame) -> None:
        kind = frame.msg_type
        if kind is WSMsgType.CLOSE:
            ws = self.ws
            if ws is not None:
                self._flush()
                self._closing_sent = True
                ws.send_close(frame.get_close_code(), frame.get_close_message())
                ws.disconnect()
            return
        if kind is WSMsgType.PING or kind is WSMsgType.PONG:
            return  # picows answers pings; a pong has been counted as a frame
        try:
            message = self._assembler.feed(
                kind.value,
                bool(frame.fin),
                frame.get_payload_as_bytes(),
                bool(frame.rsv1),
                asyncio.get_running_loop().time(),
            )
        except Refused as exc:
            self.close(exc.closing)
            return
        if message is None:
            return
        data = message.data
        if message.compressed:
            assert self.deflater is not None  # the reassembler refuses RSV1 without it
            try:
                data = self.deflater.inflate(data)
            except InflateTooLarge as exc:
                self.close(Closing(CloseCode.MESSAGE_TOO_BIG, str(exc), "FRAME_TOO_LARGE"))
                return
        if message.text:
            self._receive_text(data)
        else:
            self.service.receive(self.conn, data)  # type: ignore[arg-type]


class NativeDoor:
    """Renders native upgrade decisions and owns the native links of one server.

    Args:
        edge: the server's edge (its service, limits and shared state).
        connections: uvicorn's open connections; each link joins it while open, so a
            server shutdown closes it (1012) and waits for it like any other.
    """

    def __init__(self, edge: Edge, connections: set[Any] | None = None) -> None:
        self.edge = edge
        self.service = edge.service
        config = self.service.config
        self.max_message = edge.max_message
        self.links: set[Any] = connections if connections is not None else set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._logger = logging.getLogger("corral.server.native")
        interval, timeout = config.ping_interval_s, config.ping_timeout_s
        self._ping = interval is not None and timeout is not None
        # picows waits for a pong at most as long as it waits idle before a ping: a pong
        # deadline longer than the interval stretches the interval to it (the deadline is
        # what a slow but live peer needs honoured; the interval only how soon a dead one
        # is noticed).
        self._ping_timeout = timeout or 20.0
        self._ping_interval = max(interval or 20.0, self._ping_timeout)

    def adopt(self, transport: asyncio.Transport, head: bytes, address: str) -> None:
        """Take over ``transport`` (of peer ``address``) whose first bytes are ``head``."""
        local = transport.get_extra_info("sockname")
        protocol = WSProtocol(
            None,
            None,
            False,
            functools.partial(self.upgrade, address=address, local=local[0] if local else None),
            self._logger,
            True,  # a bug in a frame callback closes that connection, not the server
            None,  # the front door kept the handshake deadline
            self._ping,
            self._ping_interval,
            self._ping_timeout,
            WSAutoPingStrategy.PING_WHEN_IDLE,
            True,
            self.max_message,
            None,
            16 * 1024,
        )
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        view = memoryview(head)
        while view:
            buffer = protocol.get_buffer(len(view))
            n = min(len(buffer), len(view))
            buffer[:n] = view[:n]
            protocol.buffer_updated(n)
            view = view[n:]

    def upgrade(
        self, request: WSUpgradeRequest, address: str, local: str | None = None
    ) -> WSUpgradeResponseWithListener:
        """picows's listener factory: render :meth:`Edge.admit`'s answer."""
        path = request.path.decode("latin-1").split("?", 1)[0]
        head = RequestHead.of(
            "GET", path, request.headers.items(), client=address, local=local, websocket=True
        )
        answer = self.edge.admit(head)
        if isinstance(answer, Refusal):
            return _refusal(answer)
        deflater = None
        if answer.deflate is not None:
            deflater = Deflater(answer.deflate, self.max_message)
        link = NativeLink(self, answer, deflater)
        response = WSUpgradeResponse.create_101_response(answer.headers())
        return WSUpgradeResponseWithListener(response, link)

    def spawn(self, work: Any) -> None:
        """Run ``work`` (a coroutine) as a task held until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drained(self) -> None:
        """Wait for the disconnect work of closed links."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _code(code: Any) -> int:
    """A close code as a number (picows gives an enum member, or an int outside it)."""
    return int(getattr(code, "value", code))


def _refusal(refusal: Refusal) -> WSUpgradeResponseWithListener:
    body = orjson.dumps(refusal.wire())
    headers = {**dict(refusal.headers), "Content-Type": "application/json"}
    response = WSUpgradeResponse.create_error_response(refusal.status, body, headers)
    return WSUpgradeResponseWithListener(response, None)


__all__ = ["NativeDoor", "NativeLink"]

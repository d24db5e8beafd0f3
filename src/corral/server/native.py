"""The native ``corral/1`` transport: WebSocket connections on picows, outside ASGI.

picows is a callback-style WebSocket library: a frame arrives as a call, and a reply is
written with a plain method call on the transport. No reader loop, no writer task, no
ASGI message dicts: a frame goes straight to :meth:`EnvService.receive`, and what the
connection emits is written from the same call when it is answered at once (a welcome,
an error, a replay) or from the task that ran the environment.

This module only moves bytes and applies the transport's limits; every protocol decision
stays in :mod:`corral.protocol`. What it does by itself:

* the upgrade decision (:class:`NativeDoor`): the bearer token (or the web UI's
  cookie, :func:`~corral.server.auth.authorised`), the per-client
  connection gate (HTTP 429), the capacity check with the resume header (HTTP 503 and
  ``Retry-After``), the subprotocol (the codec) and permessage-deflate — the same
  answers as the ASGI ``/ws`` route, decided by the same registry and gate;
* frames (:class:`NativeLink`): reassembly of fragmented messages and inflation of
  compressed ones, both bounded before the bytes are held (a message longer than
  ``2 * max_frame_bytes + 64 KiB`` closes the connection with 1009; one between the
  limit and that bound is answered ``FRAME_TOO_LARGE`` by the protocol, with its id);
* keepalive: picows pings an idle peer and drops it when the pong is late;
* back-pressure: when the socket's write buffer passes its high-water mark the link
  stops reading from that peer (TCP pushes back on it) and resumes once drained; past
  ``max_outgoing_bytes`` the connection is closed with 1008, so a client that sends and
  never reads cannot grow the server's memory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
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

from corral.errors import CorralError, Unauthorized
from corral.protocol.codecs import Codec, Frame, codec_for_subprotocols
from corral.protocol.handshake import RESUME_HEADER
from corral.protocol.messages import ErrorReply
from corral.server.auth import authorised
from corral.server.config import ServerConfig
from corral.server.deflate import Deflater, InflateTooLarge, negotiate
from corral.server.service import Connection, EnvService

log = logging.getLogger("corral.server")

_CLEAN_CLOSE = {1000, 1001}
_HIGH_WATER = 1024 * 1024
"""Write-buffer bytes past which a link stops reading from its peer (at most half of
``max_outgoing_bytes``); it reads again below a quarter of that."""
_ABORT_AFTER_S = 1.0
"""Grace a closing peer gets to read the close frame before the socket is aborted."""


def hard_frame_limit(config: ServerConfig) -> int:
    """The longest message a link holds: past it the connection closes with 1009.

    Twice the protocol's limit (plus room for the envelope), so that a frame over the
    limit is still read whole and answered ``FRAME_TOO_LARGE`` with its request id.
    """
    return config.max_frame_bytes * 2 + 65536


def subprotocols(request: WSUpgradeRequest) -> list[str]:
    """The subprotocols a client offers, in its order of preference."""
    offered: list[str] = []
    for value in request.headers.getall("Sec-WebSocket-Protocol", ()):
        offered.extend(part.strip() for part in value.split(",") if part.strip())
    return offered


class NativeLink(WSListener):
    """One native ``corral/1`` connection: picows frames in, protocol frames out."""

    def __init__(self, door: NativeDoor, codec: Codec, address: str, deflater: Deflater | None):
        super().__init__()
        self.door = door
        self.service = door.service
        self.codec = codec
        self.address = address
        self.deflater = deflater
        self.ws: WSTransport | None = None
        self.conn: Connection | None = None
        self._kind = WSMsgType.BINARY if codec.binary else WSMsgType.TEXT
        self._raw: asyncio.Transport | None = None
        self._parts: list[bytes] | None = None
        """Payloads of a fragmented message being reassembled."""
        self._parts_size = 0
        self._parts_kind = WSMsgType.BINARY
        self._parts_compressed = False
        self._paused = False
        self._closing = False

    # -- picows callbacks ----------------------------------------------------------

    def on_ws_connected(self, transport: WSTransport) -> None:
        """The 101 answer is sent: open the protocol connection."""
        self.ws = transport
        raw = transport.underlying_transport
        self._raw = raw
        high = min(_HIGH_WATER, self.door.max_outgoing // 2)
        raw.set_write_buffer_limits(high=high, low=high // 4)
        self.conn = self.service.connect(self.codec, self.write)
        self.door.links.add(self)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        """One frame in: whole uncompressed messages go straight to the service."""
        if frame.fin and not frame.rsv1 and self._parts is None:
            kind = frame.msg_type
            if kind is WSMsgType.BINARY:
                self.service.receive(self.conn, frame.get_payload_as_bytes())  # type: ignore[arg-type]
                return
            if kind is WSMsgType.TEXT:
                self._receive_text(frame.get_payload_as_bytes())
                return
        self._frame(frame)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        """The socket is gone: free the gate's count and the connection's sessions."""
        self.door.links.discard(self)
        self.door.service.gate.leave(self.address)
        self._parts = None
        conn = self.conn
        if conn is None:
            return
        # Clean only when the client closed first with 1000/1001: a close the server began
        # (a keepalive timeout, back-pressure, shutdown) keeps the sessions for resume.
        handshake = transport.close_handshake
        clean = (
            handshake is not None
            and handshake.recv is not None
            and handshake.recv_then_sent
            and _code(handshake.recv.code) in _CLEAN_CLOSE
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

    # -- frames out ----------------------------------------------------------------

    def write(self, frame: Frame) -> None:
        """Send one frame the connection emits (never raises)."""
        ws = self.ws
        if ws is None or self._closing:
            return
        try:
            if self.deflater is not None:
                data = frame.encode() if isinstance(frame, str) else frame
                packed = self.deflater.deflate(data)
                if packed is not None:
                    ws.send(self._kind, packed, rsv1=True)
                else:
                    ws.send(self._kind, frame)
            else:
                ws.send(self._kind, frame)
            raw = self._raw
            if raw is not None and raw.get_write_buffer_size() > self.door.max_outgoing:
                self._overflow(raw.get_write_buffer_size())
        except Exception:  # the socket is gone; on_ws_disconnected follows
            log.debug("write on a closed native link", exc_info=True)

    def shutdown(self) -> None:
        """The server stops: close with 1012 (service restart) so the client resumes."""
        self.close(WSCloseCode.SERVICE_RESTART, "server shutting down")

    def close(self, code: WSCloseCode, reason: str) -> None:
        """Send a close frame and drop the socket soon after, read or not."""
        ws = self.ws
        if ws is None or self._closing:
            return
        self._closing = True
        ws.send_close(code, reason.encode())
        raw = self._raw
        if raw is not None:
            if not raw.is_closing():
                raw.pause_reading()
            asyncio.get_running_loop().call_later(_ABORT_AFTER_S, raw.abort)

    # -- the rare paths ------------------------------------------------------------

    def _overflow(self, size: int) -> None:
        log.warning(
            "closing the connection of %s: %d bytes of replies unread (limit %d)",
            self.address,
            size,
            self.door.max_outgoing,
        )
        self.service.manager.stats.error("SLOW_CONSUMER")
        self.close(
            WSCloseCode.POLICY_VIOLATION,
            f"replies unread past {self.door.max_outgoing} bytes; read your replies",
        )

    def _receive_text(self, data: bytes) -> None:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            self.close(WSCloseCode.INVALID_TEXT, "text frame is not valid UTF-8")
            return
        self.service.receive(self.conn, text)  # type: ignore[arg-type]

    def _frame(self, frame: WSFrame) -> None:
        kind = frame.msg_type
        if kind is WSMsgType.CLOSE:
            ws = self.ws
            if ws is not None:
                ws.send_close(frame.get_close_code(), frame.get_close_message())
                ws.disconnect()
            return
        if kind is WSMsgType.PING or kind is WSMsgType.PONG:
            return  # picows answers pings; a pong that no ping asked for is ignored
        if kind is WSMsgType.CONTINUATION:
            if self._parts is None:
                self.close(WSCloseCode.PROTOCOL_ERROR, "continuation frame without a message")
                return
        else:
            if self._parts is not None:
                self.close(WSCloseCode.PROTOCOL_ERROR, "new message before the last one ended")
                return
            if frame.rsv1 and self.deflater is None:
                self.close(WSCloseCode.PROTOCOL_ERROR, "compressed frame without deflate")
                return
            self._parts = []
            self._parts_size = 0
            self._parts_kind = kind
            self._parts_compressed = frame.rsv1
        self._parts_size += frame.payload_size
        if self._parts_size > self.door.max_message:
            self._parts = None
            self._too_big()
            return
        self._parts.append(frame.get_payload_as_bytes())
        if not frame.fin:
            return
        data = b"".join(self._parts)
        self._parts = None
        if self._parts_compressed:
            assert self.deflater is not None
            try:
                data = self.deflater.inflate(data)
            except InflateTooLarge as exc:
                self._too_big(str(exc))
                return
        if self._parts_kind is WSMsgType.TEXT:
            self._receive_text(data)
        else:
            self.service.receive(self.conn, data)  # type: ignore[arg-type]

    def _too_big(self, why: str = "") -> None:
        self.service.manager.stats.error("FRAME_TOO_LARGE")
        reason = why or f"message longer than {self.door.max_message} bytes"
        self.close(WSCloseCode.MESSAGE_TOO_BIG, reason[:120])


class NativeDoor:
    """Decides native upgrades and owns the native links of one server.

    Args:
        service: the environment service.
        config: the server's limits (frame size, keepalive, deflate, back-pressure).
        connections: uvicorn's open connections; each link joins it while open, so a
            server shutdown closes it (1012) and waits for it like any other.
    """

    def __init__(
        self, service: EnvService, config: ServerConfig, connections: set[Any] | None = None
    ) -> None:
        self.service = service
        self.config = config
        self.token = config.token
        self.max_message = hard_frame_limit(config)
        self.max_outgoing = config.max_outgoing_bytes
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
        protocol = WSProtocol(
            None,
            None,
            False,
            functools.partial(self.upgrade, address=address),
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

    def upgrade(self, request: WSUpgradeRequest, address: str) -> WSUpgradeResponseWithListener:
        """picows's listener factory: accept with a link, or refuse with an HTTP status."""
        headers = request.headers
        service = self.service
        if self.token is not None:
            raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
            if not authorised(raw, self.token, cookies=self.config.web):
                given = headers.get("Authorization") is not None
                error: CorralError = Unauthorized(
                    "wrong bearer token" if given else "this server requires a bearer token",
                    details={"fix": "send 'Authorization: Bearer <token>'"},
                )
                return _refusal(401, error, {"WWW-Authenticate": 'Bearer realm="corral"'})
        codec = codec_for_subprotocols(subprotocols(request))
        assert codec is not None  # the front door only sends corral subprotocols here
        refusal = service.gate.enter(address)
        if refusal is not None:
            service.manager.stats.error(str(refusal.code))
            return _refusal(429, refusal, {"Retry-After": "1"})
        if not service.manager.registry.accepts(headers.get(RESUME_HEADER)):
            service.gate.leave(address)
            error = service.manager.capacity_error()
            service.manager.stats.error(str(error.code))
            return _refusal(503, error, {"Retry-After": "1"})
        extra = {"Sec-WebSocket-Protocol": codec.subprotocol}
        deflater = None
        if self.config.deflate:
            params = negotiate(headers.getall("Sec-WebSocket-Extensions", []))
            if params is not None:
                deflater = Deflater(params, self.max_message)
                extra["Sec-WebSocket-Extensions"] = params.response()
        link = NativeLink(self, codec, address, deflater)
        return WSUpgradeResponseWithListener(WSUpgradeResponse.create_101_response(extra), link)

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


def _refusal(
    status: int, error: CorralError, headers: dict[str, str]
) -> WSUpgradeResponseWithListener:
    body = orjson.dumps(ErrorReply.of(error).to_wire())
    response = WSUpgradeResponse.create_error_response(
        status, body, {**headers, "Content-Type": "application/json"}
    )
    return WSUpgradeResponseWithListener(response, None)

"""The native client transport: a WebSocket on ``picows``, frames dispatched by callback.

``picows`` (a Cython WebSocket library) calls a listener for every frame as it is
parsed, straight from the event loop's read callback. :class:`PicowsSocket` passes each
message to the :class:`~corral.client.connection.Connection` that listens to it, which
feeds it to its :class:`~corral.protocol.client.ClientProtocol` and resolves the waiting
future, in the same callback: no reader task, no queue, no extra loop turn per reply.
It gives what the other dialers give: the subprotocol offered and checked, the
extra (resume, auth) headers, the handshake refusal mapped to corral's errors (HTTP
503/429/401 with their structured bodies), a frame limit, pings for the connection's
keepalive, fragmented messages reassembled within the limit (by the protocol's one
:class:`~corral.protocol.inflow.Reassembler`, the servers' too), and a close handshake.

:class:`PicowsDialer` is its :class:`~corral.client.dialers.base.Dialer`; ``auto`` picks it
when ``picows`` is importable and the loop stays on one thread (see
:func:`~corral.client.dialers.dialer_for`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Mapping
from typing import Any

from picows import (
    WSCloseCode,
    WSError,
    WSFrame,
    WSListener,
    WSMsgType,
    WSTransport,
    ws_connect,
)

from corral import __version__, runtime
from corral.blocking import moves_between_threads
from corral.client.dialers.base import Dialer, Inbox, OnClosed, OnFrame, SocketClosed
from corral.client.dialers.refusal import refusal
from corral.errors import ConnectionLost, UnsupportedProtocol
from corral.protocol.codecs import Frame
from corral.protocol.inflow import Reassembler, Refused
from corral.protocol.outflow import CloseCode, Closing


class PicowsSocket(WSListener):
    """One client WebSocket on picows (see module docstring).

    Frames that arrive before :meth:`listen` are kept and handed over by it.

    Args:
        max_size: the largest message accepted; a larger one closes the socket (1009).
    """

    def __init__(self, max_size: int) -> None:
        super().__init__()
        self.ws: WSTransport | None = None
        self.max_size = max_size
        self.subprotocol: str | None = None
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self._inbox = Inbox()
        self._pongs: deque[asyncio.Future[float]] = deque()
        self._assembler = Reassembler(max_size)
        self._gone = False
        self._refused = False
        self._why = "connection lost"

    # -- the Socket face ----------------------------------------------------------

    def listen(self, on_frame: OnFrame, on_closed: OnClosed) -> None:
        """Hand every message to ``on_frame`` from now on; ``on_closed`` once at the end."""
        self._inbox.listen(on_frame, on_closed)

    async def send(self, message: Frame) -> None:
        """Write one message; raises ``ConnectionClosed`` once the socket is closed."""
        self.write(message)

    def write(self, message: Frame) -> None:
        """Write one message now (no await: the loop's transport buffers it)."""
        ws = self.ws
        if ws is None or self._gone or ws.is_close_frame_sent:
            raise SocketClosed()
        if isinstance(message, str):
            ws.send(WSMsgType.TEXT, message.encode())
        else:
            ws.send(WSMsgType.BINARY, message)

    async def ping(self) -> Awaitable[float]:
        """Send a ping; the result resolves when its pong arrives."""
        pong: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        ws = self.ws
        if ws is None or self._gone:
            raise SocketClosed()
        self._pongs.append(pong)
        ws.send_ping()
        return pong

    async def close(self) -> None:
        """Close with a closing handshake (bounded by the caller)."""
        ws = self.ws
        if ws is None:
            return
        if not self._gone:
            with contextlib.suppress(Exception):
                ws.send_close(WSCloseCode.OK)
            ws.disconnect()
        await ws.wait_disconnected()

    def abort(self) -> None:
        """Drop the connection at once, without a closing handshake."""
        ws = self.ws
        if ws is not None:
            ws.disconnect(graceful=False)

    # -- picows callbacks -----------------------------------------------------------

    def on_ws_connected(self, transport: WSTransport) -> None:
        self.ws = transport

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        kind = frame.msg_type
        if frame.payload_size > self.max_size or self._refused:
            # picows refuses such a frame but may still hand it over while it closes
            self._refuse(transport)
        elif kind is WSMsgType.BINARY and frame.fin and not self._assembler.pending:
            self._inbox.deliver(frame.get_payload_as_bytes())
        elif kind is WSMsgType.TEXT and frame.fin and not self._assembler.pending:
            self._inbox.deliver(frame.get_payload_as_utf8_text())
        elif kind is WSMsgType.PONG:
            if self._pongs:
                pong = self._pongs.popleft()
                if not pong.done():
                    pong.set_result(asyncio.get_running_loop().time())
        elif kind is WSMsgType.CLOSE:
            self.close_code = frame.get_close_code().value
            self.close_reason = frame.get_close_reason() or ""
            transport.send_close(frame.get_close_code())
            transport.disconnect()
        elif kind in (WSMsgType.BINARY, WSMsgType.TEXT, WSMsgType.CONTINUATION):
            self._fragment(transport, frame)

    def _fragment(self, transport: WSTransport, frame: WSFrame) -> None:
        """A part of a fragmented message (or a new message inside one): the protocol's
        reassembler decides."""
        try:
            message = self._assembler.feed(
                frame.msg_type.value, bool(frame.fin), frame.get_payload_as_bytes()
            )
        except Refused as exc:
            self._refuse(transport, exc.closing)
            return
        if message is not None:
            self._inbox.deliver(message.data.decode() if message.text else message.data)

    def _refuse(self, transport: WSTransport, closing: Closing | None = None) -> None:
        """A message over the limit (or, given ``closing``, one breaking the fragmentation
        rules): nothing more is delivered, the socket closes with its code."""
        self._assembler.abandon()
        if self._refused:
            return
        self._refused = True
        if closing is None or closing.code == CloseCode.MESSAGE_TOO_BIG:
            self._why = f"a message from the server exceeded {self.max_size} bytes"
            code, reason = WSCloseCode.MESSAGE_TOO_BIG, b"message too big"
        else:
            self._why = f"the server broke the WebSocket protocol: {closing.reason}"
            code, reason = WSCloseCode(closing.code), closing.reason_bytes()
        with contextlib.suppress(Exception):
            transport.send_close(code, reason)
        transport.disconnect()

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        if self._gone:
            return
        self._gone = True
        if self.close_code is not None:
            self._why = f"closed by the server (code {self.close_code} {self.close_reason})".strip()
        else:
            handshake = transport.close_handshake
            sent = handshake.sent if handshake is not None else None
            if sent is not None and sent.code is WSCloseCode.MESSAGE_TOO_BIG:
                self._why = f"a message from the server exceeded {self.max_size} bytes"
            self.close_code = sent.code.value if sent is not None else 1006
        # picows keeps the protocol error that closed the socket for wait_disconnected();
        # collect it so it is not reported as "never retrieved" (the reason is ours).
        done = asyncio.ensure_future(transport.wait_disconnected())
        done.add_done_callback(_swallow)
        for pong in self._pongs:
            if not pong.done():
                pong.set_exception(SocketClosed())
        self._pongs.clear()
        self._inbox.end(self._why)


def _swallow(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


class PicowsDialer(Dialer):
    """Opens :class:`PicowsSocket` WebSockets: the native transport, for a loop that stays
    on one thread (picows checks that its sockets are used from the thread that opened
    them)."""

    name = "picows"

    async def open(
        self,
        url: str,
        subprotocol: str | None,
        headers: Mapping[str, str],
        timeout: float,
        max_size: int,
    ) -> PicowsSocket:
        """A picows WebSocket to ``url`` (see :meth:`Dialer.open`).

        Raises:
            ValueError: the running loop moves between threads (a blocking twin's).
        """
        if moves_between_threads(asyncio.get_running_loop()):
            raise ValueError(
                "transport='picows' cannot serve a blocking twin (.sync()): its loop moves "
                "between threads and picows sockets stay on one; use 'auto' or 'asyncio'"
            )
        extra = {"User-Agent": f"corral/{__version__}", **headers}
        if subprotocol is not None:
            extra["Sec-WebSocket-Protocol"] = subprotocol
        try:
            async with asyncio.timeout(timeout):
                ws, socket = await ws_connect(
                    lambda: PicowsSocket(max_size),
                    url,
                    websocket_handshake_timeout=timeout,
                    max_frame_size=max_size,
                    extra_headers=extra,
                    enable_auto_ping=False,
                )
        except WSError as exc:
            response: Any = getattr(exc, "response", None)
            if response is not None and int(response.status) >= 400:
                raise refusal(
                    int(response.status),
                    bytes(response.body or getattr(exc, "raw_body", None) or b""),
                    response.headers.get("Retry-After"),
                ) from None
            raise ConnectionLost(f"cannot connect to {url}: {exc}") from None
        except (OSError, TimeoutError) as exc:
            raise ConnectionLost(f"cannot connect to {url}: {exc or 'timed out'}") from None
        if ws is None or not isinstance(socket, PicowsSocket):  # closed before the upgrade
            raise ConnectionLost(f"cannot connect to {url}: closed during the handshake")
        accepted = ws.response.headers.get("Sec-WebSocket-Protocol") or None
        socket.subprotocol = accepted
        if accepted != subprotocol:
            with contextlib.suppress(Exception):
                await runtime.wait_for(socket.close(), 2.0)
            raise UnsupportedProtocol(
                f"{url} did not accept subprotocol {subprotocol}",
                details={"accepted": accepted},
            )
        return socket


picows_dialer = PicowsDialer()
"""The native dialer (``transport="picows"``)."""


__all__ = ["PicowsDialer", "PicowsSocket", "picows_dialer"]

"""A client WebSocket on asyncio's Protocol API: frames by callback, from any thread.

The blocking twins run corral's loop sometimes in the caller's thread, sometimes in a
keeper thread (:mod:`corral.blocking`). picows sockets refuse to be used from a thread
other than the one that opened them; an asyncio (or uvloop) transport belongs to its loop
and to whichever thread runs it, so :class:`AsyncioSocket` serves a loop that moves
between threads. It is callback-style like the picows one: the loop calls
``data_received`` with the bytes read, the frames are parsed right there
(:class:`~corral.client.dialers.wsframes.FrameReader`) and each whole message goes to the
listening :class:`~corral.client.connection.Connection` in the same call: no reader
task, no queue.

It gives what the other client transports give: the subprotocol offered and checked,
the extra (resume, auth) headers, the handshake refusal mapped to corral's errors (HTTP
503/429/401 with their structured bodies, :func:`~corral.client.dialers.refusal.refusal`), the
message limit (1009), pings for the connection's keepalive (each pong resolves its own
ping and the ones before it), the server's pings answered, fragmented messages
reassembled within the limit, a close handshake (after which the server closes TCP, as
RFC 6455 §7.1.1 prefers), ``abort``, one report of the loss with why, and back-pressure
on :meth:`AsyncioSocket.send` (the write buffer over its high-water mark makes it wait,
as a websockets ``send`` does). No extension is offered: like the picows and websockets
clients corral builds, it does not compress.

:class:`AsyncioDialer` is its :class:`~corral.client.dialers.base.Dialer`; ``auto`` picks
it for a loop that moves between threads (see :func:`~corral.client.dialers.dialer_for`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Mapping
from typing import cast
from urllib.parse import urlsplit

from corral import __version__, runtime
from corral.client.dialers.base import Dialer, Inbox, OnClosed, OnFrame, SocketClosed
from corral.client.dialers.refusal import refusal
from corral.client.dialers.wsframes import (
    BINARY,
    CLOSE,
    MAX_HEAD_BYTES,
    NO_STATUS,
    NORMAL,
    PING,
    PONG,
    PROTOCOL_ERROR,
    TEXT,
    TOO_BIG,
    CloseFrame,
    FrameError,
    FrameReader,
    Head,
    Masker,
    PingFrame,
    PongFrame,
    check_upgrade,
    close_payload,
    dechunk,
    new_key,
    read_head,
    upgrade_request,
)
from corral.errors import ConnectionLost, CorralError, UnsupportedProtocol
from corral.protocol.codecs import Frame

CLOSE_TIMEOUT_S = 2.0
"""How long the server may keep TCP open after the close handshake before it is cut."""

MAX_REFUSAL_BYTES = 64 * 1024
"""The most of a refused upgrade's body that is read."""


class AsyncioSocket(asyncio.Protocol):
    """One client WebSocket on an asyncio transport (see module docstring).

    Built by :class:`AsyncioDialer`, which sends ``request`` (the upgrade, made with
    ``key``) once connected and waits for :meth:`opened`. Messages that arrive before
    :meth:`listen` are kept and handed over by it.

    Args:
        max_size: the largest message accepted; a larger one closes the socket (1009).
    """

    def __init__(
        self, max_size: int, key: str, request: bytes, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.max_size = max_size
        self.subprotocol: str | None = None
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self._loop = loop
        self._key = key
        self._request = request
        self._transport: asyncio.Transport | None = None
        self._opened: asyncio.Future[None] = loop.create_future()
        self._lost: asyncio.Future[None] = loop.create_future()
        self._head = bytearray()
        self._refused: Head | None = None
        """A refused upgrade's answer, while its body arrives."""
        self._reader: FrameReader | None = None
        """Set once the upgrade is done: from then on bytes are frames."""
        self._masker = Masker()
        self._inbox = Inbox()
        self._pings: dict[bytes, asyncio.Future[float]] = {}
        self._pinged = 0
        self._close_sent = False
        self._closed_by_server = False
        self._gone = False
        self._why = "connection lost"
        self._closer: asyncio.TimerHandle | None = None
        self._paused = False
        self._drains: list[asyncio.Future[None]] = []

    # -- the Socket face ----------------------------------------------------------

    @property
    def transport(self) -> asyncio.Transport:
        """The transport underneath (``abort()`` drops the connection at once)."""
        assert self._transport is not None, "not connected"
        return self._transport

    def listen(self, on_frame: OnFrame, on_closed: OnClosed) -> None:
        """Hand every message to ``on_frame`` from now on; ``on_closed`` once at the end."""
        self._inbox.listen(on_frame, on_closed)

    def write(self, message: Frame) -> None:
        """Write one message now (no await: the transport buffers it).

        Raises:
            SocketClosed: the socket is closed or closing.
        """
        transport = self._transport
        if self._close_sent or self._gone or transport is None:
            raise SocketClosed()
        if isinstance(message, str):
            transport.write(self._masker.frame(TEXT, message.encode()))
        else:
            transport.write(self._masker.frame(BINARY, message))

    async def send(self, message: Frame) -> None:
        """Write one message; wait while the write buffer is over its high-water mark."""
        self.write(message)
        if self._paused:
            drained: asyncio.Future[None] = self._loop.create_future()
            self._drains.append(drained)
            await drained
            if self._gone:
                raise SocketClosed()

    async def ping(self) -> Awaitable[float]:
        """Send a ping; the result resolves (to the loop's time) when its pong arrives."""
        transport = self._transport
        if self._close_sent or self._gone or transport is None or transport.is_closing():
            raise SocketClosed()
        self._pinged += 1
        payload = self._pinged.to_bytes(4, "big")
        pong: asyncio.Future[float] = self._loop.create_future()
        self._pings[payload] = pong
        transport.write(self._masker.frame(PING, payload))
        return pong

    async def close(self) -> None:
        """Close with a closing handshake; return once the connection is gone (bounded
        by the caller, who aborts after)."""
        if self._transport is None or self._gone:
            return
        if not self._close_sent:
            self._send_close(NORMAL)
        await asyncio.shield(self._lost)

    def abort(self) -> None:
        """Drop the connection at once, without a closing handshake."""
        transport = self._transport
        if transport is not None:
            transport.abort()

    async def opened(self) -> None:
        """Wait for the upgrade's answer.

        Raises:
            CorralError: the server refused the upgrade (see :func:`refusal`).
            FrameError: the answer does not complete a WebSocket upgrade.
            OSError: the connection closed before the answer.
        """
        await self._opened

    # -- asyncio callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but are one.
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:
            self._upgrading(data)
            return
        for event in reader.feed(data):
            if isinstance(event, (bytes, str)):
                self._inbox.deliver(event)
            elif isinstance(event, PingFrame):
                if not self._close_sent:
                    self._send(PONG, event.payload)
            elif isinstance(event, PongFrame):
                self._ponged(event.payload)
            else:
                self._server_closed(event)
        if reader.failure is not None:
            self._fail(reader.failure)

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost reports it

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drains()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._gone:
            return
        self._gone = True
        if self._closer is not None:
            self._closer.cancel()
        if not self._opened.done():
            if self._refused is not None:
                self._opened.set_exception(self._refusal())
            else:
                # an OSError: the dialer reports it as ConnectionLost, with the URL
                self._opened.set_exception(ConnectionResetError("closed during the handshake"))
        elif self._closed_by_server:
            reason = self.close_reason or ""
            self._why = f"closed by the server (code {self.close_code} {reason})".strip()
        elif self.close_code is None:
            self.close_code = 1006
            if exc is not None:
                self._why = f"connection lost: {exc}"
        for pong in self._pings.values():
            if not pong.done():
                pong.set_exception(SocketClosed())
                pong.exception()  # a keepalive cancelled first never awaits it: no warning
        self._pings.clear()
        self._wake_drains()
        if not self._lost.done():
            self._lost.set_result(None)
        self._inbox.end(self._why)

    # -- the upgrade ---------------------------------------------------------------

    def _upgrading(self, data: bytes) -> None:
        head = self._head
        head += data
        if self._refused is not None:
            self._refusal_body()
            return
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > MAX_HEAD_BYTES:
                self._not_upgraded(FrameError(PROTOCOL_ERROR, "the answer's head is too long"))
            return
        try:
            answer = read_head(bytes(head[:end]))
        except FrameError as exc:
            self._not_upgraded(exc)
            return
        del head[: end + 4]
        if answer.status != 101:
            self._refused = answer
            self._refusal_body()
            return
        try:
            self.subprotocol = check_upgrade(answer, self._key)
        except FrameError as exc:
            self._not_upgraded(exc)
            return
        self._reader = FrameReader(self.max_size)
        self._head = bytearray()
        if not self._opened.done():
            self._opened.set_result(None)
        if head:
            self.data_received(bytes(head))

    def _refusal_body(self) -> None:
        """Refuse once the body is whole (by its length, its last chunk, or EOF)."""
        answer = self._refused
        assert answer is not None
        body = self._head
        length = answer.headers.get("content-length", "")
        if "chunked" in answer.headers.get("transfer-encoding", "").lower():
            whole = dechunk(bytes(body)) is not None
        else:
            whole = length.isdigit() and len(body) >= int(length)
        if whole or len(body) > MAX_REFUSAL_BYTES:
            if not self._opened.done():
                self._opened.set_exception(self._refusal())
            self.transport.close()

    def _refusal(self) -> CorralError:
        answer = self._refused
        assert answer is not None
        body = bytes(self._head[:MAX_REFUSAL_BYTES])
        if "chunked" in answer.headers.get("transfer-encoding", "").lower():
            body = dechunk(body) or b""
        return refusal(answer.status, body, answer.headers.get("retry-after"))

    def _not_upgraded(self, error: FrameError) -> None:
        if not self._opened.done():
            self._opened.set_exception(error)
        self.transport.abort()

    # -- frames ----------------------------------------------------------------------

    def _send(self, opcode: int, payload: bytes) -> None:
        transport = self._transport
        if transport is not None and not self._gone:
            transport.write(self._masker.frame(opcode, payload))

    def _send_close(self, code: int, reason: str = "") -> None:
        self._close_sent = True
        self._send(CLOSE, close_payload(code, reason))
        if self._closed_by_server:
            self._await_tcp_close()

    def _server_closed(self, frame: CloseFrame) -> None:
        """The server's close frame: echo its code (unless this side closed first)."""
        self.close_code, self.close_reason = frame.code, frame.reason
        self._closed_by_server = True
        if self._close_sent:
            self._await_tcp_close()
        else:
            self._send_close(frame.code if frame.code != NO_STATUS else NO_STATUS)

    def _await_tcp_close(self) -> None:
        """The close handshake is done: the server closes TCP, or it is cut after a while."""
        if self._closer is None and not self._gone:
            self._closer = self._loop.call_later(CLOSE_TIMEOUT_S, self.transport.abort)

    def _fail(self, error: FrameError) -> None:
        """The server broke the protocol: say why in a close frame and drop TCP."""
        if error.code == TOO_BIG:
            self._why = f"a message from the server exceeded {self.max_size} bytes"
        else:
            self._why = f"the server broke the WebSocket protocol: {error.reason}"
        if not self._closed_by_server:
            self.close_code, self.close_reason = error.code, error.reason
        if not self._close_sent:
            self._close_sent = True
            self._send(CLOSE, close_payload(error.code, error.reason))
        self.transport.close()

    def _ponged(self, payload: bytes) -> None:
        """Resolve the ping that carried ``payload`` and the ones sent before it (their
        pongs may be answered by this one, §5.5.3); an unsolicited pong is ignored."""
        if payload not in self._pings:
            return
        now = self._loop.time()
        while self._pings:
            key = next(iter(self._pings))
            pong = self._pings.pop(key)
            if not pong.done():
                pong.set_result(now)
            if key == payload:
                return

    def _wake_drains(self) -> None:
        drains, self._drains = self._drains, []
        for drained in drains:
            if not drained.done():
                drained.set_result(None)


class AsyncioDialer(Dialer):
    """Opens :class:`AsyncioSocket` WebSockets on the running loop's transports (any
    thread may run the loop)."""

    name = "asyncio"

    async def open(
        self,
        url: str,
        subprotocol: str | None,
        headers: Mapping[str, str],
        timeout: float,
        max_size: int,
    ) -> AsyncioSocket:
        """A WebSocket to ``url`` (see :meth:`Dialer.open`)."""
        parts = urlsplit(url)
        secure = parts.scheme == "wss"
        host = parts.hostname or ""
        literal = f"[{host}]" if ":" in host else host
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # Like the picows dialer: corral's User-Agent unless the caller sets one, and the
        # subprotocol is this dialer's to offer.
        extra = {"User-Agent": f"corral/{__version__}"}
        for name, value in headers.items():
            if name.lower() == "user-agent":
                del extra["User-Agent"]
            if name.lower() != "sec-websocket-protocol":
                extra[name] = value
        if subprotocol is not None:
            extra["Sec-WebSocket-Protocol"] = subprotocol
        key = new_key()
        request = upgrade_request(
            target, literal if parts.port is None else f"{literal}:{parts.port}", key, extra
        )
        loop = asyncio.get_running_loop()
        socket = AsyncioSocket(max_size, key, request, loop)
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: socket,
                    host,
                    parts.port or (443 if secure else 80),
                    ssl=ssl.create_default_context() if secure else None,
                )
                await socket.opened()
        except CorralError:  # a refusal (some are OSErrors too: ConnectionLost)
            socket.abort()
            raise
        except (OSError, TimeoutError, FrameError) as exc:
            socket.abort()
            raise ConnectionLost(f"cannot connect to {url}: {str(exc) or 'timed out'}") from None
        except BaseException:
            socket.abort()
            raise
        if socket.subprotocol != subprotocol:
            accepted = socket.subprotocol
            try:
                await runtime.wait_for(socket.close(), CLOSE_TIMEOUT_S)
            except TimeoutError:
                socket.abort()
            raise UnsupportedProtocol(
                f"{url} did not accept subprotocol {subprotocol}", details={"accepted": accepted}
            )
        return socket


asyncio_dialer = AsyncioDialer()
"""The asyncio dialer (``transport="asyncio"``)."""


__all__ = ["AsyncioDialer", "AsyncioSocket", "asyncio_dialer"]

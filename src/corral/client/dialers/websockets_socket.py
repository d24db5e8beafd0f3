"""A client WebSocket on the ``websockets`` library (``transport="websockets"``).

The reference implementation the other dialers are held to (its RFC 6455 handling is
the library's): :class:`WebsocketsSocket` gives the library's connection the one socket
shape every dialer gives (:class:`~corral.client.dialers.base.Socket`): a reader task
hands each message to the listener, :meth:`WebsocketsSocket.write` queues messages for
a writer task (the library's ``send`` is a coroutine), in order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Mapping

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.protocol import State

from corral import __version__, runtime
from corral.client.dialers.base import Dialer, Inbox, OnClosed, OnFrame, SocketClosed
from corral.client.dialers.refusal import refusal
from corral.errors import ConnectionLost, UnsupportedProtocol
from corral.protocol.codecs import Frame


class WebsocketsSocket:
    """One ``websockets`` client connection with the dialers' socket shape."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._inbox = Inbox()
        self._outbox: deque[Frame] = deque()
        self._writer: asyncio.Task[None] | None = None
        self._broken = False
        """A write failed: the connection closed under the writer."""
        self._reader = asyncio.get_running_loop().create_task(
            self._read(), name="corral-websockets-reader"
        )

    @property
    def subprotocol(self) -> str | None:
        """The subprotocol the server accepted."""
        return self.ws.subprotocol

    @property
    def close_code(self) -> int | None:
        """The close code, once closed."""
        return self.ws.close_code

    def listen(self, on_frame: OnFrame, on_closed: OnClosed) -> None:
        """Hand every message to ``on_frame`` from now on; ``on_closed`` once at the end."""
        self._inbox.listen(on_frame, on_closed)

    def _open(self) -> bool:
        return self.ws.state is State.OPEN and not self._inbox.ended

    def write(self, message: Frame) -> None:
        """Queue one message for the writer task (sent in order)."""
        if self._broken or not self._open():
            raise SocketClosed()
        self._outbox.append(message)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(
                self._write_all(), name="corral-websockets-writer"
            )

    async def send(self, message: Frame) -> None:
        """Write one message, waiting as the library's ``send`` does."""
        self.write(message)
        writer = self._writer
        if writer is not None:
            await asyncio.shield(writer)
        if self._broken:
            raise SocketClosed()

    async def _write_all(self) -> None:
        try:
            while self._outbox:
                await self.ws.send(self._outbox.popleft())
        except ConnectionClosed:
            self._broken = True
            self._outbox.clear()  # the reader reports the end
        finally:
            self._writer = None

    async def ping(self) -> Awaitable[float]:
        """Send a ping; the result resolves when its pong arrives."""
        try:
            pong = await self.ws.ping()
        except ConnectionClosed:
            raise SocketClosed() from None
        return _pong(pong)

    async def close(self) -> None:
        """Close with a closing handshake."""
        await self.ws.close()
        await runtime.reap(self._reader)

    def abort(self) -> None:
        """Drop the connection at once."""
        self.ws.transport.abort()

    async def _read(self) -> None:
        ws = self.ws
        try:
            async for frame in ws:
                self._inbox.deliver(frame)
            reason = f"closed by the server (code {ws.close_code} {ws.close_reason or ''})"
        except ConnectionClosed as exc:
            reason = f"connection lost: {exc}"
        except Exception as exc:  # the end must be reported, whatever happened
            reason = f"connection failed: {exc!r}"
        self._inbox.end(reason.strip())


async def _pong(pong: Awaitable[float]) -> float:
    try:
        return await pong
    except ConnectionClosed:
        raise SocketClosed() from None


class WebsocketsDialer(Dialer):
    """Opens :class:`WebsocketsSocket` connections."""

    name = "websockets"

    async def open(
        self,
        url: str,
        subprotocol: str | None,
        headers: Mapping[str, str],
        timeout: float,
        max_size: int,
    ) -> WebsocketsSocket:
        """A WebSocket to ``url`` (see :meth:`Dialer.open`)."""
        try:
            ws = await connect(
                url,
                subprotocols=None if subprotocol is None else [subprotocol],  # type: ignore[list-item]
                open_timeout=timeout,
                # Keepalive is the connection's (see Connection._keep_alive): it drops a
                # dead socket at once instead of waiting out a close nobody answers.
                ping_interval=None,
                ping_timeout=None,
                close_timeout=2.0,
                max_size=max_size,
                additional_headers=dict(headers),
                compression=None,
                user_agent_header=f"corral/{__version__}",
            )
        except InvalidStatus as exc:
            response = exc.response
            raise refusal(
                response.status_code,
                bytes(response.body or b""),
                response.headers.get("Retry-After"),
            ) from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise ConnectionLost(f"cannot connect to {url}: {exc}") from None
        if ws.subprotocol != subprotocol:
            await ws.close()
            raise UnsupportedProtocol(
                f"{url} did not accept subprotocol {subprotocol}",
                details={"accepted": ws.subprotocol},
            )
        return WebsocketsSocket(ws)


websockets_dialer = WebsocketsDialer()
"""The ``websockets`` dialer (``transport="websockets"``)."""


__all__ = ["WebsocketsDialer", "WebsocketsSocket", "websockets_dialer"]

"""The dialer interface: what opens a connection's socket, and the socket it opens.

A :class:`Dialer` is the one seam between corral's client and the network (the httpx
``AsyncBaseTransport`` school): :meth:`Dialer.open` opens a WebSocket-like
:class:`Socket` to a server's URL for a :class:`~corral.client.connection.Connection`,
and :meth:`Dialer.http` gives an HTTP client whose requests reach the same servers (the
pool's ``/health`` probes, ``/schema``, ``/metadata``). The client code above it (the
protocol object, the connection, the fleet, the pool and the adapters) is the same
whichever dialer carries the bytes: picows, asyncio's transports, the ``websockets``
library, or :mod:`corral.testing`'s in-process network, which needs no socket at all.

Every socket has one shape: frames come by callback (:meth:`Socket.listen`), go out with
:meth:`Socket.write` (at once, the transport buffers) or :meth:`Socket.send` (waiting
while the write buffer is full), and the end is reported once, with why. No caller asks
which kind of socket it holds.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import httpx

from corral.protocol.codecs import Frame

OnFrame = Callable[[Frame], None]
"""Takes one whole message from the server."""
OnClosed = Callable[[str], None]
"""Told once that the socket is gone, with why."""


class SocketClosed(ConnectionError):
    """The socket is closed or closing: nothing more can be written or pinged."""

    def __init__(self, why: str = "the socket is closed") -> None:
        super().__init__(why)


class Socket(Protocol):
    """What a connection needs of its socket, whatever carries it."""

    @property
    def subprotocol(self) -> str | None:
        """The subprotocol the server accepted (None: it chose none)."""
        ...

    @property
    def close_code(self) -> int | None:
        """The close code, once closed."""
        ...

    def listen(self, on_frame: OnFrame, on_closed: OnClosed) -> None:
        """Hand every message to ``on_frame`` from now on (the ones that came before
        first, in order); ``on_closed`` once at the end, with why."""
        ...

    def write(self, message: Frame) -> None:
        """Write one message now (no await: it is buffered).

        Raises:
            SocketClosed: the socket is closed or closing.
        """
        ...

    async def send(self, message: Frame) -> None:
        """Write one message; wait while the write buffer is over its high-water mark.

        Raises:
            SocketClosed: the socket is closed or closing.
        """
        ...

    async def ping(self) -> Awaitable[float]:
        """Send a ping; the result resolves when its pong arrives.

        Raises:
            SocketClosed: the socket is closed or closing.
        """
        ...

    async def close(self) -> None:
        """Close with a closing handshake (the caller bounds the wait, then aborts)."""
        ...

    def abort(self) -> None:
        """Drop the connection at once, without a closing handshake."""
        ...


class Dialer(ABC):
    """Opens sockets to servers, and reaches them over HTTP (see module docstring).

    A subclass implements :meth:`open`; one whose servers are not on the network (the
    in-process one) also overrides :meth:`http_transport`.
    """

    name: str = "dialer"
    """What the dialer is, for messages (``picows``, ``asyncio``, ``in-process``)."""

    @abstractmethod
    async def open(
        self,
        url: str,
        subprotocol: str | None,
        headers: Mapping[str, str],
        timeout: float,
        max_size: int,
    ) -> Socket:
        """A socket to ``url`` (a ``ws(s)://`` URL) offering ``subprotocol`` (None: offer
        none, as an OpenEnv client does).

        Raises:
            CapacityReached / TooManyConnections / Unauthorized: the server refused it.
            ConnectionLost: the server could not be reached.
            UnsupportedProtocol: the server did not accept ``subprotocol``.
        """

    def __copy__(self) -> Dialer:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Dialer:
        # A dialer is a way to reach servers, shared by whatever uses it: a copy (a
        # Gymnasium spec deep-copied by check_env) reaches the same ones.
        return self

    def http_transport(self) -> httpx.AsyncBaseTransport | None:
        """The transport of :meth:`http`'s clients (None: httpx's own, over the network)."""
        return None

    def http(
        self,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 2.0,
        base_url: str = "",
    ) -> httpx.AsyncClient:
        """An HTTP client reaching the servers this dialer reaches; no proxies from the
        environment (servers are addressed directly)."""
        return httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            trust_env=False,
            headers=dict(headers or {}),
            transport=self.http_transport(),
        )


class Inbox:
    """A socket's messages and its end, held until someone listens.

    The messages that arrive between the upgrade and :meth:`listen` (and the end, if it
    came first) are handed over by :meth:`listen`, in order; every socket keeps one.
    """

    __slots__ = ("_early", "_ended", "_on_closed", "_on_frame")

    def __init__(self) -> None:
        self._on_frame: OnFrame | None = None
        self._on_closed: OnClosed | None = None
        self._early: deque[Frame] = deque()
        self._ended: str | None = None

    @property
    def ended(self) -> bool:
        """The socket's end was reported."""
        return self._ended is not None

    def listen(self, on_frame: OnFrame, on_closed: OnClosed) -> None:
        """Hand every message to ``on_frame`` from now on; ``on_closed`` once at the end."""
        self._on_frame, self._on_closed = on_frame, on_closed
        while self._early:
            on_frame(self._early.popleft())
        if self._ended is not None:
            on_closed(self._ended)

    def deliver(self, message: Frame) -> None:
        """One whole message from the server."""
        on_frame = self._on_frame
        if on_frame is None:
            self._early.append(message)
        else:
            on_frame(message)

    def end(self, why: str) -> None:
        """The socket is gone (reported once; later calls do nothing), because of ``why``."""
        if self._ended is not None:
            return
        self._ended = why
        on_closed = self._on_closed
        if on_closed is not None:
            on_closed(why)


async def keep_alive(socket: Socket, interval: float, timeout: float | None) -> str | None:
    """Ping ``socket`` every ``interval`` seconds until it closes (None) or a pong does not
    come within ``timeout`` (the reason: a half-open socket, to be treated as a drop)."""
    while True:
        await asyncio.sleep(interval)
        try:
            async with asyncio.timeout(timeout):
                pong = await socket.ping()
                await pong
        except TimeoutError:
            return (
                f"no keepalive pong within {timeout:g} s "
                "(the server or the network stopped answering)"
            )
        except SocketClosed:
            return None


__all__ = ["Dialer", "Inbox", "OnClosed", "OnFrame", "Socket", "SocketClosed", "keep_alive"]

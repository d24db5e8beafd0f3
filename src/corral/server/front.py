"""The front door: one listening port for the native WebSocket path and every HTTP route.

Each accepted connection starts on a :class:`FrontDoor`, which reads the request head
and hands the socket on, with the bytes already read, to the protocol that serves it:

* a ``GET /ws`` upgrade offering a corral subprotocol goes to the native transport
  (:class:`~corral.server.native.NativeDoor`), when it runs;
* everything else — plain HTTP, OpenEnv's ``/ws`` envelope, ``/mcp``, the web UI — goes
  to uvicorn's HTTP protocol, on the same socket, so those clients notice nothing.

It also guards the handshake (issue 11.6): the head must arrive within
``ServerConfig.handshake_timeout_s`` (else 408 and close) and be at most
:data:`MAX_HEAD_BYTES` (else 431); and at most ``ServerConfig.max_pending_handshakes``
connections may be waiting for their head at once — past that the one waiting longest
is dropped, so byte-dribbling peers cannot starve healthy clients of file descriptors.
A healthy client sends its head at once and never waits long enough to be the oldest.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

from corral.protocol.codecs import SUBPROTOCOLS

log = logging.getLogger("corral.server")

MAX_HEAD_BYTES = 64 * 1024
"""The longest request head (request line and headers) a server reads."""

_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_TOO_LONG = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"Connection: close\r\nContent-Length: 0\r\n\r\n"
)

Adopt = Callable[[asyncio.Transport, bytes, str], None]
"""Takes over a transport whose head is a native upgrade: (transport, head, address)."""


class HandshakeGuard:
    """The connections still waiting for their request head, oldest first.

    Args:
        limit: how many may wait at once; a new one past it evicts the oldest.
        timeout_s: how long one may wait for its head.
    """

    def __init__(self, limit: int, timeout_s: float) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.waiting: OrderedDict[FrontDoor, None] = OrderedDict()
        self.evicted = 0
        self.expired = 0

    def enter(self, door: FrontDoor) -> None:
        """Count ``door`` as waiting; drop the oldest waiting one past the limit."""
        self.waiting[door] = None
        while len(self.waiting) > self.limit:
            oldest, _ = self.waiting.popitem(last=False)
            self.evicted += 1
            oldest.drop(_TIMEOUT)

    def leave(self, door: FrontDoor) -> None:
        """``door`` has its head, or is gone."""
        self.waiting.pop(door, None)


class FrontDoor(asyncio.Protocol):
    """The first protocol of every accepted connection (see the module docstring).

    Args:
        http: builds uvicorn's HTTP protocol for a connection handed to it.
        guard: the server's waiting handshakes.
        native: takes over native upgrades (None: the ASGI transport serves them).
    """

    __slots__ = ("_buffer", "_guard", "_http", "_native", "_timer", "_transport")

    def __init__(
        self, http: Callable[[], asyncio.Protocol], guard: HandshakeGuard, native: Adopt | None
    ) -> None:
        self._http = http
        self._guard = guard
        self._native = native
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start the head's deadline and count the connection as waiting."""
        # uvloop's transports do not subclass asyncio.Transport, but are one.
        self._transport = cast(asyncio.Transport, transport)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.timeout_s, self._expire)
        self._guard.enter(self)

    def data_received(self, data: bytes) -> None:
        """Collect the head; once whole, hand the connection on."""
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                self.drop(_TOO_LONG)
            return
        if end > MAX_HEAD_BYTES:
            self.drop(_TOO_LONG)
            return
        self._settle()
        transport = self._transport
        assert transport is not None
        head = bytes(self._buffer)
        self._buffer = bytearray()
        if self._native is not None and is_native_upgrade(head[:end]):
            peer = transport.get_extra_info("peername")
            self._native(transport, head, str(peer[0]) if peer else "")
            return
        protocol = self._http()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(head)

    def eof_received(self) -> bool | None:
        """The peer stopped sending before its head was whole: close."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """Gone while waiting: forget it."""
        self._settle()

    def drop(self, answer: bytes) -> None:
        """Answer ``answer`` (an HTTP error) and close."""
        self._settle()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(answer)
            transport.close()

    def _expire(self) -> None:
        self._timer = None
        self._guard.expired += 1
        self.drop(_TIMEOUT)

    def _settle(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._guard.leave(self)


def is_native_upgrade(head: bytes) -> bool:
    """Whether ``head`` is a well-formed WebSocket upgrade on ``/ws`` offering corral/1.

    Anything else goes to uvicorn, which answers it (an OpenEnv client on ``/ws``, a
    malformed upgrade with its 400, an upgrade picows would refuse but uvicorn serves), so
    only requests the native path accepts reach it.
    """
    line, _, rest = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] != b"GET" or parts[2] != b"HTTP/1.1":
        return False
    if parts[1].split(b"?", 1)[0] != b"/ws":
        return False
    headers: dict[bytes, list[bytes]] = {}
    for raw in rest.split(b"\r\n"):
        name, sep, value = raw.partition(b":")
        if not sep:
            return False
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    # Exactly what picows accepts (it checks after the upgrade decision, and a refusal
    # then would skip the link's clean-up); anything looser, say Firefox's
    # "Connection: keep-alive, Upgrade", is served by uvicorn instead.
    if [v.lower() for v in headers.get(b"upgrade", [])] != [b"websocket"]:
        return False
    if [v.lower() for v in headers.get(b"connection", [])] != [b"upgrade"]:
        return False
    if headers.get(b"sec-websocket-version") != [b"13"]:
        return False
    keys = headers.get(b"sec-websocket-key", [])
    if len(keys) != 1 or not _valid_key(keys[0]):
        return False
    if b"content-length" in headers or b"transfer-encoding" in headers:
        return False
    offered = b",".join(headers.get(b"sec-websocket-protocol", [])).decode("latin-1")
    return any(part.strip() in SUBPROTOCOLS for part in offered.split(","))


def _valid_key(key: bytes) -> bool:
    try:
        return len(base64.b64decode(key, validate=True)) == 16
    except (binascii.Error, ValueError):
        return False


def front_factory(
    http_class: Any, guard: HandshakeGuard, native: Adopt | None
) -> Callable[..., asyncio.Protocol]:
    """What uvicorn takes as its HTTP protocol class: builds a :class:`FrontDoor`.

    ``http_class`` is uvicorn's real HTTP protocol; it is built with the arguments
    uvicorn passed when a connection is handed to HTTP.
    """

    def build(**kwargs: Any) -> asyncio.Protocol:
        return FrontDoor(lambda: http_class(**kwargs), guard, native)

    return build

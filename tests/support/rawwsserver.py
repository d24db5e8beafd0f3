"""A WebSocket server by hand on asyncio streams: any answer to the upgrade, any frame.

For the client transports' own tests, which need what a well-behaved server library
never does: malformed frames, a refusal with a chunked body, a frame header announcing
more than the client accepts, control frames between fragments, a wrong accept key. It
also reads the client's frames as they are on the wire (masked or not, with their keys),
decoded independently of the code under test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


@dataclass
class WireFrame:
    """One client frame as it came: flags, opcode, its masking key and the payload
    unmasked."""

    fin: bool
    opcode: int
    masked: bool
    key: bytes
    payload: bytes


class RawPeer:
    """The server's side of one connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.request_line = ""
        self.headers: dict[str, str] = {}

    async def read_request(self) -> None:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")[:-2]
        self.request_line = lines[0]
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()

    def accept_key(self) -> str:
        key = self.headers["sec-websocket-key"].encode()
        return base64.b64encode(hashlib.sha1(key + _GUID).digest()).decode()

    async def accept(
        self, subprotocol: str | None = "corral.v1.msgpack", extra: str = "", key: str = ""
    ) -> None:
        """Answer 101 (with the subprotocol, ``extra`` header lines, a given accept key)."""
        lines = [
            "HTTP/1.1 101 Switching Protocols",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Accept: {key or self.accept_key()}",
        ]
        if subprotocol is not None:
            lines.append(f"Sec-WebSocket-Protocol: {subprotocol}")
        self.writer.write(("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode())
        await self.writer.drain()

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_frame(self) -> WireFrame:
        first, second = await self.reader.readexactly(2)
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", await self.reader.readexactly(8))
        masked = bool(second & 0x80)
        key = await self.reader.readexactly(4) if masked else b""
        data = await self.reader.readexactly(length)
        if masked:
            data = bytes(b ^ key[i % 4] for i, b in enumerate(data))
        return WireFrame(bool(first & 0x80), first & 0x0F, masked, key, data)

    async def at_eof(self) -> bool:
        """Wait for the client to close TCP (True) or send more (False)."""
        return await self.reader.read(1) == b""


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True, rsv: int = 0) -> bytes:
    """A server frame (unmasked) as the wire carries it."""
    first = (0x80 if fin else 0) | rsv << 4 | opcode
    n = len(payload)
    if n < 126:
        head = bytes((first, n))
    elif n < 65536:
        head = struct.pack("!BBH", first, 126, n)
    else:
        head = struct.pack("!BBQ", first, 127, n)
    return head + payload


def close(code: int, reason: str = "") -> bytes:
    return frame(0x8, struct.pack("!H", code) + reason.encode())


@contextlib.asynccontextmanager
async def serving(
    handler: Callable[[RawPeer], Awaitable[None]], tls: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    """Serve ``handler`` on 127.0.0.1 (over TLS with ``tls``); yield the ``ws://`` (or
    ``wss://``) URL. A failing handler's error is raised when the block ends."""
    failures: list[BaseException] = []

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = RawPeer(reader, writer)
        try:
            await peer.read_request()
            await handler(peer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except BaseException as exc:
            failures.append(exc)
        finally:
            writer.close()

    server = await asyncio.start_server(connected, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'wss' if tls else 'ws'}://127.0.0.1:{port}/ws"
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)
    if failures:
        raise failures[0]

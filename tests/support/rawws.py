"""A WebSocket client by hand on a plain socket: any handshake, any frame, no reading.

For the transport's own tests, which need what a well-behaved client library never does:
refused handshakes read as HTTP, compressed frames built by hand (deflate bombs), a
client that sends and never reads, a peer dribbling its request head.
"""

from __future__ import annotations

import base64
import os
import socket
import zlib
from typing import Any

import msgpack

from corral.protocol.codecs import PROTOCOL


class RawSocket:
    """One TCP connection to a test server at ``port`` on 127.0.0.1 (from ``source``, another
    loopback address, to be counted as another client)."""

    def __init__(
        self, port: int, rcvbuf: int | None = None, timeout: float = 20.0, source: str = ""
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if source:
            self.sock.bind((source, 0))
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.buffer = b""
        self.last_rsv1 = False
        """Whether the last frame read was compressed."""
        self.inflater = zlib.decompressobj(-15)
        """Inflates the server's compressed messages (with context takeover, if it uses it)."""

    def upgrade(
        self,
        subprotocol: str | None = "corral.v1.msgpack",
        headers: dict[str, str] | None = None,
        path: str = "/ws",
    ) -> tuple[int, dict[str, str], bytes]:
        """Send an upgrade request; return the answer's status, headers and body."""
        fields = {
            "Host": "127.0.0.1",
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
            "Sec-WebSocket-Version": "13",
        }
        if subprotocol is not None:
            fields["Sec-WebSocket-Protocol"] = subprotocol
        fields.update(headers or {})
        lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return self.read_response(body=True)

    def read_response(self, body: bool = True) -> tuple[int, dict[str, str], bytes]:
        """Read an HTTP response head (and its Content-Length body)."""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before a response: {self.buffer!r}")
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *rest = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in rest:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0")) if body else 0
        while len(self.buffer) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buffer += chunk
        content, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, content

    def send_frame(
        self, payload: bytes, opcode: int = 2, rsv1: bool = False, fin: bool = True
    ) -> None:
        """Send one client frame (masked with a zero key: the payload goes as it is)."""
        self.sock.sendall(frame_header(len(payload), opcode, rsv1, fin) + payload)

    def send_message(self, message: dict[str, Any], deflate: bool = False) -> None:
        """Send a msgpack message, compressed (permessage-deflate) if asked."""
        data = msgpack.packb(message)
        if deflate:
            data = compress(data)
        self.send_frame(data, rsv1=deflate)

    def read_frame(self) -> tuple[int, bytes]:
        """The next server frame: (opcode, payload). Compressed payloads are returned raw."""
        header = self._read(2)
        self.last_rsv1 = bool(header[0] & 0x40)
        opcode = header[0] & 0x0F
        length = header[1] & 0x7F
        if length == 126:
            length = int.from_bytes(self._read(2), "big")
        elif length == 127:
            length = int.from_bytes(self._read(8), "big")
        return opcode, self._read(length)

    def read_message(self) -> dict[str, Any]:
        """The next data frame's msgpack message (uncompressed frames only)."""
        while True:
            opcode, payload = self.read_frame()
            if opcode == 8:
                raise ConnectionError(f"closed: {close_code(payload)}")
            if opcode == 2:
                decoded: dict[str, Any] = msgpack.unpackb(payload)
                return decoded

    def read_inflated(self) -> dict[str, Any]:
        """The next data frame's msgpack message, inflated if it came compressed (pings
        and pongs in between are skipped: a slow test meets the server's keepalive)."""
        opcode, payload = self.read_frame()
        while opcode in (9, 10):
            opcode, payload = self.read_frame()
        if opcode == 8:
            raise ConnectionError(f"closed: {close_code(payload)}")
        if self.last_rsv1:
            payload = self.inflater.decompress(payload + b"\x00\x00\xff\xff")
        decoded: dict[str, Any] = msgpack.unpackb(payload)
        return decoded

    def hello(self) -> dict[str, Any]:
        """The corral/1 handshake over this upgraded connection."""
        self.send_message({"type": "hello", "id": 0, "protocol": PROTOCOL})
        return self.read_inflated()

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buffer)))
            if not chunk:
                raise ConnectionError("connection closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def close(self) -> None:
        self.sock.close()


def frame_header(length: int, opcode: int = 2, rsv1: bool = False, fin: bool = True) -> bytes:
    """A masked client frame header (zero mask key) for a payload of ``length`` bytes."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    if length < 126:
        size = bytes([0x80 | length])
    elif length < 65536:
        size = bytes([0x80 | 126]) + length.to_bytes(2, "big")
    else:
        size = bytes([0x80 | 127]) + length.to_bytes(8, "big")
    return bytes([first]) + size + b"\x00\x00\x00\x00"


def compress(data: bytes) -> bytes:
    """``data`` as one permessage-deflate message payload."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    out = compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
    return out[:-4]


def close_code(payload: bytes) -> int:
    """The code of a close frame's payload (1005 when it has none)."""
    return int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005

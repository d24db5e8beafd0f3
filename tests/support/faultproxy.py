"""A TCP proxy that injects faults into WebSocket traffic, for the reliability suites.

It sits between a client and a server on 127.0.0.1 and forwards bytes both ways. After
the HTTP upgrade it splits each direction into WebSocket frames (header parsing only;
payloads stay masked), so that faults can land on frame boundaries or inside a frame:

* ``cut``: close a link abruptly (TCP RST) or with a FIN, before or after a frame;
* ``truncate``: forward only the first part of a frame, then cut;
* ``stall``: stop forwarding either way while keeping both sockets open (half-open);
* ``drop_pings``: swallow WebSocket ping frames going one way (a tunnel that eats them);
* ``delay_s``: hold every frame back before forwarding it.

A :class:`RandomCuts` policy injects a fault every ~N client frames at random points.
The proxy counts what it did in :attr:`FaultProxy.stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections import Counter
from collections.abc import Callable
from enum import Enum

UP = "up"
"""Client → server."""
DOWN = "down"
"""Server → client."""

OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x1, 0x2, 0x8, 0x9, 0xA


class Act(Enum):
    """What to do with one frame."""

    PASS = "pass"
    DROP = "drop"
    CUT_BEFORE = "cut_before"
    """Cut the link without forwarding the frame (it never arrives)."""
    CUT_AFTER = "cut_after"
    """Forward the frame, then cut (it arrives; its answer is lost)."""
    TRUNCATE = "truncate"
    """Forward part of the frame, then cut."""


Policy = Callable[["Link", str, int | None, bytes], Act]
"""Decides the fate of one chunk: (link, direction, opcode or None for raw bytes, chunk)."""


class FrameScanner:
    """Splits one direction of a connection into the HTTP head and WebSocket frames."""

    def __init__(self, direction: str) -> None:
        self.direction = direction
        self.buffer = bytearray()
        self.in_head = True
        self.raw = False

    def feed(self, data: bytes) -> list[tuple[int | None, bytes]]:
        """Add received bytes; return the complete chunks: (opcode or None, bytes)."""
        self.buffer += data
        out: list[tuple[int | None, bytes]] = []
        if self.in_head:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return out
            head = bytes(self.buffer[: end + 4])
            del self.buffer[: end + 4]
            self.in_head = False
            first = head.split(b"\r\n", 1)[0]
            upgraded = (
                b" 101 " in first + b" "
                if self.direction == DOWN
                else b"upgrade: websocket" in head.lower()
            )
            self.raw = not upgraded  # plain HTTP (or a refused upgrade): pass through
            out.append((None, head))
        if self.raw:
            if self.buffer:
                out.append((None, bytes(self.buffer)))
                self.buffer.clear()
            return out
        while (frame := self._next_frame()) is not None:
            out.append(frame)
        return out

    def _next_frame(self) -> tuple[int, bytes] | None:
        buf = self.buffer
        if len(buf) < 2:
            return None
        opcode = buf[0] & 0x0F
        masked = buf[1] & 0x80
        length = buf[1] & 0x7F
        offset = 2
        if length == 126:
            if len(buf) < 4:
                return None
            (length,) = struct.unpack_from("!H", buf, 2)
            offset = 4
        elif length == 127:
            if len(buf) < 10:
                return None
            (length,) = struct.unpack_from("!Q", buf, 2)
            offset = 10
        if masked:
            offset += 4
        total = offset + length
        if len(buf) < total:
            return None
        frame = bytes(buf[:total])
        del buf[:total]
        return opcode, frame


class Link:
    """One proxied connection: a client socket, a server socket, two pumps."""

    def __init__(
        self,
        proxy: FaultProxy,
        number: int,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.number = number
        self.client_reader, self.client_writer = client
        self.server_reader, self.server_writer = server
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.closed = False
        self.frames = Counter[str]()
        self.pending: dict[str, Act] = {}
        """A fault armed for the next data frame going in a direction."""
        self.tasks = [
            asyncio.create_task(self._pump(UP, self.client_reader, self.server_writer)),
            asyncio.create_task(self._pump(DOWN, self.server_reader, self.client_writer)),
        ]

    @property
    def stalled(self) -> bool:
        """True while nothing is forwarded on this link."""
        return not self.flowing.is_set()

    def stall(self) -> None:
        """Stop forwarding both ways, leaving both sockets open (half-open)."""
        if not self.stalled:
            self.proxy.stats["stalls"] += 1
        self.flowing.clear()

    def resume(self) -> None:
        """Forward again after :meth:`stall`."""
        self.flowing.set()

    def arm(self, direction: str, act: Act) -> None:
        """Apply ``act`` to the next data frame going ``direction``."""
        self.pending[direction] = act

    def cut(self, reset: bool = True) -> None:
        """Close both sides now: a TCP RST with ``reset``, else a FIN."""
        if self.closed:
            return
        self.closed = True
        self.proxy.stats["cuts_rst" if reset else "cuts_fin"] += 1
        for writer in (self.client_writer, self.server_writer):
            with contextlib.suppress(Exception):
                if reset:
                    sock = writer.get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                    writer.transport.abort()
                else:
                    writer.close()
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self.proxy.links.discard(self)

    def _close_quietly(self) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in (self.client_writer, self.server_writer):
            with contextlib.suppress(Exception):
                writer.close()
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self.proxy.links.discard(self)

    def _decide(self, direction: str, opcode: int | None, chunk: bytes) -> Act:
        if opcode == OP_PING and direction in self.proxy.drop_pings:
            self.proxy.stats[f"pings_dropped_{direction}"] += 1
            return Act.DROP
        if opcode in (OP_TEXT, OP_BINARY):
            self.frames[direction] += 1
            self.proxy.stats[f"frames_{direction}"] += 1
            armed = self.pending.pop(direction, None)
            if armed is not None:
                return armed
            if self.proxy.policy is not None:
                return self.proxy.policy(self, direction, opcode, chunk)
        return Act.PASS

    async def _pump(
        self, direction: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        scanner = FrameScanner(direction)
        try:
            while True:
                await self.flowing.wait()
                data = await reader.read(65536)
                if not data:
                    break
                for opcode, chunk in scanner.feed(data):
                    if self.proxy.delay_s:
                        await asyncio.sleep(self.proxy.delay_s)
                    await self.flowing.wait()  # a stall holds even bytes already read
                    act = self._decide(direction, opcode, chunk)
                    if act is Act.DROP:
                        continue
                    if act is Act.CUT_BEFORE:
                        self.proxy.stats["faults"] += 1
                        self.cut(reset=self.proxy.rng.random() < 0.5)
                        return
                    if act is Act.TRUNCATE:
                        self.proxy.stats["faults"] += 1
                        self.proxy.stats["truncations"] += 1
                        keep = self.proxy.rng.randrange(1, max(2, len(chunk)))
                        writer.write(chunk[:keep])
                        await writer.drain()
                        self.cut(reset=self.proxy.rng.random() < 0.5)
                        return
                    writer.write(chunk)
                    await writer.drain()
                    if act is Act.CUT_AFTER:
                        self.proxy.stats["faults"] += 1
                        self.cut(reset=self.proxy.rng.random() < 0.5)
                        return
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        self._close_quietly()


class FaultProxy:
    """Forwards 127.0.0.1:<port> to a target, injecting faults (see module docstring)."""

    def __init__(self, target_port: int, *, seed: int = 0) -> None:
        self.target_port = target_port
        """Where new links connect; change it to point at a restarted server."""
        self.rng = random.Random(seed)
        self.links: set[Link] = set()
        self.stats = Counter[str]()
        self.policy: Policy | None = None
        self.drop_pings: set[str] = set()
        self.delay_s = 0.0
        self.stall_new = False
        """Stall every link from the moment it is accepted."""
        self._server: asyncio.Server | None = None
        self._count = 0
        self.port = 0

    @property
    def url(self) -> str:
        """The proxy's HTTP URL (clients connect here instead of to the server)."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FaultProxy:
        """Start listening on a free 127.0.0.1 port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            self.stats["refused"] += 1
            writer.close()
            return
        self._count += 1
        self.stats["links"] += 1
        link = Link(self, self._count, (reader, writer), upstream)
        if self.stall_new:
            link.stall()
        self.links.add(link)

    def cut_all(self, reset: bool = True) -> int:
        """Cut every live link; return how many."""
        links = list(self.links)
        for link in links:
            link.cut(reset)
        return len(links)

    def stall_all(self) -> int:
        """Stall every live link; return how many."""
        for link in self.links:
            link.stall()
        return len(self.links)

    async def close(self) -> None:
        """Stop listening and close every link."""
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link._close_quietly()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RandomCuts:
    """A policy that injects one fault every ~``every`` client→server data frames.

    The gap between faults is drawn uniformly from ``[every/2, 3*every/2]``. Each fault
    is one of: the request never arrives (cut before it), it arrives and its reply is
    lost (cut after it, or cut before the reply), or it arrives half-written (truncated),
    or the reply arrives half-written. Cuts are RST or FIN at random.
    """

    KINDS = ("request_lost", "reply_lost", "request_truncated", "reply_truncated", "cut_after")

    def __init__(self, every: int, rng: random.Random) -> None:
        self.every = every
        self.rng = rng
        self.kinds = Counter[str]()
        self._countdown = self._gap()
        self.enabled = True

    def _gap(self) -> int:
        return self.rng.randint(max(1, self.every // 2), max(1, self.every * 3 // 2))

    def __call__(self, link: Link, direction: str, opcode: int | None, chunk: bytes) -> Act:
        """Count client frames and, when the countdown runs out, pick a fault."""
        if direction != UP or not self.enabled:
            return Act.PASS
        self._countdown -= 1
        if self._countdown > 0:
            return Act.PASS
        self._countdown = self._gap()
        kind = self.rng.choice(self.KINDS)
        self.kinds[kind] += 1
        if kind == "request_lost":
            return Act.CUT_BEFORE
        if kind == "request_truncated":
            return Act.TRUNCATE
        if kind == "cut_after":
            return Act.CUT_AFTER
        link.arm(DOWN, Act.CUT_BEFORE if kind == "reply_lost" else Act.TRUNCATE)
        return Act.PASS

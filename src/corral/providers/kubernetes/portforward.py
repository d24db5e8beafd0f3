"""Port-forwarding through the API server, for a trainer outside the cluster.

:class:`PortForward` listens on ``127.0.0.1`` (a port the OS picks) and, like ``kubectl
port-forward``, opens one port-forward stream through the API server per accepted
connection, so that the many WebSocket connections of an ``EnvPool`` are independent.
Each stream is a WebSocket speaking ``v4.channel.k8s.io``, framed by
:class:`ChannelFrames` (sans-I/O); the socket code here only moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp

from corral.errors import PlatformError
from corral.providers.kubernetes.api import KubeAPI

log = logging.getLogger("corral.providers.kubernetes")


class PortForwardError(PlatformError, RuntimeError):
    """The API server or the kubelet broke the port-forward protocol or reported an error."""


class ChannelFrames:
    """The ``v4.channel.k8s.io`` framing of a port-forward stream to one port.

    Every WebSocket message starts with a channel byte: channel 0 carries the port's data,
    channel 1 its errors. The server's first message on each channel is the port number
    (two bytes, little-endian); what the client sends is its data prefixed with channel 0.
    """

    DATA = 0
    ERROR = 1

    def __init__(self, port: int) -> None:
        self.port = port
        self._announced: set[int] = set()

    def outgoing(self, data: bytes) -> bytes:
        """The message carrying ``data`` to the Pod."""
        return bytes((self.DATA,)) + data

    def incoming(self, message: bytes) -> tuple[bytes, str]:
        """``(data, error)`` of a message from the server (either may be empty).

        Raises:
            PortForwardError: an unknown channel, or a port announcement for another port.
        """
        if not message:
            return b"", ""
        channel, payload = message[0], message[1:]
        if channel not in (self.DATA, self.ERROR):
            raise PortForwardError(f"port-forward message on unknown channel {channel}")
        if channel not in self._announced:
            if len(payload) < 2:
                raise PortForwardError("port-forward stream did not announce its port")
            announced = int.from_bytes(payload[:2], "little")
            if announced != self.port:
                raise PortForwardError(
                    f"port-forward stream is for port {announced}, not {self.port}"
                )
            self._announced.add(channel)
            payload = payload[2:]
        if channel == self.ERROR:
            return b"", payload.decode("utf-8", errors="replace")
        return payload, ""


class PortForward:
    """``127.0.0.1:<port>`` forwarded to ``port`` of Pod ``pod`` (see the module docstring).

    Args:
        api: the API client (its namespace holds the Pod).
        pod: the Pod's name.
        port: the port in the Pod.
    """

    def __init__(self, api: KubeAPI, pod: str, port: int) -> None:
        self.api = api
        self.pod = pod
        self.port = port
        self.local_port = 0
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """The local base URL (``http://127.0.0.1:PORT``)."""
        return f"http://127.0.0.1:{self.local_port}"

    async def start(self) -> str:
        """Start listening; return :attr:`url`."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.local_port = int(self._server.sockets[0].getsockname()[1])
        return self.url

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        try:
            async with await self.api.portforward(self.pod, self.port) as ws:
                await self._pump(ws, reader, writer)
        except (aiohttp.ClientError, PortForwardError, OSError) as exc:
            log.warning("port-forward to %s:%d failed: %s", self.pod, self.port, exc)
        finally:
            self._streams.discard(task)
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    async def _pump(
        self, ws: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        frames = ChannelFrames(self.port)

        async def to_pod() -> None:
            while data := await reader.read(65536):
                await ws.send_bytes(frames.outgoing(data))

        async def from_pod() -> None:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY:
                    break
                data, error = frames.incoming(message.data)
                if error:
                    raise PortForwardError(error)
                if data:
                    writer.write(data)
                    await writer.drain()

        # Either side ending ends the stream: port-forward has no half-close.
        tasks = [asyncio.ensure_future(to_pod()), asyncio.ensure_future(from_pod())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error

    async def close(self) -> None:
        """Stop listening and end every stream."""
        if self._server is not None:
            self._server.close()
        for task in list(self._streams):
            task.cancel()
        await asyncio.gather(*self._streams, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

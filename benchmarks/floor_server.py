"""``python -m benchmarks.floor_server [--kind websockets|picows|tcp] --port-file F``: the floors.

A raw WebSocket server that sends every message straight back: what one round trip costs
on this machine with no framework at all, with ``websockets`` (the library corral's
ASGI path and fallback client use) or with ``picows`` (the native transport's library;
its client is timed against this server). ``tcp`` is less still: bytes echoed by an
asyncio ``Protocol`` (no WebSocket framing), the cheapest round trip a Python server
process offers; the PPO section's bound steps against it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import cast

from websockets.asyncio.server import ServerConnection, serve

from corral import runtime


async def _echo(ws: ServerConnection) -> None:
    async for message in ws:
        await ws.send(message)


def _publish(port_file: Path, port: int, scheme: str = "ws") -> None:
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(f"{scheme}://127.0.0.1:{port}")
    os.replace(tmp, port_file)


async def _serve_websockets(port_file: Path) -> None:
    async with serve(_echo, "127.0.0.1", 0, compression=None, max_size=None) as server:
        _publish(port_file, next(iter(server.sockets)).getsockname()[1])
        await asyncio.Future()


async def _serve_picows(port_file: Path) -> None:
    from picows import WSFrame, WSListener, WSMsgType, WSTransport, ws_create_server

    class Echo(WSListener):  # type: ignore[misc]
        def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
            if frame.msg_type in (WSMsgType.BINARY, WSMsgType.TEXT):
                transport.send(frame.msg_type, frame.get_payload_as_bytes())
            elif frame.msg_type is WSMsgType.CLOSE:
                transport.send_close(frame.get_close_code())
                transport.disconnect()

    server = await ws_create_server(lambda request: Echo(), "127.0.0.1", 0)
    _publish(port_file, server.sockets[0].getsockname()[1])
    await asyncio.Future()


class _TcpEcho(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports behave as asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


async def _serve_tcp(port_file: Path) -> None:
    server = await asyncio.get_running_loop().create_server(_TcpEcho, "127.0.0.1", 0)
    _publish(port_file, server.sockets[0].getsockname()[1], scheme="tcp")
    await asyncio.Future()


_SERVERS = {"websockets": _serve_websockets, "picows": _serve_picows, "tcp": _serve_tcp}


def main() -> None:
    """Serve until terminated."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=sorted(_SERVERS), default="websockets")
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()
    runtime.run(_SERVERS[args.kind](args.port_file))


if __name__ == "__main__":
    main()

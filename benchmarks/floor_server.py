"""``python -m benchmarks.floor_server --port-file F``: the transport floor.

A raw ``websockets`` server that sends every message straight back: what one WebSocket
round trip costs on this machine with no framework at all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from websockets.asyncio.server import ServerConnection, serve

from corral import runtime


async def _echo(ws: ServerConnection) -> None:
    async for message in ws:
        await ws.send(message)


async def _serve(port_file: Path) -> None:
    async with serve(_echo, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(f"ws://127.0.0.1:{port}")
        os.replace(tmp, port_file)
        await asyncio.Future()


def main() -> None:
    """Serve until terminated."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()
    runtime.run(_serve(args.port_file))


if __name__ == "__main__":
    main()

"""A raw ``corral/1`` peer for protocol-level tests: sends any frame, reads replies."""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from corral.protocol.codecs import get_codec


class RawPeer:
    """A WebSocket speaking corral/1 by hand (no client-side checks)."""

    def __init__(self, ws: ClientConnection, codec: str) -> None:
        self.ws = ws
        self.codec = get_codec(codec)
        self.next_id = 1

    @classmethod
    async def open(cls, url: str, codec: str = "msgpack", hello: bool = True) -> RawPeer:
        ws = await connect(
            url.replace("http://", "ws://") + "/ws", subprotocols=[get_codec(codec).subprotocol]
        )  # type: ignore[list-item]
        peer = cls(ws, codec)
        if hello:
            reply = await peer.request({"type": "hello", "protocol": "corral/1"})
            assert reply["type"] == "welcome", reply
        return peer

    async def send_frame(self, frame: bytes | str) -> None:
        await self.ws.send(frame)

    async def send(self, message: dict[str, Any]) -> int:
        if "id" not in message:
            message["id"] = self.next_id
            self.next_id += 1
        await self.ws.send(self.codec.encode(message))
        return int(message["id"])

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        frame = await asyncio.wait_for(self.ws.recv(), timeout)
        return self.codec.decode(frame)

    async def request(self, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        rid = await self.send(message)
        while True:
            reply = await self.recv(timeout)
            if reply.get("id") == rid:
                return reply

    async def open_session(self) -> str:
        reply = await self.request({"type": "open"})
        assert reply["type"] == "opened", reply
        return str(reply["session"])

    async def close(self) -> None:
        await self.ws.close()

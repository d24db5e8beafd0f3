"""Abandoned half-open connections give back every slot; capacity returns to full.

Clients open a session each through the proxy, which then stalls every link: both
sockets stay open but nothing passes, as when a peer vanishes without a FIN. The server's
keepalive must notice each dead connection, the reaper must close its session after the
resume window, and the server must then accept a full load of new sessions again.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from tests.faults.conftest import local_server
from tests.support.faultproxy import FaultProxy
from tests.support.servers import port_of
from websockets.asyncio.client import ClientConnection, connect

from corral.client.connection import ws_url
from corral.protocol.codecs import MsgpackCodec

CODEC = MsgpackCodec()


async def open_session(url: str) -> ClientConnection:
    """A raw connection holding one session (no keepalive, no reconnect: abandonable)."""
    ws = await connect(ws_url(url), subprotocols=[CODEC.subprotocol], ping_interval=None)  # type: ignore[list-item]
    await ws.send(CODEC.encode({"type": "hello", "id": 1, "protocol": "corral/1"}))
    await ws.send(CODEC.encode({"type": "open", "id": 2}))
    replies = [CODEC.decode(await ws.recv()) for _ in range(2)]
    assert [r["type"] for r in replies] == ["welcome", "opened"], replies
    return ws


async def open_many(url: str, count: int) -> list[ClientConnection]:
    gate = asyncio.Semaphore(32)

    async def one() -> ClientConnection:
        async with gate:
            return await open_session(url)

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def ready(http: httpx.AsyncClient, url: str) -> dict:
    return (await http.get(f"{url}/ready")).json()


async def test_abandoned_half_open_connections_free_every_slot(scale, figures):
    count = scale.half_open
    server = local_server(
        "tests.faults.envs:RecordingEnv",
        "--max-sessions",
        str(count),
        "--max-connections-per-client",
        "0",
        "--max-sessions-per-client",  # one process fills the server: no share kept back
        "0",
        # A pong may be late while this one process opens a thousand connections through
        # the proxy on a loaded machine: the timeout leaves room for that, not just for an
        # idle loopback (the native transport waits as long idle before a ping, so the
        # slots come back within twice the timeout).
        "--ping-interval",
        "2",
        "--ping-timeout",
        "8",
        "--resume-window",
        "0.5",
    )
    await server.start()
    proxy = await FaultProxy(port_of(server.url)).start()
    abandoned: list[ClientConnection] = []
    fresh: list[ClientConnection] = []
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http, asyncio.timeout(240):
            abandoned = await open_many(proxy.url, count)
            full = await ready(http, server.url)
            assert full["active_sessions"] == count and not full["ready"]
            assert proxy.stall_all() == count
            stalled_at = time.monotonic()
            while (await ready(http, server.url))["active_sessions"] > 0:
                await asyncio.sleep(0.1)
            reclaimed = time.monotonic() - stalled_at
            assert (await ready(http, server.url))["ready"]
            # Capacity is back to full: as many new sessions as the server holds.
            fresh = await open_many(server.url, count)
            assert (await ready(http, server.url))["active_sessions"] == count
        figures["half_open_connections"] = count
        figures["slots_reclaimed"] = count
        figures["seconds_to_reclaim"] = round(reclaimed, 2)
        figures["sessions_reopened"] = len(fresh)
    finally:
        for ws in fresh:
            await ws.close()
        for ws in abandoned:
            ws.transport.abort()
        await proxy.close()
        await server.stop()

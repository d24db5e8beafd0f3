"""Issue 30.4: one client cannot take every slot, whichever way it opens sessions.

The rule (``ServerConfig.max_sessions_per_client``, docs/reliability.md): a client address
holds at most all of ``max_sessions`` but an eighth by default, counted across corral/1
``open`` and ``restore``, OpenEnv's WebSocket, HTTP ``POST /sessions`` and
``openenv/session/create``; the rest stay for other clients. Through real servers on
127.0.0.1 (both transports); another client is another loopback address (127.0.0.2).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.support.rawws import RawSocket
from tests.support.servers import ThreadServer, port_of, running

from corral.envs.echo import EchoEnv
from corral.errors import ErrorCode
from corral.server.config import ServerConfig, client_share

SLOTS = 16
SHARE = 14  # 16 - 16 // 8


def test_the_default_share() -> None:
    assert [client_share(n) for n in (1, 2, 7, 8, 16, 64, 1024)] == [1, 2, 7, 7, 14, 56, 896]
    config = ServerConfig(max_sessions=SLOTS)
    assert config.client_sessions == SHARE and config.limits()["max_sessions_per_client"] == SHARE
    assert ServerConfig(max_sessions_per_client=None).client_sessions is None
    assert ServerConfig(max_sessions=4, max_sessions_per_client=2).client_sessions == 2
    with pytest.raises(ValueError, match="max_sessions_per_client"):
        ServerConfig(max_sessions_per_client=0)


@pytest.fixture(scope="module", params=["native", "asgi"])
def server(request: pytest.FixtureRequest) -> Iterator[ThreadServer]:
    with running(EchoEnv, max_sessions=SLOTS, transport=request.param) as srv:
        yield srv


class Corral:
    """A raw corral/1 connection from ``source``."""

    def __init__(self, server: ThreadServer, source: str = "") -> None:
        self.raw = RawSocket(port_of(server.url), source=source)
        assert self.raw.upgrade()[0] == 101
        assert self.raw.hello()["type"] == "welcome"
        self.ids = iter(range(1, 10_000))

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.raw.send_message({**message, "id": next(self.ids)})
        return self.raw.read_message()

    def open(self) -> dict[str, Any]:
        return self.request({"type": "open"})


def openenv_reset(server: ThreadServer, source: str = "") -> tuple[RawSocket, dict[str, Any]]:
    """An OpenEnv WebSocket (no subprotocol) holding a session; its first reply."""
    raw = RawSocket(port_of(server.url), source=source)
    assert raw.upgrade(subprotocol=None)[0] == 101
    raw.send_frame(json.dumps({"type": "reset", "data": {}}).encode(), opcode=1)
    while True:
        opcode, payload = raw.read_frame()
        if opcode == 1:
            return raw, json.loads(payload)
        assert opcode != 8, "closed before a reply"


def http(server: ThreadServer, source: str = "") -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=source) if source else None
    return httpx.Client(base_url=server.url, transport=transport, timeout=30)


def test_one_client_holds_its_share_across_every_way_in(server: ThreadServer) -> None:
    held: list[Any] = []
    mine = Corral(server)
    web = http(server)
    try:
        for _ in range(4):  # corral/1 sessions
            assert mine.open()["type"] == "opened"
        first = mine.open()["session"]  # the fifth: snapshotted, restored as the sixth
        assert mine.request({"type": "reset", "session": first})["type"] == "result"
        snapshot = mine.request({"type": "snapshot", "session": first})
        assert snapshot["type"] == "snapshot", snapshot
        for _ in range(3):  # OpenEnv WebSocket sessions
            raw, reply = openenv_reset(server)
            held.append(raw)
            assert reply["type"] == "observation", reply
        mine_http = []
        for _ in range(4):  # HTTP sessions
            opened = web.post("/sessions")
            assert opened.status_code == 201
            mine_http.append(opened.json()["session_id"])
        rpc = {"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}}
        reply = web.post("/mcp", json={**rpc, "id": 1}).json()  # MCP's session/create
        assert "result" in reply, reply
        restored = mine.request({"type": "restore", "snapshot": snapshot["snapshot"]})
        assert restored["type"] == "restored", restored  # a restore opens a session too
        # 14 held: every way in is refused now, each in its protocol's words.
        refused = mine.open()
        assert refused["code"] == ErrorCode.TOO_MANY_SESSIONS, refused
        assert refused["details"]["scope"] == "client" and refused["details"]["limit"] == SHARE
        again = mine.request({"type": "restore", "snapshot": snapshot["snapshot"]})
        assert again["code"] == ErrorCode.TOO_MANY_SESSIONS, again
        over = web.post("/sessions")
        assert over.status_code == 503 and over.json()["code"] == ErrorCode.TOO_MANY_SESSIONS
        raw, reply = openenv_reset(server)
        held.append(raw)
        assert reply["data"]["code"] == "CAPACITY_REACHED", reply
        assert reply["data"]["max_sessions"] == SHARE
        # Another client still gets the slots kept for others, and then the server is full.
        other = Corral(server, source="127.0.0.2")
        held.append(other.raw)
        assert other.open()["type"] == "opened"
        with http(server, "127.0.0.2") as web2:
            assert web2.post("/sessions").status_code == 201
        full = other.open()
        assert full["code"] == ErrorCode.CAPACITY_REACHED, full
        # A session given back frees a slot that is the client's to take again.
        assert web.delete(f"/sessions/{mine_http[0]}").status_code == 200
        assert mine.open()["type"] == "opened"
        assert mine.open()["code"] == ErrorCode.CAPACITY_REACHED  # full: whoever asks
    finally:
        for raw in held:
            raw.close()
        mine.raw.close()
        web.close()


class SlowCloseEnv(EchoEnv):
    """An echo env whose ``close`` takes a while (in the server's threads)."""

    def close(self) -> None:
        time.sleep(0.05)


def test_a_clean_disconnect_gives_the_share_back_at_once() -> None:
    """A client that closes its connection cleanly can open its whole share again right
    away, while the old sessions' environments are still closing: they left the
    registry, and their client's count, when the connection closed. (Retired one by one
    as each environment closed, a pool of 1,024 closed and opened again was refused.)"""
    with running(SlowCloseEnv, max_sessions=SLOTS) as server:
        first = Corral(server)
        for _ in range(SHARE):
            assert first.open()["type"] == "opened"
        first.raw.send_frame(b"\x03\xe8", opcode=8)  # a clean close (1000)
        while first.raw.read_frame()[0] != 8:
            pass
        first.raw.close()
        second = Corral(server)
        try:
            # 14 environments closing one after the other take 0.7 s: these opens come
            # while most of them still are.
            replies = [second.open() for _ in range(SHARE)]
            assert [r["type"] for r in replies] == ["opened"] * SHARE, replies[-1]
        finally:
            second.raw.close()

"""``EnvService.drain`` through real servers on 127.0.0.1: the notice, what a draining
server refuses and keeps serving, the early end, the deadline, OpenEnv's normal close,
and the figures in ``/ready`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from tests.support.raw import RawPeer
from tests.support.servers import ThreadServer, running
from tests.support.snapshot_envs import TallyEnv
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from corral.protocol.codecs import get_codec
from corral.protocol.drain import DrainFigures
from corral.protocol.handshake import RESUME_HEADER

KEY = b"fleet key for the drain tests, 32"


def start_drain(server: ThreadServer, deadline_s: float) -> asyncio.Future[DrainFigures]:
    """Start ``server``'s drain on its own loop; the future ends with the drain."""
    assert server.loop is not None
    return asyncio.wrap_future(
        asyncio.run_coroutine_threadsafe(server.service.drain(deadline_s, "test"), server.loop)
    )


async def notice_reader(
    server: ThreadServer, codec: str = "msgpack", resume: str | None = None
) -> RawPeer:
    """A raw peer whose hello asks for notices (``resume``: a session it comes back for,
    in the ``corral-resume`` header)."""
    ws = await connect(
        server.url.replace("http://", "ws://") + "/ws",
        subprotocols=[get_codec(codec).subprotocol],  # type: ignore[list-item]
        additional_headers={RESUME_HEADER: resume} if resume else {},
    )
    peer = RawPeer(ws, codec)
    welcome = await peer.request({"type": "hello", "protocol": "corral/1", "notices": True})
    assert welcome["type"] == "welcome", welcome
    return peer


async def reset_session(peer: RawPeer) -> str:
    sid = await peer.open_session()
    reply = await peer.request({"type": "reset", "session": sid, "seed": 3})
    assert reply["type"] == "result", reply
    return sid


def ready(server: ThreadServer) -> httpx.Response:
    return httpx.get(f"{server.url}/ready", timeout=10, trust_env=False)


def metric(server: ThreadServer, name: str, labels: str = "") -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10, trust_env=False).text
    line = f"{name}{{{labels}}}" if labels else name
    for row in text.splitlines():
        if row.startswith(line + " "):
            return float(row.split()[-1])
    raise AssertionError(f"{line} not in /metrics:\n{text}")


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_a_drain_tells_notice_readers_and_moves_sessions_before_the_deadline(
    codec: str,
) -> None:
    with (
        running(TallyEnv, server_id="old", fleet_key=KEY) as old,
        running(TallyEnv, server_id="new", fleet_key=KEY) as new,
    ):
        reader, plain = await notice_reader(old, codec), await RawPeer.open(old.url, codec)
        mover = await RawPeer.open(new.url, codec)
        try:
            moving, staying = await reset_session(reader), await reset_session(plain)

            def step() -> dict[str, Any]:
                return {"type": "step", "session": moving, "action": {"add": 2}}

            assert (await reader.request(step()))["type"] == "result"
            drained = start_drain(old, 60.0)
            notice = await reader.recv()
            assert notice["type"] == "going_away" and notice["id"] is None, notice
            assert notice["server"] == "old" and notice["reason"] == "test"
            assert 0 < notice["deadline_s"] <= 60
            # A client that did not ask for notices gets none: its next frame is its reply.
            rid = await plain.send({"type": "state", "session": staying})
            reply = await plain.recv()
            assert (reply["type"], reply["id"]) == ("state", rid)
            # No new session here: open and restore are NOT_READY; /ready says so.
            refused = await plain.request({"type": "open"})
            assert refused["code"] == "NOT_READY" and refused["details"]["draining"] is True
            state = ready(old)
            assert state.status_code == 503
            assert state.json()["draining"]["sessions"] == 2
            assert state.json()["reason"] == "draining: test"
            # A new client is refused at the upgrade; one coming back for its session is
            # let in and told at once, after its welcome.
            with pytest.raises(InvalidStatus) as refused_upgrade:
                await notice_reader(old, codec)
            assert refused_upgrade.value.response.status_code == 503
            late = await notice_reader(old, codec, resume=moving)
            assert (await late.recv())["type"] == "going_away"
            await late.close()
            # The held sessions are served: a step, and the snapshot that moves one.
            assert (await reader.request(step()))["type"] == "result"
            snapshot = await reader.request({"type": "snapshot", "session": moving})
            assert snapshot["type"] == "snapshot", snapshot
            again = await plain.request({"type": "restore", "snapshot": snapshot["snapshot"]})
            assert again["code"] == "NOT_READY"
            restored = await mover.request({"type": "restore", "snapshot": snapshot["snapshot"]})
            assert restored["type"] == "restored", restored
            assert restored["observation"]["count"] == 4
            assert (await reader.request({"type": "close", "session": moving}))["type"] == "closed"
            assert not drained.done()
            assert metric(old, "corral_drain_sessions_total", 'event="moved_away"') == 1
            # The last session leaves: the drain ends long before its deadline.
            assert (await plain.request({"type": "close", "session": staying}))["type"] == "closed"
            figures = await asyncio.wait_for(drained, 30)
            assert figures == DrainFigures(at_start=2, moved_away=2, lost=0)
            assert metric(old, "corral_snapshots_total") == 1
            assert metric(new, "corral_sessions_total", 'event="restored"') == 1
            assert metric(old, "corral_draining") == 1
            assert metric(new, "corral_draining") == 0
        finally:
            await asyncio.gather(reader.close(), plain.close(), mover.close())


@pytest.mark.parametrize("transport", ["native", "asgi"])
async def test_at_the_deadline_what_is_left_is_lost_with_the_reason(transport: str) -> None:
    with running(TallyEnv, server_id="old", transport=transport) as old:
        peer = await notice_reader(old)
        try:
            idle, busy = await reset_session(peer), await reset_session(peer)
            slow = {"type": "step", "session": busy, "action": {"add": 1, "snapshot_sleep": 5}}
            assert (await peer.request(slow))["type"] == "result"
            # A snapshot that takes 5 s is still running at the deadline.
            rid = await peer.send({"type": "snapshot", "session": busy})
            drained = start_drain(old, 0.5)
            assert (await peer.recv())["type"] == "going_away"
            answer = await peer.recv()
            assert answer["id"] == rid and answer["code"] == "SESSION_LOST", answer
            assert answer["details"]["reason"] == "drained"
            figures = await asyncio.wait_for(drained, 30)
            assert figures == DrainFigures(at_start=2, moved_away=0, lost=2)
            lost = await peer.request({"type": "state", "session": idle})
            assert lost["code"] == "SESSION_LOST" and lost["details"]["reason"] == "drained"
            assert metric(old, "corral_drain_sessions_total", 'event="lost"') == 2
        finally:
            await peer.close()


async def test_a_second_drain_waits_for_the_first_whose_deadline_stands() -> None:
    with running(TallyEnv) as server:
        peer = await RawPeer.open(server.url)
        try:
            sid = await reset_session(peer)
            first, second = start_drain(server, 60.0), start_drain(server, 0.1)
            assert (await peer.request({"type": "state", "session": sid}))["type"] == "state"
            assert not first.done() and not second.done()
            await peer.request({"type": "close", "session": sid})
            assert await asyncio.wait_for(first, 30) == await asyncio.wait_for(second, 30)
        finally:
            await peer.close()


async def test_openenv_clients_see_a_normal_close_at_the_deadline() -> None:
    with running(TallyEnv) as server:
        url = server.url.replace("http://", "ws://") + "/ws"
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            first: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert first["type"] == "observation", first
            drained = start_drain(server, 0.3)
            # No notice: OpenEnv knows none. Its steps work until the deadline...
            await ws.send(json.dumps({"type": "step", "data": {"add": 1}}))
            step: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert step["type"] == "observation", step
            figures = await asyncio.wait_for(drained, 30)
            # ...then the socket closes normally.
            await asyncio.wait_for(ws.wait_closed(), 10)
            assert ws.close_code == 1000
            assert figures.lost == 1


async def test_mcp_sockets_see_a_normal_close_at_the_deadline() -> None:
    with running(TallyEnv) as server:
        url = server.url.replace("http://", "ws://") + "/mcp"
        async with connect(url) as ws:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            # (the env has no tools: the answer is JSON-RPC's "method not found", an answer)
            listed: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert listed["id"] == 1 and listed["error"]["code"] == -32601, listed
            drained = start_drain(server, 0.3)
            # The raw JSON-RPC channel works on until the deadline...
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
            again: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert again["id"] == 2 and again["error"]["code"] == -32601, again
            figures = await asyncio.wait_for(drained, 30)
            # ...then closes normally, its session counted with the lost.
            await asyncio.wait_for(ws.wait_closed(), 10)
            assert ws.close_code == 1000
            assert figures.lost == 1

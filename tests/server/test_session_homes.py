"""Every route that names a session, asked on the wrong server of a fleet and by the wrong
client: ``SESSION_ELSEWHERE`` names the holder only for an id a server of the same fleet
minted; forged, foreign and other clients' ids stay ``UNKNOWN_SESSION`` (real servers on
127.0.0.1, both codecs for ``corral/1``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.support.raw import RawPeer
from tests.support.servers import ThreadServer, running
from tests.support.snapshot_envs import TallyEnv
from websockets.asyncio.client import connect

from corral.protocol.identity import SEPARATOR, SessionIds, server_of
from corral.server.openenv.links import SESSION_HEADER

KEY = b"fleet key for these tests, 32 b+"
CODECS = ["msgpack", "json"]


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[ThreadServer, ThreadServer]]:
    with (
        running(TallyEnv, server_id="srv-a", fleet_key=KEY, max_connections_per_client=None) as a,
        running(TallyEnv, server_id="srv-b", fleet_key=KEY, max_connections_per_client=None) as b,
    ):
        yield a, b


def forged(sid: str) -> str:
    """``sid`` with its tag replaced: it still names its server, unverifiably."""
    body, _, tag = sid.rpartition(SEPARATOR)
    return f"{body}{SEPARATOR}{'f' * len(tag)}"


def ws_requests(sid: str, token: str) -> dict[str, dict[str, Any]]:
    """One request of every ``corral/1`` route that names a session."""
    return {
        "attach": {"type": "attach", "session": sid, "token": token},
        "reset": {"type": "reset", "session": sid, "seed": 1},
        "step": {"type": "step", "session": sid, "action": {"add": 1}},
        "state": {"type": "state", "session": sid},
        "snapshot": {"type": "snapshot", "session": sid},
        "close": {"type": "close", "session": sid},
        "step_batch": {"type": "step_batch", "items": [{"session": sid, "action": {"add": 1}}]},
        "reset_batch": {"type": "reset_batch", "items": [{"session": sid, "seed": 1}]},
    }


def error_of(reply: dict[str, Any]) -> dict[str, Any]:
    """The error of a reply, or of a batch reply's one item."""
    if reply["type"] == "batch":
        (item,) = reply["results"]
        return {"session": item["session"], **item["error"]}
    assert reply["type"] == "error", reply
    return reply


async def open_on(server: ThreadServer, codec: str = "msgpack") -> tuple[RawPeer, str, str]:
    peer = await RawPeer.open(server.url, codec)
    opened = await peer.request({"type": "open"})
    assert opened["type"] == "opened", opened
    return peer, str(opened["session"]), str(opened["token"])


async def test_session_ids_name_their_server_and_verify(
    fleet: tuple[ThreadServer, ThreadServer],
) -> None:
    a, _ = fleet
    peer, sid, _ = await open_on(a)
    try:
        assert server_of(sid) == "srv-a"
        # Tagged with a key derived from the fleet key, not the key itself.
        assert SessionIds("srv-a", KEY).locate(sid).verified is False
        assert a.service.manager.registry.ids.locate(sid).verified
    finally:
        await peer.close()


@pytest.mark.parametrize("codec", CODECS)
async def test_every_ws_route_on_the_wrong_server_names_the_holder(
    fleet: tuple[ThreadServer, ThreadServer], codec: str
) -> None:
    a, b = fleet
    holder, sid, token = await open_on(a, codec)
    asker = await RawPeer.open(b.url, codec)
    before = b.service.manager.registry.elsewhere
    try:
        for route, request in ws_requests(sid, token).items():
            error = error_of(await asker.request(request))
            assert error["code"] == "SESSION_ELSEWHERE", (route, error)
            assert error["details"]["server"] == "srv-a", route
            assert error["session"] == sid, route
        assert b.service.manager.registry.elsewhere == before + len(ws_requests(sid, token))
        metrics = httpx.get(f"{b.url}/metrics", timeout=10, trust_env=False).text
        assert f'corral_sessions_total{{event="elsewhere"}} {float(before + 8)}' in metrics
        # Nothing moved: the session still answers its own client on its own server.
        assert (await holder.request({"type": "reset", "session": sid}))["type"] == "result"
    finally:
        await asyncio.gather(holder.close(), asker.close())


@pytest.mark.parametrize("codec", CODECS)
async def test_another_clients_forged_and_foreign_ids_stay_unknown_on_every_ws_route(
    fleet: tuple[ThreadServer, ThreadServer], codec: str
) -> None:
    a, b = fleet
    holder, sid, token = await open_on(a, codec)
    other = await RawPeer.open(a.url, codec)
    asker = await RawPeer.open(b.url, codec)
    stranger = SessionIds("srv-a", b"another fleet's key, 32 bytes ok").mint()
    try:
        cases = [
            (other, sid, "a live session of another connection"),
            (asker, forged(sid), "a forged tag naming a peer"),
            (asker, stranger, "another fleet's id"),
            (other, forged(sid), "a forged id of this very server"),
        ]
        for peer, target, why in cases:
            for route, request in ws_requests(target, "wrong token").items():
                error = error_of(await peer.request(request))
                expected = "UNKNOWN_SESSION"
                if route == "attach" and target == sid:
                    expected = "UNAUTHORIZED"  # the token guards a live session
                assert error["code"] == expected, (why, route, error)
                assert "server" not in error.get("details", {}), (why, route)
        # The holder's session was never touched.
        assert (await holder.request({"type": "state", "session": sid}))["type"] == "state"
        attached = await other.request({"type": "attach", "session": sid, "token": token})
        assert attached["type"] == "attached"  # with its token, it moves: as before
    finally:
        await asyncio.gather(holder.close(), other.close(), asker.close())


async def http_session(server: ThreadServer) -> str:
    async with httpx.AsyncClient(base_url=server.url, trust_env=False) as http:
        reply = await http.post("/sessions")
        assert reply.status_code == 201, reply.text
        return str(reply.json()["session_id"])


async def http_routes(server: ThreadServer, sid: str) -> dict[str, httpx.Response]:
    """Every OpenEnv/HTTP route that names a session, asked of ``server`` about ``sid``."""
    headers = {SESSION_HEADER: sid}
    close_rpc = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "openenv/session/close",
        "params": {"session_id": sid},
    }
    async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=10) as http:
        return {
            "reset": await http.post("/reset", json={}, headers=headers),
            "step": await http.post("/step", json={"action": {"add": 1}}, headers=headers),
            "state": await http.get("/state", headers=headers),
            "delete": await http.delete(f"/sessions/{sid}"),
            "mcp close": await http.post("/mcp", json=close_rpc),
        }


async def ws_attach_frame(server: ThreadServer, sid: str) -> dict[str, Any]:
    """OpenEnv 0.10's ``/ws?session_id=``: the one frame a refused attach gets."""
    url = server.url.replace("http://", "ws://") + f"/ws?session_id={sid}"
    async with connect(url) as ws:
        return dict(json.loads(await asyncio.wait_for(ws.recv(), 10)))


async def test_every_http_route_on_the_wrong_server_names_the_holder(
    fleet: tuple[ThreadServer, ThreadServer],
) -> None:
    a, b = fleet
    sid = await http_session(a)
    answers = await http_routes(b, sid)
    for route in ("reset", "step", "state", "delete"):
        reply = answers[route]
        assert reply.status_code == 421, (route, reply.text)
        body = reply.json()
        assert body["code"] == "SESSION_ELSEWHERE" and body["details"]["server"] == "srv-a"
    assert "srv-a" in answers["mcp close"].json()["error"]["message"]
    frame = await ws_attach_frame(b, sid)
    assert frame["type"] == "error" and "srv-a" in json.dumps(frame)
    # And on its own server it is still there.
    async with httpx.AsyncClient(base_url=a.url, trust_env=False) as http:
        assert (await http.post("/reset", json={}, headers={SESSION_HEADER: sid})).is_success


async def test_http_routes_never_reach_a_corral_session_or_a_forged_one(
    fleet: tuple[ThreadServer, ThreadServer],
) -> None:
    a, b = fleet
    holder, sid, _ = await open_on(a)
    try:
        for server, target in ((a, sid), (b, forged(sid)), (a, forged(await http_session(a)))):
            answers = await http_routes(server, target)
            for route in ("reset", "step", "state", "delete"):
                reply = answers[route]
                assert reply.status_code == 404, (route, reply.text)
                assert reply.json()["code"] == "UNKNOWN_SESSION"
                assert "server" not in reply.json()["details"]
            assert "lives on" not in answers["mcp close"].json()["error"]["message"]
            frame = await ws_attach_frame(server, target)
            assert frame["type"] == "error" and "lives on" not in json.dumps(frame)
        assert (await holder.request({"type": "state", "session": sid}))["type"] == "state"
    finally:
        await holder.close()


async def test_without_a_fleet_key_a_peers_id_is_only_unknown() -> None:
    with running(TallyEnv, server_id="solo-a") as a, running(TallyEnv, server_id="solo-b") as b:
        holder, sid, token = await open_on(a)
        asker = await RawPeer.open(b.url)
        try:
            assert server_of(sid) == "solo-a"
            for route, request in ws_requests(sid, token).items():
                assert error_of(await asker.request(request))["code"] == "UNKNOWN_SESSION", route
            assert b.service.manager.registry.elsewhere == 0
        finally:
            await asyncio.gather(holder.close(), asker.close())

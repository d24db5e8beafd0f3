"""Real ``corral serve`` processes sharing a fleet key, alone and behind real nginx and
HAProxy: a session asked on the wrong server is ``SESSION_ELSEWHERE`` naming its holder,
and following that answer through the front door finds it; SIGTERM drains a server while
its client moves the session to another (snapshot, restore, close) and the drained
server exits at once; what stays past the deadline is lost with the reason."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.frontdoor import FrontDoor, Kind, ServerProcesses
from tests.support.raw import RawPeer
from websockets.asyncio.client import connect

from corral.protocol.codecs import get_codec
from corral.providers.frontdoor import ROUTE_HEADER
from corral.server.serve import DRAIN_ENV

pytestmark = pytest.mark.xdist_group("frontdoor")

TARGET = "tests.support.snapshot_envs:TallyEnv"
KEY = "a fleet key the servers of this test share"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.key"
    path.write_text(KEY)
    return path


@pytest.fixture
def fleet(tmp_path: Path, key_file: Path) -> Iterator[ServerProcesses]:
    with ServerProcesses(TARGET, 2, tmp_path, ["--fleet-key-file", str(key_file)]) as servers:
        yield servers


async def peer_at(url: str, server: str | None = None, notices: bool = False) -> RawPeer:
    """A raw ``corral/1`` peer at ``url`` (through a front door: to ``server``)."""
    codec = get_codec("msgpack")
    headers = {ROUTE_HEADER: server} if server else {}
    ws = await connect(
        url.replace("http://", "ws://") + "/ws",
        subprotocols=[codec.subprotocol],  # type: ignore[list-item]
        additional_headers=headers,
        open_timeout=30,
    )
    peer = RawPeer(ws, "msgpack")
    hello = {"type": "hello", "protocol": "corral/1", "notices": notices}
    welcome = await peer.request(hello, timeout=30)
    assert welcome["type"] == "welcome", welcome
    if server:
        assert welcome["server"]["id"] == server
    return peer


async def open_reset(peer: RawPeer) -> tuple[str, str]:
    opened = await peer.request({"type": "open"}, timeout=30)
    assert opened["type"] == "opened", opened
    sid = str(opened["session"])
    assert (await peer.request({"type": "reset", "session": sid, "seed": 1}))["type"] == "result"
    return sid, str(opened["token"])


async def test_a_session_asked_on_another_server_names_its_holder(
    fleet: ServerProcesses,
) -> None:
    s0, s1 = fleet[0], fleet[1]
    holder, asker = await peer_at(s0.url), await peer_at(s1.url)
    try:
        sid, token = await open_reset(holder)
        for request in (
            {"type": "attach", "session": sid, "token": token},
            {"type": "step", "session": sid, "action": {"add": 1}},
            {"type": "snapshot", "session": sid},
        ):
            error = await asker.request(request)
            assert error["code"] == "SESSION_ELSEWHERE", error
            assert error["details"]["server"] == "s0"
        assert (await holder.request({"type": "state", "session": sid}))["type"] == "state"
    finally:
        await asyncio.gather(holder.close(), asker.close())


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
async def test_through_the_front_door_the_answer_is_followed_to_the_holder(
    fleet: ServerProcesses, kind: Kind, tmp_path: Path
) -> None:
    with FrontDoor(kind, fleet.backends(), tmp_path) as door:
        holder = await peer_at(door.url, "s0")
        sid, token = await open_reset(holder)
        holder.ws.transport.abort()  # a cut: the session waits for its client on s0
        wrong = await peer_at(door.url, "s1")
        try:
            error = await wrong.request({"type": "attach", "session": sid, "token": token})
            assert error["code"] == "SESSION_ELSEWHERE" and error["details"]["server"] == "s0"
        finally:
            await wrong.close()
        right = await peer_at(door.url, str(error["details"]["server"]))
        try:
            attached = await right.request({"type": "attach", "session": sid, "token": token})
            assert attached["type"] == "attached", attached
            right.next_id = 100  # request ids go on from the session's last, as a client's do
            step = {"type": "step", "session": sid, "action": {"add": 5}}
            result = await right.request(step)
            assert result["type"] == "result" and result["observation"]["count"] == 5
        finally:
            await right.close()


async def test_sigterm_drains_while_the_client_moves_its_session(
    tmp_path: Path, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DRAIN_ENV, "120")
    with ServerProcesses(TARGET, 2, tmp_path, ["--fleet-key-file", str(key_file)]) as fleet:
        old, new = fleet[0], fleet[1]
        source, target = await peer_at(old.url, notices=True), await peer_at(new.url)
        try:
            sid, _ = await open_reset(source)
            step = {"type": "step", "session": sid, "action": {"add": 3}}
            assert (await source.request(step))["type"] == "result"
            old.send(signal.SIGTERM)
            notice = await source.recv(timeout=30)
            assert notice["type"] == "going_away" and notice["server"] == "s0", notice
            assert 60 < notice["deadline_s"] <= 120
            refused = await source.request({"type": "open"})
            assert refused["code"] == "NOT_READY"
            snapshot = await source.request({"type": "snapshot", "session": sid})
            assert snapshot["type"] == "snapshot", snapshot
            restored = await target.request({"type": "restore", "snapshot": snapshot["snapshot"]})
            assert restored["type"] == "restored" and restored["observation"]["count"] == 3
            assert (await source.request({"type": "close", "session": sid}))["type"] == "closed"
            # Nothing left on the old server: it exits long before its 120 s deadline.
            assert old.wait_exit(60) == -signal.SIGTERM
            moved = {"type": "step", "session": restored["session"], "action": {"add": 1}}
            assert (await target.request(moved))["observation"]["count"] == 4
        finally:
            await asyncio.gather(source.close(), target.close(), return_exceptions=True)


async def test_what_stays_past_the_deadline_is_lost_with_the_reason(
    tmp_path: Path, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DRAIN_ENV, "1")
    with ServerProcesses(TARGET, 1, tmp_path, ["--fleet-key-file", str(key_file)]) as fleet:
        server = fleet[0]
        peer = await peer_at(server.url)  # reads no notices: it just stays
        try:
            sid, _ = await open_reset(peer)
            slow = {"type": "step", "session": sid, "action": {"add": 1, "snapshot_sleep": 5}}
            assert (await peer.request(slow))["type"] == "result"
            running = await peer.send({"type": "snapshot", "session": sid})
            server.send(signal.SIGTERM)
            answer = await peer.recv(timeout=30)
            assert answer["id"] == running and answer["code"] == "SESSION_LOST", answer
            assert answer["details"]["reason"] == "drained"
            assert server.wait_exit(60) == -signal.SIGTERM
        finally:
            await peer.close()

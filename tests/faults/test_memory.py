"""Memory stays bounded under hostile peers (issue 11.4, 11.5, 30.1), on both transports.

Each probe drives a real ``corral serve`` process and reads its RSS from /proc:

* 40 frames of 16 MiB + 100 B, each refused with ``FRAME_TOO_LARGE``: every refused frame
  is freed at once (no reference cycle waits for the collector);
* the same refusals sent permessage-deflate compressed (~16 KiB each on the wire);
* a client that sends requests and never reads its replies: the server stops reading
  from it, and its RSS stays flat while another client keeps stepping;
* 48 actions of 4 MiB refused with ``INVALID_ACTION`` (a wrong type, an unknown field;
  single steps and batch items), on each codec: none is kept (not by the refusal's
  traceback, not by the reply cache), so RSS ends where it started, within a few MiB
  of allocator slack. Before 30.1 every one stayed: +192 MiB here;
* 48 restores of a 4 MiB snapshot refused with ``BAD_SNAPSHOT`` (a state that fails the
  snapshot model, or one altered after it was taken): none is kept either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import orjson
import pytest
from tests.faults.conftest import local_server, rss_bytes, started
from tests.support.figures import Figures
from tests.support.rawws import RawSocket, compress
from tests.support.servers import port_of

from corral.client import AsyncEnvClient
from corral.client.local_server import LocalServer
from corral.envs.echo import EchoAction, EchoEnv
from corral.errors import ErrorCode
from corral.protocol.codecs import PROTOCOL

MiB = 1024 * 1024
FRAME = 16 * MiB + 100
ROUNDS = 40
GROWTH = 160 * MiB
"""RSS a probe may leave behind: the native link's read buffer grows to the largest frame
it read (picows keeps it while the connection lives), plus allocator slack; a leak of the
refused frames would be 40 x 16 MiB and more."""


@pytest.fixture(scope="module", params=["native", "asgi"])
def server(request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    srv = local_server("corral.envs.echo:EchoEnv", "--port", "0", "--transport", request.param)
    started(srv)
    try:
        yield srv
    finally:
        srv.stop_now()


def rss(server: LocalServer) -> int:
    assert server.process is not None
    return rss_bytes(server.process.pid)


def connected(server: LocalServer, deflate: bool = False) -> RawSocket:
    assert server.url is not None
    raw = RawSocket(port_of(server.url), timeout=120)
    headers = {"Sec-WebSocket-Extensions": "permessage-deflate"} if deflate else {}
    status, answer, _ = raw.upgrade(headers=headers)
    assert status == 101
    if deflate:
        assert "permessage-deflate" in answer.get("sec-websocket-extensions", "")
    assert raw.hello()["type"] == "welcome"
    return raw


def big_step(request_id: int) -> dict[str, object]:
    return {"type": "step", "id": request_id, "session": "none", "action": {"message": "a" * FRAME}}


def refusals(raw: RawSocket, deflate: bool) -> None:
    payload = msgpack.packb(big_step(0))
    for i in range(ROUNDS):
        data = payload.replace(b"\xa2id\x00", b"\xa2id" + msgpack.packb(i + 1), 1)
        raw.send_frame(compress(data) if deflate else data, rsv1=deflate)
        reply = raw.read_inflated()
        assert reply["code"] == "FRAME_TOO_LARGE" and reply["id"] == i + 1


@pytest.mark.parametrize("deflate", [False, True], ids=["plain", "deflate"])
def test_refused_frames_are_freed(server: LocalServer, deflate: bool, figures: Figures) -> None:
    raw = connected(server, deflate)
    start = rss(server)
    refusals(raw, deflate)
    after = rss(server)
    raw.close()
    figures["rss_start_mb"] = round(start / MiB)
    figures["rss_after_mb"] = round(after / MiB)
    figures["frames_refused"] = ROUNDS
    assert after - start < GROWTH, f"RSS grew {(after - start) / MiB:.0f} MiB"


def test_a_client_that_never_reads_leaves_rss_flat(server: LocalServer, figures: Figures) -> None:
    assert server.url is not None
    lazy = RawSocket(port_of(server.url), rcvbuf=4096, timeout=5)
    lazy.upgrade()
    lazy.hello()
    lazy.send_message({"type": "open", "id": 1})
    sid = lazy.read_message()["session"]
    lazy.send_message({"type": "reset", "id": 2, "session": sid})
    lazy.read_message()
    start = rss(server)
    sent = 0
    step = msgpack.packb(
        {"type": "state", "id": 3, "session": sid}  # small request, small reply: many of them
    )
    big = msgpack.packb(
        {"type": "step", "id": 4, "session": sid, "action": {"message": "m" * 500_000}}
    )
    stop = threading.Event()

    def flood() -> None:
        nonlocal sent
        try:
            while not stop.is_set():
                lazy.send_frame(big)
                lazy.send_frame(step)
                sent += 1
        except OSError:
            pass  # the socket filled (the server stopped reading) or was closed

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    steps = 0
    with AsyncEnvClient(server.url, env=EchoEnv).sync() as env:
        env.reset()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert env.step(EchoAction(message="ok")).observation.echoed_message == "ok"
            steps += 1
    after = rss(server)
    stop.set()
    lazy.close()
    flooder.join(10)
    figures["requests_sent_unread"] = sent
    figures["bystander_steps"] = steps
    figures["rss_start_mb"] = round(start / MiB)
    figures["rss_after_mb"] = round(after / MiB)
    assert steps > 0
    assert after - start < GROWTH, f"RSS grew {(after - start) / MiB:.0f} MiB"


# -- 30.1: a refused action is not kept --------------------------------------------------

ACTION = 4 * MiB
REFUSED = 48
REFUSAL_SLACK = 40 * MiB
"""What refusals may leave behind: allocator slack and the transport's read buffer
(the warm-up already grew it to one action); keeping each refused action would be
48 x 4 MiB = 192 MiB."""


class Peer:
    """A raw corral/1 peer on one codec: msgpack binary frames or JSON text frames."""

    def __init__(self, server: LocalServer, codec: str) -> None:
        assert server.url is not None
        self.codec = codec
        self.raw = RawSocket(port_of(server.url), timeout=120)
        status, _, _ = self.raw.upgrade(subprotocol=f"corral.v1.{codec}")
        assert status == 101
        self.ids = iter(range(1, 1_000_000))
        assert self.request({"type": "hello", "protocol": PROTOCOL})["type"] == "welcome"

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        message = {**message, "id": next(self.ids)}
        if self.codec == "msgpack":
            self.raw.send_frame(msgpack.packb(message))
        else:
            self.raw.send_frame(orjson.dumps(message), opcode=1)
        while True:
            opcode, payload = self.raw.read_frame()
            if opcode == 8:
                raise ConnectionError("the server closed the connection")
            if opcode in (1, 2):
                reply: dict[str, Any] = (
                    msgpack.unpackb(payload) if opcode == 2 else orjson.loads(payload)
                )
                return reply


def wrong_type(size: int) -> dict[str, Any]:
    return {"message": ["m" * size]}


def unknown_field(size: int) -> dict[str, Any]:
    return {"message": "ok", "padding": "p" * size}


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_refused_actions_are_not_kept(server: LocalServer, codec: str, figures: Figures) -> None:
    peer = Peer(server, codec)
    session = peer.request({"type": "open"})["session"]
    assert peer.request({"type": "reset", "session": session})["type"] == "result"
    shapes: list[Callable[[int], dict[str, Any]]] = [wrong_type, unknown_field]

    def refuse(round_: int) -> None:
        action = shapes[round_ % 2](ACTION)
        if round_ % 3 == 2:  # a batch item's refusal takes the batch path
            reply = peer.request(
                {"type": "step_batch", "items": [{"session": session, "action": action}]}
            )
            code = reply["results"][0]["error"]["code"]
        else:
            code = peer.request({"type": "step", "session": session, "action": action})["code"]
        assert code == ErrorCode.INVALID_ACTION

    for round_ in range(6):  # warm-up: buffers and allocator arenas at their working size
        refuse(round_)
    start = rss(server)
    for round_ in range(REFUSED):
        refuse(round_)
    after = rss(server)
    # The session still works, with a valid action after all those refusals.
    reply = peer.request({"type": "step", "session": session, "action": {"message": "hi"}})
    assert reply["type"] == "result"
    peer.raw.close()
    figures[f"rss_start_mb_{codec}"] = round(start / MiB)
    figures[f"rss_after_{REFUSED}_refusals_mb_{codec}"] = round(after / MiB)
    assert after - start < REFUSAL_SLACK, f"RSS grew {(after - start) / MiB:.0f} MiB"


def bad_state(envelope: dict[str, Any], size: int) -> dict[str, Any]:
    """A snapshot whose state fails the environment's snapshot model (a list for a str)."""
    return {**envelope, "snapshot": {**envelope["snapshot"], "message": ["m" * size]}}


def altered(envelope: dict[str, Any], size: int) -> dict[str, Any]:
    """A snapshot altered after it was taken (its signature no longer matches, with a
    fleet key; without one, its own well-typed state is restored and closed again)."""
    return {**envelope, "snapshot": {**envelope["snapshot"], "message": "m" * size}}


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_refused_restores_are_not_kept(server: LocalServer, codec: str, figures: Figures) -> None:
    """Issue 30.1's class on the way in a restore takes: the refusal of a 4 MiB snapshot
    (BAD_SNAPSHOT: its state fails the model, or it was altered) holds none of it."""
    peer = Peer(server, codec)
    session = peer.request({"type": "open"})["session"]
    assert peer.request({"type": "reset", "session": session})["type"] == "result"
    taken = peer.request({"type": "snapshot", "session": session})
    assert taken["type"] == "snapshot", taken
    envelope = taken["snapshot"]

    def refuse(round_: int) -> None:
        shape = bad_state if round_ % 2 == 0 else altered
        reply = peer.request({"type": "restore", "snapshot": shape(envelope, ACTION)})
        if reply["type"] == "restored":  # an unsigned server restores what is well typed
            assert peer.request({"type": "close", "session": reply["session"]})["type"] == "closed"
        else:
            assert reply["code"] in (ErrorCode.BAD_SNAPSHOT, ErrorCode.SNAPSHOT_TOO_LARGE), reply

    for round_ in range(6):
        refuse(round_)
    start = rss(server)
    for round_ in range(REFUSED):
        refuse(round_)
    after = rss(server)
    peer.raw.close()
    figures[f"rss_start_mb_restores_{codec}"] = round(start / MiB)
    figures[f"rss_after_{REFUSED}_restores_mb_{codec}"] = round(after / MiB)
    assert after - start < REFUSAL_SLACK, f"RSS grew {(after - start) / MiB:.0f} MiB"

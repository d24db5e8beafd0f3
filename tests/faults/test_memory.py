"""Memory stays bounded under hostile peers (issue 11.4, 11.5), on both transports.

Each probe drives a real ``corral serve`` process and reads its RSS from /proc:

* 40 frames of 16 MiB + 100 B, each refused with ``FRAME_TOO_LARGE``: every refused frame
  is freed at once (no reference cycle waits for the collector);
* the same refusals sent permessage-deflate compressed (~16 KiB each on the wire);
* a client that sends requests and never reads its replies: the server stops reading
  from it, and its RSS stays flat while another client keeps stepping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import msgpack
import pytest
from tests.faults.conftest import local_server, rss_bytes, started
from tests.support.figures import Figures
from tests.support.rawws import RawSocket, compress
from tests.support.servers import port_of

from corral.client import AsyncEnvClient
from corral.client.local_server import LocalServer
from corral.envs.echo import EchoAction, EchoEnv

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

"""The native corral/1 transport and its front door, over real sockets on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import msgpack
import orjson
import pytest
from tests.support.rawws import RawSocket, close_code, compress, frame_header
from tests.support.servers import port_of, running, wait_until
from websockets.sync.client import connect

from corral.client import AsyncEnvClient
from corral.envs.echo import EchoAction, EchoEnv
from corral.protocol.deflate import DeflateParams, Deflater, negotiate
from corral.server.edge import hard_frame_limit
from corral.server.front import is_native_upgrade
from corral.server.native import NativeLink

TOKEN = "s3cret-token-123"


def links(server) -> list[NativeLink]:
    return [c for c in server.server.server_state.connections if isinstance(c, NativeLink)]


@pytest.fixture(scope="module")
def server():
    with running(EchoEnv, transport="native", max_frame_bytes=256 * 1024) as srv:
        yield srv


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_corral_subprotocols_go_native(server, codec):
    url = server.url.replace("http://", "ws://") + "/ws"
    with connect(url, subprotocols=[f"corral.v1.{codec}"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == f"corral.v1.{codec}"
        assert wait_until(lambda: len(links(server)) == 1)
        hello = {"type": "hello", "id": 1, "protocol": "corral/1"}
        ws.send(msgpack.packb(hello) if codec == "msgpack" else orjson.dumps(hello).decode())
        reply = ws.recv()
        decoded = msgpack.unpackb(reply) if codec == "msgpack" else orjson.loads(reply)
        assert decoded["type"] == "welcome"
    assert wait_until(lambda: not links(server))


def test_typed_client_steps_on_the_native_path(server):
    with AsyncEnvClient(server.url, env=EchoEnv).sync() as env:
        env.reset()
        result = env.step(EchoAction(message="hi"))
        assert result.observation.echoed_message == "hi"
        assert links(server)


def test_openenv_ws_and_http_share_the_port(server):
    url = server.url.replace("http://", "ws://") + "/ws"
    with connect(url) as ws:  # no subprotocol: OpenEnv's envelope, served by uvicorn
        ws.send(orjson.dumps({"type": "reset", "data": {}}).decode())
        assert orjson.loads(ws.recv())["type"] == "observation"
        assert not links(server)
    assert httpx.get(server.url + "/health").json() == {"status": "healthy"}
    reply = httpx.post(server.url + "/step", json={"action": {"message": "yo"}})
    assert reply.status_code == 200 and reply.json()["observation"]["echoed_message"] == "yo"


def test_a_malformed_upgrade_is_answered_by_uvicorn(server):
    raw = RawSocket(port_of(server.url))
    raw.sock.sendall(
        b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nSec-WebSocket-Protocol: corral.v1.json\r\n\r\n"
    )
    status, _, _ = raw.read_response()
    assert status in (400, 404, 426)
    raw.close()


def test_refusals_at_the_handshake():
    with running(EchoEnv, transport="native", max_sessions=1, max_connections_per_client=2) as srv:
        port = port_of(srv.url)
        holder = RawSocket(port)
        assert holder.upgrade()[0] == 101
        holder.hello()
        holder.send_message({"type": "open", "id": 1})
        opened = holder.read_message()
        assert opened["type"] == "opened"
        # Full: 503 with Retry-After and a structured body.
        status, headers, body = RawSocket(port).upgrade()
        assert status == 503 and headers["retry-after"] == "1"
        assert orjson.loads(body)["code"] == "CAPACITY_REACHED"
        # A client coming back for its session is let in.
        again = RawSocket(port)
        status, _, _ = again.upgrade(headers={"corral-resume": opened["session"]})
        assert status == 101
        # A third connection of the same address: 429.
        status, headers, body = RawSocket(port).upgrade(
            headers={"corral-resume": opened["session"]}
        )
        assert status == 429 and orjson.loads(body)["code"] == "TOO_MANY_CONNECTIONS"
        again.close()
        holder.close()


def test_bearer_token_at_the_native_handshake():
    with running(EchoEnv, transport="native", token=TOKEN) as srv:
        port = port_of(srv.url)
        status, headers, body = RawSocket(port).upgrade()
        assert status == 401 and orjson.loads(body)["code"] == "UNAUTHORIZED"
        assert headers["www-authenticate"].startswith("Bearer")
        wrong = RawSocket(port).upgrade(headers={"Authorization": "Bearer nope-nope-nope"})
        assert wrong[0] == 401
        ok = RawSocket(port)
        assert ok.upgrade(headers={"Authorization": f"Bearer {TOKEN}"})[0] == 101
        assert ok.hello()["type"] == "welcome"
        ok.close()


def test_gate_and_slots_are_freed_when_links_close(server):
    for _ in range(5):
        raw = RawSocket(port_of(server.url))
        assert raw.upgrade()[0] == 101
        raw.hello()
        raw.close()
    assert wait_until(lambda: not server.service.gate.held and not links(server))


# -- frames ---------------------------------------------------------------------------


def test_oversized_frame_gets_its_error_and_the_link_lives(server):
    raw = RawSocket(port_of(server.url))
    raw.upgrade()
    raw.hello()
    big = {"type": "step", "id": 7, "session": "nope", "action": {"message": "a" * 300_000}}
    raw.send_message(big)
    reply = raw.read_message()
    assert reply["code"] == "FRAME_TOO_LARGE" and reply["id"] == 7
    raw.send_message({"type": "open", "id": 8})
    assert raw.read_message()["type"] == "opened"
    raw.close()


def test_replies_of_one_turn_go_out_together_whole(server):
    """Requests that arrive in one read are answered together: every reply a whole frame
    of its own (short, 16-bit and 64-bit lengths), none lost or cut."""
    raw = RawSocket(port_of(server.url))
    raw.upgrade()
    raw.hello()
    messages = ["a" * 10, "b" * 1_000, "c" * 100_000, "d"]
    sessions = []
    for rid in range(2, 2 + len(messages)):
        raw.send_message({"type": "open", "id": rid})
        sessions.append(raw.read_message()["session"])
        raw.send_message({"type": "reset", "id": 100 + rid, "session": sessions[-1]})
        assert raw.read_message()["type"] == "result"
    burst = b"".join(
        frame_header(len(data)) + data
        for data in (
            msgpack.packb({"type": "step", "id": 200 + k, "session": sid, "action": {"message": m}})
            for k, (sid, m) in enumerate(zip(sessions, messages, strict=True))
        )
    )
    raw.sock.sendall(burst)  # one write: the server reads them in one turn
    replies = {(reply := raw.read_message())["id"]: reply for _ in messages}
    echoed = [replies[200 + k]["observation"]["echoed_message"] for k in range(len(messages))]
    assert echoed == messages
    raw.close()


def test_fragmented_message_is_reassembled(server):
    raw = RawSocket(port_of(server.url))
    raw.upgrade()
    raw.hello()
    data = msgpack.packb({"type": "open", "id": 3})
    raw.send_frame(data[:2], opcode=2, fin=False)
    raw.send_frame(data[2:], opcode=0, fin=True)
    assert raw.read_message()["type"] == "opened"
    raw.close()


def test_past_the_hard_limit_the_link_closes_with_1009(server):
    raw = RawSocket(port_of(server.url))
    raw.upgrade()
    raw.hello()
    limit = hard_frame_limit(server.service.config)
    raw.send_frame(b"x" * 1000, opcode=2, fin=False)
    with contextlib.suppress(OSError):  # the server may have closed first
        raw.send_frame(b"x" * limit, opcode=0, fin=True)
    opcode, payload = raw.read_frame()
    assert opcode == 8 and close_code(payload) == 1009
    raw.close()


def test_invalid_utf8_text_closes_with_1007(server):
    raw = RawSocket(port_of(server.url))
    raw.upgrade("corral.v1.json")
    raw.send_frame(b"\xff\xfe", opcode=1)
    opcode, payload = raw.read_frame()
    assert opcode == 8 and close_code(payload) == 1007
    raw.close()


# -- permessage-deflate ----------------------------------------------------------------


def test_deflate_is_negotiated_and_replies_compressed(server):
    raw = RawSocket(port_of(server.url))
    status, headers, _ = raw.upgrade(
        headers={"Sec-WebSocket-Extensions": "permessage-deflate; client_max_window_bits"}
    )
    assert status == 101
    assert headers["sec-websocket-extensions"].startswith("permessage-deflate")
    hello = {"type": "hello", "id": 1, "protocol": "corral/1", "schemas": True}
    raw.send_message(hello, deflate=True)
    opcode, payload = raw.read_frame()  # the welcome with schemas is long: compressed
    assert opcode == 2 and raw.last_rsv1
    welcome = msgpack.unpackb(Deflater(DeflateParams(), 1 << 20).inflate(payload))
    assert welcome["type"] == "welcome"
    raw.close()


def test_deflate_bomb_is_bounded(server):
    limit = server.service.config.max_frame_bytes
    # Between the limit and the hard bound: inflated, refused with its id, link lives.
    raw = RawSocket(port_of(server.url))
    raw.upgrade(headers={"Sec-WebSocket-Extensions": "permessage-deflate"})
    big = {"type": "step", "id": 5, "session": "x", "action": {"message": "a" * (limit + 100)}}
    raw.send_message(big, deflate=True)
    _, payload = raw.read_frame()
    assert not raw.last_rsv1  # a short reply goes uncompressed
    reply = msgpack.unpackb(payload)
    assert reply["code"] == "FRAME_TOO_LARGE" and reply["id"] == 5
    # Past the hard bound: never inflated whole; 1009.
    bomb = compress(b"\x00" * (hard_frame_limit(server.service.config) * 4))
    assert len(bomb) < 10_000
    raw.send_frame(bomb, rsv1=True)
    opcode, payload = raw.read_frame()
    assert opcode == 8 and close_code(payload) == 1009
    raw.close()


def test_deflate_offer_parsing():
    assert negotiate(["x-webkit-deflate-frame"]) is None
    assert negotiate(["permessage-deflate; server_max_window_bits=8"]) is None
    assert negotiate(["permessage-deflate; bogus=1, permessage-deflate"]) == DeflateParams()
    params = negotiate(
        ["permessage-deflate; client_no_context_takeover; server_max_window_bits=10"]
    )
    assert params == DeflateParams(True, 10, 15)
    assert params.response() == (
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover; "
        "server_max_window_bits=10"
    )


def test_native_upgrade_detection():
    head = (
        b"GET /ws?x=1 HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade"
        b"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Protocol: chat, corral.v1.json"
    )
    assert is_native_upgrade(head)
    # What picows would refuse after the decision goes to uvicorn, which serves it too.
    assert not is_native_upgrade(head.replace(b"Connection: Upgrade", b"Connection: a, Upgrade"))
    assert not is_native_upgrade(head.replace(b"dGhlIHNhbXBsZSBub25jZQ==", b"abc"))
    assert not is_native_upgrade(head.replace(b"corral.v1.json", b"openenv"))
    assert not is_native_upgrade(head.replace(b"/ws?", b"/mcp?"))
    assert not is_native_upgrade(head.replace(b"GET", b"POST"))
    assert not is_native_upgrade(head.replace(b"Version: 13", b"Version: 8"))


# -- back-pressure ----------------------------------------------------------------------


def test_a_client_that_never_reads_is_paused_then_closed():
    cap = 512 * 1024
    with running(EchoEnv, transport="native", max_outgoing_bytes=cap) as srv:
        port = port_of(srv.url)
        lazy = RawSocket(port, rcvbuf=4096)
        lazy.upgrade()
        lazy.hello()
        sessions = []
        for i in range(40):
            lazy.send_message({"type": "open", "id": 100 + i})
            sid = lazy.read_message()["session"]
            lazy.send_message({"type": "reset", "id": 200 + i, "session": sid})
            lazy.read_message()
            sessions.append(sid)
        message = "m" * 900_000
        stop = threading.Event()

        def flood() -> None:
            try:
                for i, sid in enumerate(sessions):
                    if stop.is_set():
                        return
                    step = {"type": "step", "id": 300 + i, "session": sid}
                    lazy.send_message({**step, "action": {"message": message}})
            except OSError:
                pass  # closed by the server: what this test waits for

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        # Another client steps meanwhile, unaffected.
        with AsyncEnvClient(srv.url, env=EchoEnv).sync() as env:
            env.reset()
            for _ in range(20):
                assert env.step(EchoAction(message="ok")).observation.echoed_message == "ok"
            assert wait_until(lambda: srv.manager.stats.errors.get("SLOW_CONSUMER", 0) >= 1, 30)
            assert env.step(EchoAction(message="still")).observation.echoed_message == "still"
        stop.set()
        lazy.close()
        flooder.join(10)
        assert wait_until(lambda: not links(srv))


# -- the front door ---------------------------------------------------------------------


def test_slowloris_is_dropped_while_a_healthy_client_steps():
    with running(
        EchoEnv, transport="native", handshake_timeout_s=2.0, max_pending_handshakes=100
    ) as srv:
        port = port_of(srv.url)
        dribblers = []
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /ws HTTP/1.1\r\n")
            dribblers.append(sock)
        guard = srv.app.state.handshakes
        assert wait_until(lambda: guard.evicted >= 100)
        assert len(guard.waiting) <= 100
        with AsyncEnvClient(srv.url, env=EchoEnv).sync() as env:
            env.reset()
            steps = 0
            deadline = time.monotonic() + 60
            while len(guard.waiting) and time.monotonic() < deadline:
                for sock in dribblers:
                    with contextlib.suppress(OSError):
                        sock.send(b"X")
                assert env.step(EchoAction(message="hi")).observation.echoed_message == "hi"
                steps += 1
            assert not guard.waiting and steps > 0
        closed = 0
        for sock in dribblers:
            sock.settimeout(10)
            try:
                while sock.recv(4096):
                    pass
                closed += 1
            except OSError:
                closed += 1
            sock.close()
        assert closed == 200
        assert guard.expired + guard.evicted >= 200


def test_an_oversized_head_gets_431(server):
    raw = RawSocket(port_of(server.url))
    raw.sock.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70_000)
    status, _, _ = raw.read_response(body=False)
    assert status == 431
    raw.close()


def test_asgi_transport_is_selectable():
    with running(EchoEnv, transport="asgi") as srv:
        with AsyncEnvClient(srv.url, env=EchoEnv).sync() as env:
            env.reset()
            assert env.step(EchoAction(message="a")).observation.echoed_message == "a"
        assert not links(srv)


def test_an_upgrade_picows_would_refuse_is_served_by_uvicorn(server):
    # The server is the module's: the links of earlier tests' connections may still be
    # closing on a loaded machine, and this test is about its own connection only.
    assert wait_until(lambda: not links(server), timeout=30)
    raw = RawSocket(port_of(server.url))
    status, headers, _ = raw.upgrade(headers={"Connection": "keep-alive, Upgrade"})
    assert status == 101 and headers["sec-websocket-protocol"] == "corral.v1.msgpack"
    assert raw.hello()["type"] == "welcome"
    assert not links(server)
    raw.close()

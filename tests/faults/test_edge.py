"""Hostile WebSocket peers after the upgrade, through real servers on 127.0.0.1 (issue 30.2,
30.3): frames dribbled byte by byte, fragmented messages never finished, a crowd of
peers each parking a message one fragment short. Both transports.

The deadlines are set small here (the defaults are 30 s for a frame and 60 s for a
message); every wait is on an event (a close frame, a counter) with a margin a loaded
two-core machine meets.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import msgpack
import pytest
from tests.support.rawws import RawSocket, close_code, frame_header
from tests.support.servers import ThreadServer, port_of, running, wait_until
from websockets.sync.client import ClientConnection, connect

from corral.client import AsyncEnvClient
from corral.envs.echo import EchoAction, EchoEnv
from corral.server.config import ServerConfig

TRANSPORTS = ["native", "asgi"]
FRAME_S = 3.0
"""The frame deadline of these servers: a quiet peer is pinged after 1.5 s and closed 1.5 s
later if no frame completed (a healthy client's pong has 1.5 s to come back)."""
PEERS = 12
"""Dribbling peers, all from 127.0.0.1 (its per-address bound in these tests)."""
WAIT_S = 60.0
"""How long a peer's close may take to arrive on a loaded machine (it takes ~FRAME_S)."""

CONTINUATION, BINARY, CLOSE, PING, PONG = 0x0, 0x2, 0x8, 0x9, 0xA


def read_until_closed(raw: RawSocket) -> int | None:
    """Read the server's frames (its probe ping...) until its close: the close code, or
    None when the socket ended without one (a reset after the close, on a loaded box)."""
    while True:
        try:
            opcode, payload = raw.read_frame()
        except (ConnectionError, OSError):
            return None
        if opcode == CLOSE:
            return close_code(payload)


def dribble(peers: list[RawSocket], stop: threading.Event) -> None:
    """One byte to each peer every 0.2 s, until each is closed or ``stop`` (bounded)."""
    alive = list(peers)
    deadline = time.monotonic() + WAIT_S
    while alive and not stop.wait(0.2) and time.monotonic() < deadline:
        for raw in list(alive):
            try:
                raw.sock.send(b"x")
            except OSError:
                alive.remove(raw)


@contextmanager
def healthy_client(url: str, source: str) -> Iterator[tuple[ClientConnection, str]]:
    """A well-behaved corral/1 connection from ``source`` (it answers pings) with a session."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(20)
    sock.connect(("127.0.0.1", port_of(url)))
    ws_url = url.replace("http://", "ws://") + "/ws"
    with connect(ws_url, sock=sock, subprotocols=["corral.v1.msgpack"], open_timeout=20) as ws:  # type: ignore[list-item]
        assert request(ws, {"type": "hello", "id": 1, "protocol": "corral/1"})["type"] == "welcome"
        session = request(ws, {"type": "open", "id": 2})["session"]
        assert request(ws, {"type": "reset", "id": 3, "session": session})["type"] == "result"
        yield ws, session


def request(ws: ClientConnection, message: dict) -> dict:
    ws.send(msgpack.packb(message))
    while True:
        reply = msgpack.unpackb(ws.recv(timeout=20))
        if reply.get("id") == message["id"]:
            return reply


def errors(server: ThreadServer, code: str) -> int:
    return int(server.manager.stats.errors.get(code, 0))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_peers_dribbling_a_frame_are_closed_at_the_deadline(transport, figures):
    with running(
        EchoEnv,
        transport=transport,
        frame_timeout_s=FRAME_S,
        max_connections_per_client=PEERS,
    ) as srv:
        port = port_of(srv.url)
        with healthy_client(srv.url, "127.0.0.2") as (healthy, session):
            peers = []
            for _ in range(PEERS):
                raw = RawSocket(port, timeout=WAIT_S)
                assert raw.upgrade()[0] == 101
                raw.sock.sendall(frame_header(100_000))  # a frame announced, never sent
                peers.append(raw)
            # The address holds its bound: one more is refused at the handshake.
            status, headers, _ = RawSocket(port).upgrade()
            assert status == 429 and headers["retry-after"] == "1"
            stop = threading.Event()
            dribbler = threading.Thread(target=dribble, args=(peers, stop), daemon=True)
            started = time.monotonic()
            dribbler.start()
            try:
                # Meanwhile the server serves everyone else.
                assert httpx.get(srv.url + "/health", timeout=20).status_code == 200
                with ThreadPoolExecutor(PEERS) as pool:
                    codes = list(pool.map(read_until_closed, peers))
                closed_after = time.monotonic() - started
            finally:
                stop.set()
                dribbler.join(10)
                for raw in peers:
                    raw.close()
            assert set(codes) <= {1008, None} and 1008 in codes, codes
            assert wait_until(lambda: errors(srv, "FRAME_TIMEOUT") == PEERS, WAIT_S)
            assert wait_until(lambda: "127.0.0.1" not in srv.service.gate.held, WAIT_S)
            # The healthy client idled through it all, answering the probes: untouched.
            step = {"type": "step", "id": 4, "session": session, "action": {"message": "hi"}}
            reply = request(healthy, step)
            assert reply["observation"]["echoed_message"] == "hi", reply
        # The address's slots are back: new clients connect and step.
        with AsyncEnvClient(srv.url, env=EchoEnv).sync() as env:
            env.reset()
            assert env.step(EchoAction(message="again")).observation.echoed_message == "again"
        figures["transport"] = transport
        figures["dribbling_peers"] = PEERS
        figures["frame_timeout_s"] = FRAME_S
        figures["seconds_until_all_closed"] = round(closed_after, 2)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_one_address_cannot_take_every_descriptor_by_default(transport, figures):
    # The default bound, not one set for the test: 1,010 upgraded peers from one address
    # once took all 1,024 descriptors of a server.
    bound = ServerConfig().max_connections_per_client
    assert bound is not None and bound <= 256
    with running(EchoEnv, transport=transport) as srv:
        port = port_of(srv.url)
        held = []
        try:
            for _ in range(bound):
                raw = RawSocket(port, timeout=WAIT_S)
                assert raw.upgrade()[0] == 101
                held.append(raw)
            status, headers, body = RawSocket(port).upgrade()
            assert status == 429 and headers["retry-after"] == "1"
            assert b"TOO_MANY_CONNECTIONS" in body
            # Another address connects, steps, and the server answers its health check.
            with healthy_client(srv.url, "127.0.0.2") as (healthy, session):
                step = {"type": "step", "id": 4, "session": session, "action": {"message": "x"}}
                assert request(healthy, step)["observation"]["echoed_message"] == "x"
            assert httpx.get(srv.url + "/health", timeout=20).status_code == 200
        finally:
            for raw in held:
                raw.close()
        assert wait_until(lambda: "127.0.0.1" not in srv.service.gate.held, WAIT_S)
        figures[f"{transport}_connections_per_address"] = bound


def pong(raw: RawSocket) -> None:
    """An unsolicited pong: a whole control frame (allowed between fragments)."""
    raw.send_frame(b"", opcode=PONG)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_unfinished_fragmented_message_is_closed_at_its_deadline(transport, figures):
    with running(EchoEnv, transport=transport, message_timeout_s=1.5) as srv:
        raw = RawSocket(port_of(srv.url), timeout=WAIT_S)
        assert raw.upgrade()[0] == 101
        raw.send_frame(b"\x81", opcode=BINARY, fin=False)
        stop = threading.Event()

        def keep_completing_frames() -> None:
            deadline = time.monotonic() + WAIT_S
            while not stop.wait(0.2) and time.monotonic() < deadline:
                try:
                    pong(raw)
                except OSError:
                    return

        sender = threading.Thread(target=keep_completing_frames, daemon=True)
        started = time.monotonic()
        sender.start()
        try:
            code = read_until_closed(raw)
        finally:
            stop.set()
            sender.join(10)
            raw.close()
        assert code in (1008, None)
        assert wait_until(lambda: errors(srv, "MESSAGE_TIMEOUT") == 1, WAIT_S)
        assert errors(srv, "FRAME_TIMEOUT") == 0  # frames kept arriving: the message was late
        assert srv.app.state.edge.budget.held == 0
        figures[f"{transport}_message_closed_after_s"] = round(time.monotonic() - started, 2)


LIMIT = 64 * 1024
"""max_frame_bytes of the budget tests: the longest message is 2 * 64 KiB + 64 KiB."""
BUDGET = 256 * 1024
PART = 100 * 1024


def parked(port: int, subprotocol: str | None = "corral.v1.msgpack") -> RawSocket:
    """A peer holding a message one fragment short, ``PART`` bytes so far."""
    raw = RawSocket(port, timeout=WAIT_S)
    assert raw.upgrade(subprotocol)[0] == 101
    raw.send_frame(b"\x00" * PART, opcode=BINARY, fin=False)
    return raw


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unfinished_messages_share_one_server_wide_budget(transport, figures):
    with running(
        EchoEnv, transport=transport, max_frame_bytes=LIMIT, max_partial_bytes=BUDGET
    ) as srv:
        budget = srv.app.state.edge.budget
        port = port_of(srv.url)
        first, second = parked(port), parked(port)
        assert wait_until(lambda: budget.held == 2 * PART, WAIT_S)
        # A third would pass the budget: that connection is closed, "try again later".
        third = parked(port)
        assert read_until_closed(third) in (1013, None)
        assert wait_until(lambda: errors(srv, "PARTIAL_BUDGET") == 1, WAIT_S)
        assert budget.held == 2 * PART
        # The first one finishes its message (garbage: answered BAD_FRAME, the link lives).
        first.send_frame(b"", opcode=CONTINUATION, fin=True)
        assert first.read_frame()[0] == BINARY
        assert wait_until(lambda: budget.held == PART, WAIT_S)
        # OpenEnv's envelope (no subprotocol: served by uvicorn even on the native
        # transport) draws on the same budget.
        fourth = parked(port, subprotocol=None)
        assert wait_until(lambda: budget.held == 2 * PART, WAIT_S)
        fifth = parked(port)
        assert read_until_closed(fifth) in (1013, None)
        assert wait_until(lambda: errors(srv, "PARTIAL_BUDGET") == 2, WAIT_S)
        for raw in (first, second, third, fourth, fifth):
            raw.close()
        # Whatever a closed connection held goes back.
        assert wait_until(lambda: budget.held == 0, WAIT_S)
        figures[f"{transport}_budget_bytes"] = BUDGET
        figures[f"{transport}_refused_past_budget"] = errors(srv, "PARTIAL_BUDGET")

"""The asyncio client transport on the wire: against a server by hand (malformed frames,
refusals, close codes, what the client writes) and against a real corral server."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess

import orjson
import pytest
from tests.support.envs import CountAction, CounterEnv
from tests.support.rawwsserver import RawPeer, close, frame, serving
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.client.connection import Connection
from corral.client.dialers import SocketClosed
from corral.client.dialers.asyncio_socket import AsyncioSocket, asyncio_dialer
from corral.errors import (
    CapacityReached,
    ConnectionLost,
    TooManyConnections,
    Unauthorized,
    UnsupportedProtocol,
)

SUBPROTOCOL = "corral.v1.msgpack"


async def dial(url: str, max_size: int = 1 << 20, **headers: str) -> AsyncioSocket:
    return await asyncio_dialer.open(url, SUBPROTOCOL, headers, 10.0, max_size)


def listen(socket: AsyncioSocket) -> tuple[list[object], asyncio.Future[str]]:
    frames: list[object] = []
    closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    socket.listen(frames.append, lambda why: closed.done() or closed.set_result(why))
    return frames, closed


async def collect(socket: AsyncioSocket, count: int) -> list[object]:
    """The first ``count`` messages (waits for them, bounded by the test's timeout)."""
    frames: list[object] = []
    enough = asyncio.Event()

    def take(message: object) -> None:
        frames.append(message)
        if len(frames) >= count:
            enough.set()

    socket.listen(take, lambda why: enough.set())
    await asyncio.wait_for(enough.wait(), 60)
    return frames


async def test_frames_are_masked_and_echoed_at_every_length_class():
    sizes = [0, 1, 125, 126, 65535, 65536, 1 << 20]
    seen: list[tuple[bool, bytes]] = []

    async def echo(peer: RawPeer) -> None:
        await peer.accept()
        for _ in sizes:
            got = await peer.read_frame()
            assert got.fin and got.opcode == 0x2
            seen.append((got.masked, got.key))
            await peer.send(frame(0x2, got.payload))
        got = await peer.read_frame()
        assert got.opcode == 0x1 and got.payload == "t\u00e9xt".encode()
        await peer.send(frame(0x1, got.payload))
        await peer.at_eof()

    async with serving(echo) as url:
        socket = await dial(url, max_size=2 << 20)
        arrived = asyncio.ensure_future(collect(socket, len(sizes) + 1))
        for size in sizes:
            await socket.send(bytes([size % 251]) * size)
        socket.write("t\u00e9xt")
        assert await arrived == [bytes([s % 251]) * s for s in sizes] + ["t\u00e9xt"]
        assert all(masked for masked, _ in seen)
        assert len({key for _, key in seen}) == len(sizes)
        socket.abort()


async def test_the_upgrade_carries_the_subprotocol_and_the_extra_headers():
    async def check(peer: RawPeer) -> None:
        assert peer.request_line == "GET /ws?token=q HTTP/1.1"
        assert peer.headers["sec-websocket-protocol"] == SUBPROTOCOL
        assert peer.headers["x-corral-resume"] == "s1,s2"
        assert peer.headers["authorization"] == "Bearer abc"
        assert peer.headers["user-agent"].startswith("corral/")
        assert "sec-websocket-extensions" not in peer.headers  # no compression offered
        await peer.accept()
        await peer.at_eof()

    async with serving(check) as url:
        socket = await asyncio_dialer.open(
            f"{url}?token=q",
            SUBPROTOCOL,
            {"X-Corral-Resume": "s1,s2", "Authorization": "Bearer abc"},
            10.0,
            1024,
        )
        assert socket.subprotocol == SUBPROTOCOL
        socket.abort()


async def test_server_pings_are_answered_between_fragments():
    async def script(peer: RawPeer) -> None:
        await peer.accept()
        await peer.send(
            frame(0x2, b"ab", fin=False) + frame(0x9, b"are you there") + frame(0x0, b"cd")
        )
        pong = await peer.read_frame()
        assert pong.masked and (pong.opcode, pong.payload) == (0xA, b"are you there")
        await peer.send(close(1000))
        assert (await peer.read_frame()).opcode == 0x8
        await peer.at_eof()

    async with serving(script) as url:
        socket = await dial(url)
        frames, closed = listen(socket)
        assert "closed by the server (code 1000" in await asyncio.wait_for(closed, 10)
        assert frames == [b"abcd"]


async def test_pings_resolve_on_their_pong_and_unsolicited_pongs_are_ignored():
    ponged = asyncio.Event()

    async def script(peer: RawPeer) -> None:
        await peer.accept()
        first = await peer.read_frame()
        second = await peer.read_frame()
        assert first.opcode == second.opcode == 0x9 and first.payload != second.payload
        await peer.send(frame(0xA, b"nobody asked"))
        ponged.set()
        await peer.send(frame(0xA, second.payload))  # answers both (RFC 6455 5.5.3)
        await peer.at_eof()

    async with serving(script) as url:
        socket = await dial(url)
        listen(socket)
        first = await socket.ping()
        second = await socket.ping()
        await ponged.wait()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        third = await socket.ping()  # never answered: fails when the socket goes
        socket.abort()
        with pytest.raises(SocketClosed):
            await asyncio.wait_for(third, 10)
        with pytest.raises(SocketClosed):
            await socket.ping()


@pytest.mark.parametrize(
    ("wire", "code", "words"),
    [
        (bytes((0x82, 0x81)) + b"kkkkx", 1002, "masked"),
        (frame(0x2, b"x", rsv=4), 1002, "reserved bits"),
        (frame(0x0, b"x"), 1002, "continuation"),
        (frame(0x1, b"\xff"), 1007, "UTF-8"),
        (close(1005), 1002, "close code 1005"),
        # Only the header of a 10 MB frame: refused before its payload.
        (frame(0x2, b"")[:1] + bytes([127]) + (10 << 20).to_bytes(8, "big"), 1009, None),
    ],
)
async def test_a_protocol_violation_closes_with_its_code(wire, code, words):
    async def script(peer: RawPeer) -> None:
        await peer.accept()
        await peer.send(frame(0x2, b"before") + wire)
        answer = await peer.read_frame()
        assert answer.masked and answer.opcode == 0x8
        assert int.from_bytes(answer.payload[:2], "big") == code
        assert await peer.at_eof()

    async with serving(script) as url:
        socket = await dial(url, max_size=1 << 20)
        frames, closed = listen(socket)
        why = await asyncio.wait_for(closed, 10)
        assert frames == [b"before"]
        assert socket.close_code == code
        assert (words or "exceeded 1048576 bytes") in why


async def test_a_fragmented_message_over_the_limit_closes_1009():
    async def script(peer: RawPeer) -> None:
        await peer.accept()
        await peer.send(frame(0x2, b"x" * 600, fin=False) + frame(0x0, b"y" * 600))
        answer = await peer.read_frame()
        assert answer.payload[:2] == (1009).to_bytes(2, "big")
        await peer.at_eof()

    async with serving(script) as url:
        socket = await dial(url, max_size=1000)
        frames, closed = listen(socket)
        assert "exceeded 1000 bytes" in await asyncio.wait_for(closed, 10)
        assert frames == [] and socket.close_code == 1009


async def test_a_close_from_the_server_is_echoed_and_the_server_closes_tcp():
    async def script(peer: RawPeer) -> None:
        await peer.accept()
        await peer.send(close(4001, "go away"))
        echo = await peer.read_frame()
        assert echo.masked and echo.payload[:2] == (4001).to_bytes(2, "big")
        # The client waits for the server to close TCP (RFC 6455 7.1.1).

    async with serving(script) as url:
        socket = await dial(url)
        _, closed = listen(socket)
        assert await asyncio.wait_for(closed, 10) == "closed by the server (code 4001 go away)"
        assert (socket.close_code, socket.close_reason) == (4001, "go away")
        with pytest.raises(SocketClosed):
            socket.write(b"late")


async def test_close_sends_1000_and_returns_once_the_server_closed():
    async def script(peer: RawPeer) -> None:
        await peer.accept()
        ours = await peer.read_frame()
        assert ours.masked and ours.payload == (1000).to_bytes(2, "big")
        await peer.send(close(1000))

    async with serving(script) as url:
        socket = await dial(url)
        _, closed = listen(socket)
        await asyncio.wait_for(socket.close(), 10)
        assert "closed by the server (code 1000" in closed.result()
        with pytest.raises(SocketClosed):
            await socket.send(b"late")


async def test_a_dropped_connection_is_reported_once_as_1006():
    async def script(peer: RawPeer) -> None:
        await peer.accept()
        await peer.send(frame(0x2, b"last words"))

    async with serving(script) as url:
        socket = await dial(url)
        frames, closed = listen(socket)
        assert (await asyncio.wait_for(closed, 10)).startswith("connection lost")
        assert frames == [b"last words"] and socket.close_code == 1006
        late: list[str] = []
        socket.listen(frames.append, late.append)  # a late listener still hears it once
        assert len(late) == 1


async def test_send_waits_while_the_server_does_not_read():
    reading = asyncio.Event()

    async def script(peer: RawPeer) -> None:
        await peer.accept()
        await reading.wait()
        while await peer.reader.read(1 << 20):
            pass

    async with serving(script) as url:
        socket = await dial(url)
        listen(socket)
        socket.transport.set_write_buffer_limits(high=64 * 1024)
        sent = asyncio.create_task(socket.send(b"x" * (16 << 20)))
        for _ in range(2000):  # until the write buffer passes its mark
            if socket._paused:
                break
            await asyncio.sleep(0.01)
        assert socket._paused and not sent.done()
        reading.set()
        await asyncio.wait_for(sent, 60)
        assert not socket._paused
        socket.abort()


CAPACITY = orjson.dumps({"code": "CAPACITY_REACHED", "message": "full", "details": {"n": 1}})
SLOW_DOWN = orjson.dumps({"code": "TOO_MANY_CONNECTIONS", "message": "slow", "details": {}})
REFUSALS = [
    (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        b"Retry-After: 3\r\nContent-Length: %d\r\n\r\n%s" % (len(CAPACITY), CAPACITY),
        CapacityReached,
    ),
    (
        b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(SLOW_DOWN), SLOW_DOWN),
        TooManyConnections,
    ),
    (b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n", Unauthorized),
    # No length: the body ends with the connection.
    (b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\nno such path", ConnectionLost),
]


@pytest.mark.parametrize(("answer", "error"), REFUSALS)
async def test_a_refused_upgrade_is_its_typed_error(answer, error):
    async def refuse(peer: RawPeer) -> None:
        await peer.send(answer)
        if b"Connection: close" not in answer:
            await peer.at_eof()  # keep the connection: the body's length ends it

    async with serving(refuse) as url:
        with pytest.raises(error) as err:
            await dial(url)
    if error is CapacityReached:
        assert err.value.details == {"n": 1, "retry_after_s": 3.0}
    if error is ConnectionLost:
        assert err.value.details["status"] == 404
        assert err.value.details["body"] == "no such path"


@pytest.mark.parametrize(
    ("accept", "words"),
    [
        ({"key": "bm90IHRoZSByaWdodCBrZXk="}, "Sec-WebSocket-Accept"),
        ({"extra": "Sec-WebSocket-Extensions: permessage-deflate\r\n"}, "extension"),
    ],
)
async def test_an_answer_that_does_not_upgrade_is_connection_lost(accept, words):
    async def script(peer: RawPeer) -> None:
        await peer.accept(**accept)
        await peer.at_eof()

    async with serving(script) as url:
        with pytest.raises(ConnectionLost, match=words):
            await dial(url)


async def test_a_server_without_the_subprotocol_is_unsupported():
    async def script(peer: RawPeer) -> None:
        await peer.accept(subprotocol=None)
        assert (await peer.read_frame()).opcode == 0x8
        await peer.send(close(1000))

    async with serving(script) as url:
        with pytest.raises(UnsupportedProtocol) as err:
            await dial(url)
    assert err.value.details == {"accepted": None}


async def test_a_server_that_never_answers_times_out():
    async def silent(peer: RawPeer) -> None:
        await peer.at_eof()

    async with serving(silent) as url:
        with pytest.raises(ConnectionLost, match="timed out"):
            await asyncio_dialer.open(url, SUBPROTOCOL, {}, 0.2, 1024)


async def test_an_unreachable_server_is_connection_lost():
    with pytest.raises(ConnectionLost, match="cannot connect"):
        await asyncio_dialer.open("ws://127.0.0.1:9/ws", SUBPROTOCOL, {}, 2.0, 1024)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_wss_verifies_the_server_and_carries_frames(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)

    async def echo(peer: RawPeer) -> None:
        await peer.accept()
        got = await peer.read_frame()
        assert got.masked
        await peer.send(frame(0x2, got.payload[::-1]))
        assert (await peer.read_frame()).opcode == 0x8
        await peer.send(close(1000))

    async with serving(echo, tls) as url:
        assert url.startswith("wss://")
        with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
            await dial(url)  # a certificate nobody vouches for
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the default context trusts it
        socket = await dial(url)
        arrived = asyncio.ensure_future(collect(socket, 1))
        socket.write(b"secret")
        assert await arrived == [b"terces"]
        await asyncio.wait_for(socket.close(), 10)
        assert socket.close_code == 1000


# -- against a real corral server ---------------------------------------------------


@pytest.mark.parametrize("server_transport", ["native", "asgi"])
async def test_refusals_from_a_real_server_on_either_server_transport(server_transport):
    with running(CounterEnv, max_sessions=1, transport=server_transport) as srv:
        first = AsyncEnvClient(srv.url, env=CounterEnv, transport="asyncio")
        await first.reset()
        with pytest.raises(CapacityReached) as err:
            await AsyncEnvClient(srv.url, env=CounterEnv, transport="asyncio").connect()
        assert err.value.details["max_sessions"] == 1
        await first.close()
    with running(CounterEnv, max_connections_per_client=1, transport=server_transport) as srv:
        held = AsyncEnvClient(srv.url, env=CounterEnv, transport="asyncio")
        await held.connect()
        with pytest.raises(TooManyConnections):
            await AsyncEnvClient(srv.url, env=CounterEnv, transport="asyncio").connect()
        await held.close()


async def test_a_real_server_answers_pings_and_keeps_the_connection():
    with running(CounterEnv) as srv:
        client = AsyncEnvClient(
            srv.url, env=CounterEnv, transport="asyncio", ping_interval=0.05, ping_timeout=30
        )
        await client.reset(limit=100)
        connection = client.connection
        assert isinstance(connection, Connection)
        socket = connection._ws
        assert isinstance(socket, AsyncioSocket)
        for _ in range(2000):  # keepalive pings, each answered, or the connection drops
            if socket._pinged >= 3:
                break
            await asyncio.sleep(0.01)
        assert socket._pinged >= 3
        assert (await client.step(CountAction(amount=2))).observation.total == 2
        assert connection.reconnects == 0 and connection._ws is socket
        await client.close()
        assert socket.close_code == 1000

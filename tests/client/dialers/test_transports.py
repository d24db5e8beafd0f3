"""The client transports against real servers on 127.0.0.1: the native one (picows) and
the asyncio one (any thread), both dispatching frames by callback, keep every guarantee
of the websockets one."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.support.envs import CountAction, CounterEnv
from tests.support.faultproxy import FaultProxy
from tests.support.rawwsserver import RawPeer, frame, serving
from tests.support.servers import port_of, running
from websockets.asyncio.server import ServerConnection, serve

from corral.client import AsyncEnvClient, EnvPool, SyncEnvClient
from corral.client.connection import Connection, ws_url
from corral.client.dialers import SocketClosed, auto_dialer, dialer_for, picows_available
from corral.client.dialers.asyncio_socket import AsyncioSocket, asyncio_dialer
from corral.client.dialers.picows_socket import PicowsSocket, picows_dialer
from corral.client.dialers.websockets_socket import WebsocketsSocket, websockets_dialer
from corral.errors import (
    CapacityReached,
    ConnectionLost,
    ReplyTooLarge,
    Unauthorized,
    UnsupportedProtocol,
)
from corral.protocol.client import ReconnectPolicy

TRANSPORTS = ["picows", "asyncio", "websockets"]
DIALERS = [picows_dialer, asyncio_dialer]
"""The callback-style dialers (``listen``), tested frame by frame below."""
FAST = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.05, give_up_after_s=5.0)
SUBPROTOCOL = "corral.v1.msgpack"


def test_each_transport_has_its_dialer_chosen_once():
    assert picows_available()
    assert dialer_for() is dialer_for("auto") is auto_dialer
    assert dialer_for("picows") is picows_dialer
    assert dialer_for("websockets") is websockets_dialer
    assert dialer_for("asyncio") is asyncio_dialer
    with pytest.raises(ValueError, match="unknown transport"):
        dialer_for("carrier-pigeon")
    with pytest.raises(ValueError, match="unknown transport"):
        AsyncEnvClient("http://127.0.0.1:1", transport="tcp")
    client = AsyncEnvClient("http://127.0.0.1:1", transport="asyncio")
    assert isinstance(client.connection, Connection)
    assert client.connection.dialer is asyncio_dialer


async def test_auto_takes_the_native_socket_on_a_loop_of_one_thread(counter):
    async with AsyncEnvClient(counter.url, env=CounterEnv) as client:
        await client.reset()
        assert isinstance(client.connection, Connection)
        assert isinstance(client.connection._ws, PicowsSocket)


@pytest.fixture(scope="module")
def counter():
    with running(CounterEnv) as srv:
        yield srv


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_steps_and_replies_matched_by_id(counter, transport):
    client = AsyncEnvClient(counter.url, env=CounterEnv, transport=transport)
    await client.reset(limit=1000)
    connection = client.connection
    assert isinstance(connection, Connection)
    kinds = {"picows": PicowsSocket, "asyncio": AsyncioSocket, "websockets": WebsocketsSocket}
    assert isinstance(connection._ws, kinds[transport])
    for k in range(1, 6):
        assert (await client.step(CountAction(amount=1))).observation.total == k
    others = [AsyncEnvClient(counter.url, env=CounterEnv, transport=transport) for _ in range(3)]
    firsts = await asyncio.gather(
        *(c.reset(limit=1000, label=f"c{k}") for k, c in enumerate(others))
    )
    assert [o.observation.label for o in firsts] == ["c0", "c1", "c2"]
    await asyncio.gather(client.close(), *(c.close() for c in others))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_pool_steps_on_either_transport(counter, transport):
    async with EnvPool(
        12, counter.url, env=CounterEnv, progress=False, transport=transport
    ) as pool:
        await pool.reset(options={"limit": 100})
        for k in range(1, 4):
            batch = await pool.step([CountAction(amount=1)] * 12)
            assert batch.obs["total"].tolist() == [k] * 12


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_capacity_and_auth_refusals_are_typed(transport):
    with running(CounterEnv, max_sessions=1) as full:
        first = await AsyncEnvClient(full.url, env=CounterEnv, transport=transport).connect()
        with pytest.raises(CapacityReached) as err:
            await AsyncEnvClient(full.url, env=CounterEnv, transport=transport).connect()
        assert err.value.details["max_sessions"] == 1
        assert err.value.details["retry_after_s"] == 1.0
        await first.close()
    with running(CounterEnv, token="s3cret-token-for-tests") as guarded:
        with pytest.raises(Unauthorized):
            await AsyncEnvClient(
                guarded.url, env=CounterEnv, transport=transport, token="wrong-token-here"
            ).connect()
        ok = AsyncEnvClient(
            guarded.url, env=CounterEnv, transport=transport, token="s3cret-token-for-tests"
        )
        assert (await ok.reset()).observation.total == 0
        await ok.close()


@pytest.mark.parametrize("dialer", DIALERS)
async def test_an_unreachable_server_is_connection_lost(dialer):
    with pytest.raises(ConnectionLost, match="cannot connect"):
        await dialer.open("ws://127.0.0.1:9/ws", SUBPROTOCOL, {}, 2.0, 1024)


@pytest.fixture
async def plain_ws() -> AsyncIterator[dict[str, object]]:
    """A websockets server whose behaviour a test sets: what it sends after the upgrade."""
    script: dict[str, object] = {"subprotocols": [SUBPROTOCOL], "send": [], "close": None}

    async def handler(ws: ServerConnection) -> None:
        for message in script["send"]:  # type: ignore[attr-defined]
            await ws.send(message)
        close = script["close"]
        if close is not None:
            await ws.close(*close)  # type: ignore[misc]
        else:
            await ws.wait_closed()

    def choose(ws: ServerConnection, offered: list[str]) -> str | None:
        wanted = script["subprotocols"]
        return next((p for p in offered if p in wanted), None)  # type: ignore[operator]

    async with serve(handler, "127.0.0.1", 0, select_subprotocol=choose, max_size=None) as srv:
        port = next(iter(srv.sockets)).getsockname()[1]
        script["url"] = f"ws://127.0.0.1:{port}"
        yield script


async def _listen(
    socket: PicowsSocket | AsyncioSocket,
) -> tuple[list[object], asyncio.Future[str]]:
    frames: list[object] = []
    closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    socket.listen(frames.append, lambda why: closed.done() or closed.set_result(why))
    return frames, closed


@pytest.mark.parametrize("dialer", DIALERS)
async def test_fragmented_messages_are_reassembled(dialer, plain_ws):
    plain_ws["send"] = [[b"ab", b"cd", b"ef"], ["te", "xt"], b"whole"]
    plain_ws["close"] = (1001, "bye")
    socket = await dialer.open(str(plain_ws["url"]), SUBPROTOCOL, {}, 5.0, 1024)
    assert socket.subprotocol == SUBPROTOCOL
    frames, closed = await _listen(socket)
    reason = await asyncio.wait_for(closed, 10)
    assert frames == [b"abcdef", "text", b"whole"]
    assert socket.close_code == 1001 and "1001 bye" in reason


@pytest.mark.parametrize("dialer", DIALERS)
async def test_a_message_over_the_limit_closes_the_socket(dialer, plain_ws):
    plain_ws["send"] = [[b"x" * 600, b"y" * 600]]
    socket = await dialer.open(str(plain_ws["url"]), SUBPROTOCOL, {}, 5.0, 1000)
    frames, closed = await _listen(socket)
    assert "exceeded 1000 bytes" in await asyncio.wait_for(closed, 10)
    assert frames == []
    plain_ws["send"] = [b"z" * 2000]  # one frame over the limit: refused from its header
    socket = await dialer.open(str(plain_ws["url"]), SUBPROTOCOL, {}, 5.0, 1000)
    frames, closed = await _listen(socket)
    assert "exceeded 1000 bytes" in await asyncio.wait_for(closed, 10)
    assert frames == []
    assert socket.close_code == 1009


@pytest.mark.parametrize("dialer", DIALERS)
@pytest.mark.parametrize(
    ("wire", "words"),
    [
        (frame(0x2, b"ab", fin=False) + frame(0x2, b"cd"), "a new message inside"),
        (frame(0x0, b"cd"), "continuation frame without a start"),
    ],
    ids=["new-inside-unfinished", "continuation-without-start"],
)
async def test_broken_fragmentation_closes_1002(dialer, wire, words):
    # Both dialers reassemble through protocol.inflow.Reassembler: the same rule, the
    # same close code.
    async def script(peer: RawPeer) -> None:
        await peer.accept()
        await peer.send(frame(0x2, b"before") + wire)
        answer = await peer.read_frame()
        assert answer.opcode == 0x8 and answer.payload[:2] == (1002).to_bytes(2, "big")
        await peer.at_eof()

    async with serving(script) as url:
        socket = await dialer.open(url, SUBPROTOCOL, {}, 5.0, 1024)
        frames, closed = await _listen(socket)
        why = await asyncio.wait_for(closed, 10)
        assert frames == [b"before"]
        assert socket.close_code == 1002 and words in why


@pytest.mark.parametrize("dialer", DIALERS)
async def test_a_server_without_the_subprotocol_is_unsupported(dialer, plain_ws):
    plain_ws["subprotocols"] = []
    with pytest.raises(UnsupportedProtocol):
        await dialer.open(str(plain_ws["url"]), SUBPROTOCOL, {}, 5.0, 1024)


@pytest.mark.parametrize("dialer", DIALERS)
async def test_ping_resolves_on_pong_and_fails_once_closed(dialer, plain_ws):
    socket = await dialer.open(str(plain_ws["url"]), SUBPROTOCOL, {}, 5.0, 1024)
    await _listen(socket)
    await asyncio.wait_for(await socket.ping(), 10)
    await socket.close()
    with pytest.raises(SocketClosed):
        await socket.send(b"late")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_cut_connection_resumes_the_session(counter, transport):
    async with FaultProxy(port_of(counter.url)) as proxy:
        client = AsyncEnvClient(proxy.url, env=CounterEnv, transport=transport, reconnect=FAST)
        await client.reset(limit=100)
        await client.step(CountAction(amount=2))
        proxy.cut_all()
        assert (await client.step(CountAction(amount=3))).observation.total == 5
        assert client.connection.reconnects == 1
        await client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_keepalive_detects_a_stalled_peer(counter, transport):
    async with FaultProxy(port_of(counter.url)) as proxy:
        client = AsyncEnvClient(
            proxy.url,
            env=CounterEnv,
            transport=transport,
            reconnect=False,
            ping_interval=0.2,
            ping_timeout=0.5,
            timeout=30,
        )
        await client.reset(limit=100)
        assert proxy.stall_all() == 1
        with pytest.raises(ConnectionLost, match="keepalive"):
            await client.step(CountAction())
        await client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_reply_over_the_client_frame_limit_is_an_error_reply(counter, transport):
    # The client announces its frame limit in hello, so the server answers a larger reply
    # with REPLY_TOO_LARGE instead of a frame the socket would drop (the socket's own
    # refusal of an oversize frame is tested above, against a server that ignores it).
    connection = Connection(
        ws_url(counter.url), transport=transport, max_frame_bytes=2048, reconnect=False
    )
    client = AsyncEnvClient(counter.url, env=CounterEnv, reconnect=False, timeout=10)
    client.connection = connection
    await client.reset(limit=100)
    with pytest.raises(ReplyTooLarge):
        await client.reset(label="x" * 4000)
    assert (await client.step(CountAction(amount=2))).observation.total == 2
    await client.close()


def test_the_blocking_twin_rides_the_asyncio_transport_from_two_threads(counter):
    """The twin's loop runs in the caller's thread during a call and in the keeper's
    between calls: one socket serves both, keepalive pings included."""
    twin = AsyncEnvClient(counter.url, env=CounterEnv, ping_interval=0.05).sync()
    twin.reset(limit=1000)
    connection = twin._async.connection
    assert isinstance(connection, Connection)
    socket = connection._ws
    assert isinstance(socket, AsyncioSocket)
    writers: set[str] = set()
    pinged_by_keeper = threading.Event()
    write, ping = socket.write, socket.ping

    def traced_write(message: bytes | str) -> None:
        writers.add(threading.current_thread().name)
        write(message)

    async def traced_ping() -> object:
        if threading.current_thread().name == "corral-sync-loop":
            pinged_by_keeper.set()
        return await ping()

    socket.write = traced_write  # type: ignore[method-assign]
    socket.ping = traced_ping  # type: ignore[method-assign]
    assert twin.step(CountAction(amount=1)).observation.total == 1
    # Idle: the keeper takes the loop back (after blocking.GRACE_S) and pings from there.
    assert pinged_by_keeper.wait(60)
    pinged_by_keeper.clear()
    assert pinged_by_keeper.wait(60)  # and again: the previous pong came back
    results = [twin.step(CountAction(amount=1)) for _ in range(3)]
    assert results[-1].observation.total == 4
    assert threading.current_thread().name in writers  # the caller ran the loop
    assert connection._ws is socket and connection.reconnects == 0
    twin.close()
    assert socket.close_code == 1000


def test_blocking_twins_called_from_several_threads(counter):
    """Twins stepping at once from three threads: the loop, and each socket on it, is run
    by whichever caller takes it (the others hand their calls over)."""
    twins = [AsyncEnvClient(counter.url, env=CounterEnv).sync() for _ in range(3)]
    errors: list[BaseException] = []

    def steps(twin: SyncEnvClient[CountAction, Any, Any]) -> None:
        try:
            twin.reset(limit=1000)
            for _ in range(20):
                twin.step(CountAction(amount=1))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=steps, args=(twin,)) for twin in twins]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    for twin in twins:
        assert twin.state().total == 20
        assert isinstance(twin._async.connection._ws, AsyncioSocket)
        twin.close()


def test_the_blocking_twin_refuses_picows_and_takes_websockets_when_asked(counter):
    explicit = AsyncEnvClient(counter.url, env=CounterEnv, transport="picows").sync()
    with pytest.raises(ValueError, match="blocking twin"):
        explicit.reset()
    explicit.close()
    with AsyncEnvClient(counter.url, env=CounterEnv, transport="websockets").sync() as twin:
        assert twin.reset(limit=10).observation.total == 0
        assert isinstance(twin._async.connection._ws, WebsocketsSocket)

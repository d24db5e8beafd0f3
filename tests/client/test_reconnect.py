"""Reconnect policy and resume edge cases, against in-process servers and the fault proxy."""

from __future__ import annotations

import asyncio
import random

import pytest
from tests.support.envs import CountAction, CounterEnv
from tests.support.faultproxy import FaultProxy
from tests.support.raw import RawPeer
from tests.support.servers import port_of, running
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from corral.client import AsyncEnvClient, ReconnectPolicy
from corral.client.connection import Connection, ws_url
from corral.errors import (
    ConnectionLost,
    ErrorCode,
    TooManyConnections,
    Unauthorized,
)
from corral.protocol import messages as m

FAST = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.1, give_up_after_s=10)


def test_backoff_grows_is_capped_and_jittered():
    policy = ReconnectPolicy(initial_delay_s=0.1, max_delay_s=1.0, multiplier=2.0, jitter=0.5)
    rng = random.Random(1)
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (10_000, 1.0)]:
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        assert all(ceiling * 0.5 <= d <= ceiling for d in delays), attempt
        assert max(delays) - min(delays) > ceiling * 0.3  # jitter actually spreads them
    assert ReconnectPolicy(jitter=0).delay(3, rng) == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_delay_s": 2, "max_delay_s": 1}, "initial_delay_s <= max_delay_s"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter": 1.5}, "jitter"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"give_up_after_s": 0}, "give_up_after_s"),
    ],
)
def test_bad_policies_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReconnectPolicy(**kwargs)


async def test_without_reconnect_a_drop_fails_the_waiting_request():
    with running(CounterEnv) as srv:
        async with FaultProxy(port_of(srv.url)) as proxy:
            client = AsyncEnvClient(proxy.url, env=CounterEnv, reconnect=False)
            await client.reset(limit=100)
            step = asyncio.ensure_future(client.step(CountAction(sleep=0.5)))
            await asyncio.sleep(0.1)
            proxy.cut_all()
            with pytest.raises(ConnectionLost):
                await step
            assert client.connection.reconnects == 0
            with pytest.raises(ConnectionLost):
                await client.state()
            await client.close()


async def test_one_connection_resumes_all_its_sessions():
    with running(CounterEnv) as srv:
        async with FaultProxy(port_of(srv.url)) as proxy:
            conn = Connection(proxy.url, reconnect=FAST)
            await conn.connect()
            sessions = []
            for _ in range(3):
                opened = await conn.request(m.Open(conn.next_id()), timeout=5)
                sessions.append(opened.session)
                await conn.request(m.Reset(conn.next_id(), sessions[-1]), timeout=5)
            assert set(conn.sessions.live) == set(sessions)
            proxy.cut_all()
            replies = await asyncio.gather(
                *(
                    conn.request(m.Step(conn.next_id(), s, {"amount": i}), 5)
                    for i, s in enumerate(sessions)
                )
            )
            assert [r.observation["total"] for r in replies] == [0, 1, 2]
            assert conn.reconnects == 1
            await conn.close()


async def test_a_cancelled_request_is_not_re_sent():
    with running(CounterEnv) as srv:
        async with FaultProxy(port_of(srv.url)) as proxy:
            client = AsyncEnvClient(proxy.url, env=CounterEnv, reconnect=FAST)
            await client.reset(limit=100)
            live = proxy.target_port
            proxy.target_port = 9
            proxy.cut_all()
            with pytest.raises(TimeoutError):  # given up by the caller while disconnected
                await asyncio.wait_for(client.step(CountAction(amount=5)), 0.3)
            proxy.target_port = live
            assert (await client.state()).total == 0
            assert (await client.step(CountAction(amount=1))).observation.total == 1
            await client.close()


async def test_a_full_server_still_admits_a_client_coming_back():
    with running(CounterEnv, max_sessions=1) as srv:
        async with FaultProxy(port_of(srv.url)) as proxy:
            client = AsyncEnvClient(proxy.url, env=CounterEnv, reconnect=FAST)
            await client.reset(limit=100)
            with pytest.raises(InvalidStatus):  # full: a newcomer is refused at the handshake
                await connect(ws_url(srv.url), subprotocols=["corral.v1.msgpack"])
            proxy.cut_all()
            assert (await client.step(CountAction(amount=3))).observation.total == 3
            assert client.connection.reconnects == 1
            await client.close()


async def test_a_refusal_for_good_stops_the_reconnect():
    with running(CounterEnv) as plain:
        async with FaultProxy(port_of(plain.url)) as proxy:
            client = AsyncEnvClient(proxy.url, env=CounterEnv, reconnect=FAST, token=None)
            await client.reset(limit=100)
            with running(CounterEnv, token="now-a-token-is-needed") as guarded:
                proxy.target_port = port_of(guarded.url)
                proxy.cut_all()
                with pytest.raises(Unauthorized):
                    await client.step(CountAction())
            assert not client.connection.reconnecting
            await client.close()


async def test_connections_per_client_address_are_limited():
    with running(CounterEnv, max_connections_per_client=2) as srv:
        a, b = await RawPeer.open(srv.url), await RawPeer.open(srv.url)
        with pytest.raises(TooManyConnections) as refused:
            await Connection(srv.url).connect()
        assert refused.value.details["limit"] == 2
        assert refused.value.details["retry_after_s"] == 1.0
        with pytest.raises(InvalidStatus) as raw:
            await connect(ws_url(srv.url), subprotocols=["corral.v1.msgpack"])
        assert raw.value.response.status_code == 429
        await a.close()
        for _ in range(100):
            if srv.service.gate.held.get("127.0.0.1", 0) < 2:
                break
            await asyncio.sleep(0.02)
        c = await RawPeer.open(srv.url)  # a freed connection is usable again
        await asyncio.gather(b.close(), c.close())


async def test_re_attaching_does_not_count_a_session_twice():
    with running(CounterEnv, max_sessions_per_connection=1) as srv:
        peer = await RawPeer.open(srv.url)
        opened = await peer.request({"type": "open"})
        sid, token = opened["session"], opened["token"]
        for _ in range(2):  # re-attach on the connection that holds it already
            again = await peer.request({"type": "attach", "session": sid, "token": token})
            assert again["type"] == "attached"
        refused = await peer.request({"type": "open"})
        assert refused["code"] == ErrorCode.TOO_MANY_SESSIONS  # still exactly one held
        await peer.request({"type": "close", "session": sid})
        assert (await peer.request({"type": "open"}))["type"] == "opened"
        await peer.close()


async def test_attach_moves_a_session_off_a_connection_not_yet_known_dead():
    with running(CounterEnv) as srv:
        first = await RawPeer.open(srv.url)
        opened = await first.request({"type": "open"})
        sid, token = opened["session"], opened["token"]
        await first.request({"type": "reset", "session": sid, "options": {"limit": 100}})
        second = await RawPeer.open(srv.url)
        wrong = await second.request({"type": "attach", "session": sid, "token": "ü" * 20})
        assert wrong["code"] == ErrorCode.UNAUTHORIZED
        moved = await second.request({"type": "attach", "session": sid, "token": token})
        assert moved["type"] == "attached"
        step = await second.request({"type": "step", "session": sid, "action": {"amount": 2}})
        assert step["observation"]["total"] == 2
        stale = await first.request({"type": "state", "session": sid})
        assert stale["code"] == ErrorCode.UNKNOWN_SESSION
        await first.close()  # a clean close of the old connection must not close it
        state = await second.request({"type": "state", "session": sid})
        assert state["state"]["total"] == 2
        await second.close()

"""Capacity, reaping, abandoned connections, timeouts: no slot ever leaks."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from tests.support.envs import AsyncCounterEnv, AutoResetEnv, CountAction, CounterEnv
from tests.support.raw import RawPeer
from tests.support.servers import running, wait_until
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from corral.client import AsyncEnvClient
from corral.errors import CapacityReached, ErrorCode, SessionLost, StepTimeout


async def test_capacity_is_refused_at_the_handshake():
    with running(CounterEnv, max_sessions=2) as srv:
        a = await AsyncEnvClient(srv.url, env=CounterEnv).connect()
        b = await AsyncEnvClient(srv.url, env=CounterEnv).connect()
        ready = httpx.get(f"{srv.url}/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
        with pytest.raises(InvalidStatus) as refused:
            await connect(srv.url.replace("http", "ws") + "/ws", subprotocols=["corral.v1.msgpack"])
        assert refused.value.response.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "1"
        with pytest.raises(CapacityReached) as err:
            await AsyncEnvClient(srv.url, env=CounterEnv).connect()
        assert err.value.details["max_sessions"] == 2
        await a.close()
        assert wait_until(lambda: srv.manager.active == 1)
        c = await AsyncEnvClient(srv.url, env=CounterEnv).connect()  # a freed slot is usable
        await asyncio.gather(b.close(), c.close())
        assert wait_until(lambda: srv.manager.active == 0)


async def test_open_beyond_capacity_on_a_live_connection():
    with running(CounterEnv, max_sessions=1) as srv:
        peer = await RawPeer.open(srv.url)
        await peer.open_session()
        reply = await peer.request({"type": "open"})
        assert reply["code"] == ErrorCode.CAPACITY_REACHED
        assert reply["details"] == {"active_sessions": 1, "max_sessions": 1}
        await peer.close()


async def test_abandoned_connections_free_every_slot():
    with running(CounterEnv, max_sessions=200, resume_window_s=0.3) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        peers = [await RawPeer.open(srv.url) for _ in range(60)]
        for peer in peers:
            await peer.open_session()
        assert srv.manager.active == 60
        for peer in peers[:30]:  # vanish without a close frame
            peer.ws.transport.abort()
        for peer in peers[30:]:  # close cleanly: freed at once
            await peer.close()
        assert wait_until(lambda: srv.manager.active == 0, timeout=10)
        assert srv.manager.stats.reaped >= 1
        # Half-open TCP connections that never finish the WebSocket handshake hold no slot.
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        assert srv.manager.active == 0
        for s in socks:
            s.close()


async def test_idle_sessions_are_reaped_and_report_why():
    with running(CounterEnv, idle_timeout_s=0.3) as srv:
        client = await AsyncEnvClient(srv.url, env=CounterEnv).connect()
        await client.reset()
        assert wait_until(lambda: srv.manager.active == 0, timeout=5)
        with pytest.raises(SessionLost) as err:
            await client.step(CountAction())
        assert "idle" in err.value.details["reason"]
        await client.close()


async def test_step_timeout_closes_the_session_and_the_server_lives_on():
    with running(CounterEnv, step_timeout_s=0.3) as srv:
        client = await AsyncEnvClient(srv.url, env=CounterEnv).connect()
        other = await AsyncEnvClient(srv.url, env=CounterEnv).connect()
        await client.reset(limit=100)
        await other.reset(limit=100)
        with pytest.raises(StepTimeout) as err:
            await client.step(CountAction(sleep=2))
        assert err.value.details["session"] == "closed"
        with pytest.raises(SessionLost):
            await client.step(CountAction())
        assert (await other.step(CountAction(amount=2))).observation.total == 2
        assert httpx.get(f"{srv.url}/health").json() == {"status": "healthy"}
        await client.close()
        await other.close()


async def test_auto_reset_and_async_envs():
    with running(AutoResetEnv) as srv:
        async with AsyncEnvClient(srv.url, env=AutoResetEnv) as client:
            await client.reset(limit=1)
            assert (await client.step(CountAction())).terminated
            fresh = await client.step(CountAction())  # next-step autoreset: a reset obs
            assert fresh.observation.total == 0 and fresh.reward is None
    with running(AsyncCounterEnv) as srv:
        async with AsyncEnvClient(srv.url, env=AsyncCounterEnv) as client:
            await client.reset(seed=3)
            results = [await client.step(CountAction(amount=2)) for _ in range(3)]
            assert [r.observation.total for r in results] == [2, 4, 6]
            assert (await client.state()).episode_id == "3"

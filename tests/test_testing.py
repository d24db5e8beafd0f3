"""The in-process transport: the real client and server with memory in between."""

from __future__ import annotations

import asyncio

import pytest
from tests.support.envs import CountAction, CounterEnv, CountObservation, CountState

from corral.client import ReconnectPolicy
from corral.errors import (
    CapacityReached,
    ClientClosed,
    EpisodeEnded,
    InvalidAction,
    RequestTimeout,
    SessionLost,
    TooManyConnections,
    Unauthorized,
)
from corral.testing import InProcessServer

FAST = ReconnectPolicy(initial_delay_s=0.001, max_delay_s=0.01, give_up_after_s=5)


async def test_an_episode_and_a_clean_close():
    async with InProcessServer(CounterEnv) as server:
        async with server.client() as env:
            first = await env.reset(seed=5, limit=2)
            assert isinstance(first.observation, CountObservation) and first.info == {"seed": 5}
            result = await env.step({"amount": 2})
            assert result.reward == 2.0 and result.terminated
            with pytest.raises(EpisodeEnded):
                await env.step(CountAction())
            state = await env.state()
            assert isinstance(state, CountState) and state.history == [2]
            assert server.service.manager.active == 1
        with pytest.raises(ClientClosed):
            await env.step(CountAction())
        assert server.service.manager.active == 0  # the clean close freed the session


async def test_models_from_the_servers_schema_and_both_codecs():
    async with InProcessServer(CounterEnv) as server:
        for codec in ("msgpack", "json"):
            async with server.client(env=None, codec=codec) as env:
                await env.reset()
                step = await env.step({"amount": 3})
                assert type(step.observation).__name__ == "CountObservation"
                assert step.observation.total == 3


async def test_a_drop_resumes_the_session_with_its_episode():
    async with InProcessServer(CounterEnv) as server:
        env = server.client(reconnect=FAST)
        await env.reset(limit=100)
        await env.step(CountAction(amount=2))
        slow = asyncio.ensure_future(env.step(CountAction(amount=3, sleep=0.2)))
        await asyncio.sleep(0.05)
        assert server.drop_connections() == 1
        assert (await slow).observation.total == 5  # re-sent, applied once
        assert (await env.step(CountAction(amount=1))).observation.total == 6
        assert env.connection.reconnects == 1 and len(server.sockets) == 2
        await env.close()


async def test_timeouts_capacity_and_lost_sessions():
    async with InProcessServer(CounterEnv, max_sessions=1, step_timeout_s=0.2) as server:
        env = server.client(timeout=5)
        await env.reset(limit=100)
        with pytest.raises(CapacityReached):
            await server.client().connect()
        late = server.client(timeout=0.05)
        with pytest.raises(CapacityReached):
            await late.reset()
        with pytest.raises(Exception) as overran:  # the server's step timeout closes it
            await env.step(CountAction(sleep=1.0))
        assert overran.value.code == "STEP_TIMEOUT"
        with pytest.raises(SessionLost):
            await env.step(CountAction())
        await env.close()
    async with InProcessServer(CounterEnv) as server:
        env = server.client(timeout=0.1)
        await env.reset(limit=1000)
        with pytest.raises(RequestTimeout):
            await env.step(CountAction(amount=100, sleep=0.4))
        env.timeout = 5.0
        await asyncio.sleep(0.4)  # the late reply arrives and is dropped
        assert (await env.step(CountAction(amount=1))).observation.total == 101
        assert env.connection.tracker.stale == 1
        await env.close()


async def test_the_upgrade_is_decided_as_on_a_socket():
    token = "in-process-token-1"
    async with InProcessServer(CounterEnv, token=token, max_connections_per_client=1) as server:
        with pytest.raises(Unauthorized):
            await server.client().connect()
        async with server.client(token=token) as env:
            await env.reset()
            with pytest.raises(TooManyConnections):  # the per-address gate counts it
                await server.client(token=token).connect()
        assert server.service.gate.held == {}  # a closed socket gives its count back
        async with server.client(token=token) as again:
            await again.reset()


def test_the_sync_twin():
    with InProcessServer(CounterEnv) as server, server.sync_client() as env:
        env.reset(limit=5)
        assert env.step(CountAction(amount=2)).observation.total == 2
        with pytest.raises(InvalidAction):
            env.step({"amount": "x"})
        assert env.state().total == 2


def test_settings_are_a_config_or_keywords():
    from corral.server.config import ServerConfig

    with pytest.raises(TypeError, match="not both"):
        InProcessServer(CounterEnv, ServerConfig(), max_sessions=2)

"""The in-process transport: the real client and server with memory in between."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from tests.support.envs import CountAction, CounterEnv, CountObservation, CountState
from tests.support.pools import launched_pool, step_until_replaced

from corral.client import EnvPool, ReconnectPolicy
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
from corral.testing import InProcessNetwork, InProcessServer

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
        env = server.client(timeout=30)
        await env.reset(limit=1000)
        env.timeout = 0.1
        with pytest.raises(RequestTimeout):
            await env.step(CountAction(amount=100, sleep=0.4))
        env.timeout = 5.0
        # The late reply arrives and is dropped (waited for: a loaded machine's 0.4 s
        # sleep in the step's thread can outlast a 0.4 s sleep here, SESSION_BUSY).
        deadline = asyncio.get_running_loop().time() + 60
        while env.connection.tracker.stale < 1:
            assert asyncio.get_running_loop().time() < deadline, "the late reply never came"
            await asyncio.sleep(0.01)
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


async def test_a_pool_over_the_in_process_server_and_its_twin():
    async with InProcessServer(CounterEnv, max_batch=3) as server:
        async with server.pool(5, sessions_per_connection=2) as pool:
            first = await pool.reset(seed=10, options={"limit": 100})
            assert [info["seed"] for info in first.infos] == list(range(10, 15))
            batch = await pool.step([CountAction(amount=k) for k in range(5)])
            assert batch.obs["total"].tolist() == [0, 1, 2, 3, 4]
            assert len(pool.fleet.servers[0].links) == 3  # 5 sessions, 2 per connection
            assert server.service.manager.active == 5
        assert server.service.manager.active == 0
    with InProcessServer(CounterEnv) as server, server.pool(2).sync() as twin:
        twin.reset(options={"limit": 5})
        assert twin.step([CountAction(amount=2)] * 2).obs["total"].tolist() == [2, 2]


async def test_the_servers_http_routes_in_process():
    server = InProcessServer(CounterEnv)
    async with server, server.dialer.http(base_url=server.url) as http:
        assert (await http.get("/health")).status_code == 200
        schema = (await http.get("/schema")).json()
        assert schema["action"]["title"] == "CountAction"
        server.go_away()
        with pytest.raises(httpx.ConnectError):
            await http.get("/health")
        server.come_back()
        assert (await http.get("/metadata")).json()["name"]


async def test_a_server_that_goes_away_and_comes_back_keeps_its_episodes():
    async with InProcessNetwork() as network:
        a, b = network.serve(CounterEnv), network.serve(CounterEnv)
        assert {a.url, b.url} == {
            "http://server-1.in-process.invalid",
            "http://server-2.in-process.invalid",
        }
        # Without recovery: with it, a refused dial moves a's sessions to b at once
        # (tests/client/test_rehoming.py); here they wait for their server.
        pool = EnvPool(
            4, [a.url, b.url], env=CounterEnv, dialer=network, progress=False, recover=False
        )
        async with pool:
            await pool.reset(options={"limit": 100})
            await pool.step([CountAction(amount=1)] * 4)
            assert a.go_away() == 1  # its one connection is cut; dials fail meanwhile
            step = asyncio.ensure_future(pool.step([CountAction(amount=1)] * 4))
            await asyncio.sleep(0.2)
            assert not step.done()  # a's sessions wait for their server
            a.come_back()
            batch = await step
            assert batch.obs["total"].tolist() == [2, 2, 2, 2]  # episodes intact
            assert pool.fleet.servers[0].links[0].connection.reconnects == 1


async def test_a_killed_server_is_replaced_by_the_fleet():
    async with InProcessNetwork() as network:
        pool = launched_pool(network, on_error="return")
        async with pool:
            await pool.reset(seed=0, options={"limit": 100})  # seeded: episodes replayable
            await pool.step([CountAction(amount=1)] * 4)
            victim, old = network.servers[0], pool.server_urls[0]
            await victim.kill()
            await step_until_replaced(pool, 0, old, CountAction(amount=1))
            assert pool.server_urls[0] not in (old, pool.server_urls[1])
            assert [url for url, *_ in pool.fleet.deaths] == [old]
            # Its sessions moved with their episodes (the pool re-homes them, and the
            # fleet leaves them to it: it once opened fresh ones for them on the new
            # server while the pool moved them, and a slot was left on one server with
            # the other's session id, UNKNOWN_SESSION).
            states = await pool.state()
            assert [s.episode_id for s in states] == [f"seed-{i}" for i in range(4)]
            assert pool.stats()["restored_by_replay"] == 2
            assert_consistent(pool)
        assert network.servers == []  # the pool stopped the servers it started


async def test_a_replaced_servers_sessions_move_with_their_episodes():
    # The replacement is up before the next request (the health checks found the death
    # first): the sessions are re-homed then, not opened afresh on the new server.
    async with InProcessNetwork() as network:
        pool = launched_pool(network)
        async with pool:
            await pool.reset(seed=0, options={"limit": 100})
            await pool.step([CountAction(amount=1)] * 4)
            victim, old = network.servers[0], pool.server_urls[0]
            await victim.kill()
            deadline = asyncio.get_running_loop().time() + 120
            while pool.server_urls[0] == old or not pool.fleet.servers[0].ready.is_set():
                assert asyncio.get_running_loop().time() < deadline, "never replaced"
                await asyncio.sleep(0.02)
            batch = await pool.step([CountAction(amount=1)] * 4)
            assert not batch.errors and not batch.truncated.any()
            assert batch.obs["total"].tolist() == [2, 2, 2, 2]  # episodes intact
            assert [s.episode_id for s in await pool.state()] == [f"seed-{i}" for i in range(4)]
            assert pool.stats()["restored_by_replay"] == 2
            assert_consistent(pool)


def assert_consistent(pool: EnvPool) -> None:
    """Each session is on one link, of its own server."""
    for slot in pool.fleet.slots:
        assert slot.link is not None and slot.link.server is slot.server
        holders = [link for server in pool.fleet.servers for link in server.links]
        assert [link for link in holders if slot in link.slots] == [slot.link]


async def test_a_restarted_server_loses_its_sessions():
    async with InProcessServer(CounterEnv) as server:
        env = server.client(reconnect=FAST)
        await env.reset(limit=100)
        await env.step(CountAction(amount=2))
        await server.restart()
        with pytest.raises(SessionLost, match="restarted"):
            await env.step(CountAction(amount=1))
        await env.close()
        async with server.client() as again:  # the new instance serves new sessions
            assert (await again.reset()).observation.total == 0

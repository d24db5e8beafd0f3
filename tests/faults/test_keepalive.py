"""Keepalive on both sides: a peer that stops answering pings is detected in ~2 intervals.

The proxy swallows ping frames going one way (as some tunnels do) or stalls the link
(half-open); the side whose pings go unanswered must drop the connection within about
``ping_interval + ping_timeout``, after which the client resumes its session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from tests.faults.conftest import local_server, started
from tests.faults.envs import RecAction, RecordingEnv
from tests.support.faultproxy import DOWN, UP, FaultProxy
from tests.support.servers import port_of

from corral.client import AsyncEnvClient, ReconnectPolicy
from corral.client.local_server import LocalServer

INTERVAL = 0.4
SLACK = 5.0
"""Seconds beyond ``ping_interval + ping_timeout`` a loaded machine may take to notice
(timers fire late under load: 1 s failed at a load of 8-12). It stays well under what a
broken keepalive shows: the 10 s close timeout, or no detection at all."""
FAST = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.2, give_up_after_s=20)


@pytest.fixture(scope="module")
def quiet_server() -> Iterator[LocalServer]:
    """A server that sends no pings itself (only the client's keepalive acts)."""
    server = started(
        local_server(
            "tests.faults.envs:RecordingEnv", "--ping-interval", "0", "--resume-window", "20"
        )
    )
    yield server
    server.stop_now()


@pytest.fixture(scope="module")
def pinging_server() -> Iterator[LocalServer]:
    """A server pinging every INTERVAL seconds with an INTERVAL timeout."""
    server = started(
        local_server(
            "tests.faults.envs:RecordingEnv",
            "--ping-interval",
            str(INTERVAL),
            "--ping-timeout",
            str(INTERVAL),
            "--resume-window",
            "20",
        )
    )
    yield server
    server.stop_now()


async def time_until_dropped(c: AsyncEnvClient, limit: float = 9.0) -> float:
    """Seconds until the client's connection stops being usable."""
    started_at = time.monotonic()
    while c.connection.connected:
        if time.monotonic() - started_at > limit:
            raise AssertionError(f"connection still up after {limit} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - started_at


async def resumes_and_steps(c: AsyncEnvClient, seq: int) -> None:
    result = await c.step(RecAction(seq=seq))
    assert (result.observation.seq, result.observation.applied) == (seq, seq + 1)


async def test_client_detects_a_server_that_stops_answering_pings(quiet_server, figures):
    async with FaultProxy(port_of(quiet_server.url)) as proxy:
        c = AsyncEnvClient(
            proxy.url,
            env=RecordingEnv,
            ping_interval=INTERVAL,
            ping_timeout=INTERVAL,
            reconnect=FAST,
        )
        await c.reset()
        await resumes_and_steps(c, 0)
        proxy.drop_pings = {UP}  # the client's pings never reach the server
        detected = await time_until_dropped(c)
        proxy.drop_pings = set()
        await resumes_and_steps(c, 1)
        assert (await c.state()).applied == [0, 1]
        figures["client_detection_s"] = round(detected, 2)
        figures["ping_interval_s"] = INTERVAL
        figures["pings_dropped"] = proxy.stats["pings_dropped_up"]
        # ping_interval + ping_timeout is the worst case on an idle machine (see SLACK).
        assert detected <= 2 * INTERVAL + SLACK
        await c.close()


async def test_server_detects_a_client_that_stops_answering_pings(pinging_server, figures):
    async with FaultProxy(port_of(pinging_server.url)) as proxy:
        c = AsyncEnvClient(proxy.url, env=RecordingEnv, ping_interval=None, reconnect=FAST)
        await c.reset()
        await resumes_and_steps(c, 0)
        proxy.drop_pings = {DOWN}  # the server's pings never reach the client
        detected = await time_until_dropped(c)
        proxy.drop_pings = set()
        await resumes_and_steps(c, 1)
        assert (await c.state()).applied == [0, 1]
        figures["server_detection_s"] = round(detected, 2)
        figures["pings_dropped"] = proxy.stats["pings_dropped_down"]
        assert detected <= 2 * INTERVAL + SLACK
        await c.close()


async def test_half_open_link_is_detected_and_the_session_resumed(pinging_server, figures):
    async with FaultProxy(port_of(pinging_server.url)) as proxy:
        c = AsyncEnvClient(
            proxy.url,
            env=RecordingEnv,
            ping_interval=INTERVAL,
            ping_timeout=INTERVAL,
            reconnect=FAST,
        )
        await c.reset()
        await resumes_and_steps(c, 0)
        (link,) = proxy.links
        link.stall()  # nothing passes either way; both sockets stay open
        step = asyncio.ensure_future(c.step(RecAction(seq=1)))
        detected = await time_until_dropped(c)
        result = await asyncio.wait_for(step, 10)
        assert (result.observation.seq, result.observation.applied) == (1, 2)
        assert (await c.state()).applied == [0, 1]
        assert link.stalled  # the old link is still half-open; the session moved on
        figures["half_open_detection_s"] = round(detected, 2)
        assert detected <= 2 * INTERVAL + SLACK
        await c.close()
        async with httpx.AsyncClient(trust_env=False) as http:
            assert (await http.get(f"{pinging_server.url}/health")).status_code == 200

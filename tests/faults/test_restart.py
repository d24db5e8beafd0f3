"""A session that is gone raises SessionLost promptly: never a hang, never a new episode.

The server process is killed (SIGKILL, or SIGTERM for a graceful stop) and a new one
started behind the same address (the proxy is re-pointed at it). Every client's next
call must raise ``SessionLost`` naming the restart, within the reconnect backoff rather
than a request timeout; a session reaped while its client was away says so; a server
that never comes back ends in ``ConnectionLost`` once the reconnect budget is spent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from tests.faults.conftest import local_server
from tests.faults.envs import RecAction, RecordingEnv
from tests.support.faultproxy import FaultProxy
from tests.support.servers import port_of

from corral.client import AsyncEnvClient, ReconnectPolicy
from corral.errors import ConnectionLost, SessionLost

POLICY = ReconnectPolicy(initial_delay_s=0.05, max_delay_s=0.5, give_up_after_s=30)
REQUEST_TIMEOUT = 60.0


def recording(url: str, **kwargs: object) -> AsyncEnvClient:
    kwargs.setdefault("reconnect", POLICY)
    return AsyncEnvClient(url, env=RecordingEnv, timeout=REQUEST_TIMEOUT, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "terminated"])
async def test_restarted_server_gives_session_lost_promptly(sig, scale, figures):
    first = local_server("tests.faults.envs:RecordingEnv")
    await first.start()
    proxy = await FaultProxy(port_of(first.url)).start()
    second = None
    clients = [recording(proxy.url) for _ in range(scale.pick(10, 50))]
    try:
        await asyncio.gather(*(c.reset() for c in clients))
        await asyncio.gather(*(c.step(RecAction(seq=0)) for c in clients))
        old_instance = clients[0].server_info["server"]["instance"]
        assert first.process is not None
        os.killpg(first.process.pid, sig)
        first.process.wait(10)
        calls = [asyncio.ensure_future(c.step(RecAction(seq=1))) for c in clients]
        second = local_server("tests.faults.envs:RecordingEnv")
        await second.start()
        proxy.target_port = port_of(second.url)
        back = time.monotonic()
        results = await asyncio.wait_for(
            asyncio.gather(*calls, return_exceptions=True), REQUEST_TIMEOUT / 2
        )
        answered = time.monotonic() - back
        assert all(isinstance(r, SessionLost) for r in results), results
        reason = results[0].details["reason"]
        assert "restarted" in reason and old_instance[:12] in reason
        # Every later call fails the same way at once, and no new episode was started.
        with pytest.raises(SessionLost):
            await asyncio.wait_for(clients[0].state(), 1.0)
        async with recording(second.url) as fresh:
            assert fresh.server_info["server"]["instance"] != old_instance
            await fresh.reset()
            assert (await fresh.step(RecAction(seq=0))).observation.applied == 1
        figures["clients"] = len(clients)
        figures["session_lost"] = len(results)
        figures["seconds_after_restart"] = round(answered, 2)
        assert answered < POLICY.max_delay_s * 2 + 5.0  # backoff-bound, far below the timeout
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        await proxy.close()
        first.stop_now()
        if second is not None:
            second.stop_now()


async def test_session_reaped_while_away_gives_session_lost_with_the_reason():
    server = local_server("tests.faults.envs:RecordingEnv", "--resume-window", "0.3")
    await server.start()
    try:
        async with FaultProxy(port_of(server.url)) as proxy:
            c = recording(proxy.url)
            await c.reset()
            live = proxy.target_port
            proxy.target_port = 9  # keep the client away past the resume window
            proxy.cut_all()
            await asyncio.sleep(1.0)
            proxy.target_port = live
            with pytest.raises(SessionLost) as err:
                await asyncio.wait_for(c.step(RecAction(seq=0)), 10)
            assert "not resumed in time" in err.value.details["reason"]
            await c.close()
    finally:
        await server.stop()


async def test_server_that_never_returns_ends_in_connection_lost():
    server = local_server("tests.faults.envs:RecordingEnv")
    await server.start()
    policy = ReconnectPolicy(initial_delay_s=0.05, max_delay_s=0.2, give_up_after_s=1.5)
    c = recording(server.url, reconnect=policy)
    try:
        await c.reset()
        await server.stop()
        started_at = time.monotonic()
        with pytest.raises(ConnectionLost) as err:
            await c.step(RecAction(seq=0))
        waited = time.monotonic() - started_at
        assert err.value.details["attempts"] >= 3
        assert "not re-established" in err.value.message
        assert waited < policy.give_up_after_s + 3.0
        with pytest.raises(ConnectionLost):  # fails fast from now on
            await asyncio.wait_for(c.state(), 1.0)
    finally:
        await c.close()
        server.stop_now()

"""Pool helpers for tests: a pool that starts and replaces its own in-process servers, and
waiting out the replacement of a dead server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.support.envs import CounterEnv

from corral.client import EnvPool
from corral.envs.echo import EchoAction
from corral.errors import ConnectionLost, SessionLost
from corral.testing import InProcessNetwork


def launched_pool(network: InProcessNetwork, **kwargs: Any) -> EnvPool[Any, Any, Any]:
    """4 sessions on 2 servers the pool starts (and replaces) on ``network``, checked
    every 50 ms."""
    return EnvPool(
        4,
        network.launcher(CounterEnv),
        env=CounterEnv,
        servers=2,
        dialer=network,
        progress=False,
        health_interval=0.05,
        **kwargs,
    )


async def step_until_replaced(
    pool: EnvPool[Any, Any, Any], victim: int, old_url: str, action: Any = None
) -> None:
    """Step until the dead server's sessions answer again; only they may fail meanwhile
    (with ``action``, an echo by default)."""
    action = EchoAction(message="hi") if action is None else action
    ids = {s.index for s in pool.fleet.slots if s.server.index == victim}
    deadline = time.monotonic() + 180  # a new server (a container, an actor) on a busy machine
    while time.monotonic() < deadline:
        batch = await pool.step([action] * pool.n)
        if not batch.errors and pool.server_urls[victim] != old_url:
            break  # (a killed server may still answer a moment: wait for its successor)
        assert set(batch.errors) <= ids, batch.errors
        lost = (ConnectionLost, SessionLost)
        assert all(isinstance(e, lost) for e in batch.errors.values()), batch.errors
        await asyncio.sleep(0.05)
    assert not batch.errors
    assert pool.server_urls[victim] != old_url

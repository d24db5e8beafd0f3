"""A stalled server is not a dead one: the pool waits for a paused server and keeps its
episodes; it replaces (or gives up on) a server only when it is really gone.

Real ``corral serve`` processes, paused with SIGSTOP and resumed with SIGCONT, or
killed with SIGKILL, while an :class:`EnvPool` steps them. The times the fleet took to
suspect a stall and to declare a death are recorded in the figures report
(``docs/reliability.md`` quotes them).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.faults.conftest import local_server
from tests.support.envs import CountAction, CounterEnv
from tests.support.figures import Figures

from corral.client import EnvPool
from corral.client.local_server import LocalServer
from corral.errors import ConnectionLost, SessionLost

STALL_S = 8.0
"""How long a server stays paused: four times the health probe's 2 s timeout."""


@pytest.fixture
async def url_server() -> AsyncIterator[LocalServer]:
    server = local_server("tests.support.envs:CounterEnv", "--resume-window", "30")
    await server.start()
    try:
        yield server
    finally:
        server.stop_now()


class Stepper:
    """Steps every session of ``pool`` with amount 1 until stopped; counts and errors."""

    def __init__(self, pool: EnvPool[Any, Any, Any]) -> None:
        self.pool = pool
        self.rounds = 0
        self.errors: dict[int, BaseException] = {}
        self.totals: list[int] = []
        self.progress = asyncio.Event()
        self._stop = False
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self._stop:
            batch = await self.pool.step([CountAction(amount=1)] * self.pool.n)
            self.rounds += 1
            self.errors.update(batch.errors)
            self.totals = batch.obs["total"].tolist()
            self.progress.set()
            await asyncio.sleep(0.01)

    async def rounds_more(self, count: int, timeout: float = 120.0) -> None:
        """Wait until ``count`` more rounds completed (bounded)."""
        target = self.rounds + count
        deadline = time.monotonic() + timeout
        while self.rounds < target:
            self.progress.clear()
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"the pool made no progress ({self.rounds} rounds)"
            await asyncio.wait_for(self.progress.wait(), remaining)

    async def stop(self) -> None:
        self._stop = True
        await asyncio.wait_for(self.task, 120)


async def wait_for(predicate: Any, timeout: float = 60.0) -> float:
    """Seconds until ``predicate()`` held (bounded; fails the test past ``timeout``)."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "condition not reached in time"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def pid_of(pool: EnvPool[Any, Any, Any], url_server: LocalServer | None) -> int:
    server = url_server or pool.fleet.servers[0].handle
    assert isinstance(server, LocalServer) and server.process is not None
    return server.process.pid


@pytest.mark.parametrize("target", ["url", "started"])
async def test_a_stalled_server_keeps_its_sessions(target: str, figures: Figures):
    url_server: LocalServer | None = None
    if target == "url":
        url_server = local_server("tests.support.envs:CounterEnv", "--resume-window", "30")
        await url_server.start()
    try:
        await stall_and_resume(url_server, figures)
    finally:
        if url_server is not None:
            url_server.stop_now()


async def stall_and_resume(url_server: LocalServer | None, figures: Figures) -> None:
    pool_target = url_server.url if url_server else "tests.support.envs:CounterEnv"
    pool = EnvPool(
        4, pool_target, env=CounterEnv, health_interval=0.2, on_error="return", progress=False
    )
    async with pool:
        await pool.reset(options={"limit": 10**9})
        sessions = [slot.session for slot in pool.fleet.slots]
        server = pool.fleet.servers[0]
        pid = pid_of(pool, url_server)
        stepper = Stepper(pool)
        await stepper.rounds_more(3)
        os.killpg(pid, signal.SIGSTOP)
        try:
            detected = await wait_for(lambda: not server.ready.is_set())
            await asyncio.sleep(STALL_S - detected)
        finally:
            os.killpg(pid, signal.SIGCONT)
        await stepper.rounds_more(5)
        await stepper.stop()
        # Nothing was lost: no error, the same sessions, every step applied exactly once.
        assert stepper.errors == {}
        assert [slot.session for slot in pool.fleet.slots] == sessions
        assert stepper.totals == [stepper.rounds] * 4
        assert pool.fleet.deaths == [] and pid_of(pool, url_server) == pid
        figures["stall_detected_s"] = round(detected, 2)
        figures["stalled_s"] = STALL_S
        figures["rounds"] = stepper.rounds


async def test_a_dead_started_server_is_replaced_and_in_flight_steps_fail_loudly(
    figures: Figures,
):
    pool = EnvPool(
        2,
        "tests.support.envs:CounterEnv",
        env=CounterEnv,
        health_interval=0.2,
        on_error="return",
        progress=False,
    )
    async with pool:
        await pool.reset(options={"limit": 10**9})
        server = pool.fleet.servers[0]
        pid = pid_of(pool, None)
        # A step in flight (the env sleeps) when the server dies.
        await pool.send([CountAction(amount=1, sleep=5)] * 2)
        await asyncio.sleep(0.3)
        killed = time.monotonic()
        os.killpg(pid, signal.SIGKILL)
        batch = await pool.recv()
        assert set(batch.errors) == {0, 1}
        assert all(isinstance(e, SessionLost | ConnectionLost) for e in batch.errors.values())
        await wait_for(lambda: pool.fleet.deaths != [], timeout=60)
        declared = time.monotonic() - killed
        await wait_for(lambda: server.ready.is_set() and server.handle is not None, timeout=90)
        assert pid_of(pool, None) != pid
        assert pool.fleet.deaths[0][1] == "the server process exited"
        after = await pool.step([CountAction(amount=1)] * 2)  # reset by the pool first
        assert after.errors == {}
        figures["death_declared_s"] = round(declared, 2)


async def test_an_unreachable_url_server_is_dead_after_the_deadline(figures: Figures):
    server = local_server("tests.support.envs:CounterEnv", "--resume-window", "1")
    await server.start()
    try:
        pool = EnvPool(
            2,
            server.url,
            env=CounterEnv,
            health_interval=0.2,
            server_dead_after=3.0,
            on_error="return",
            progress=False,
        )
        async with pool:
            await pool.reset(options={"limit": 10**9})
            assert server.process is not None
            await pool.send([CountAction(amount=1, sleep=30)] * 2)
            await asyncio.sleep(0.3)
            os.killpg(server.process.pid, signal.SIGSTOP)  # never answers again
            batch = await pool.recv()
            # The in-flight steps fail with SessionLost once the deadline passed.
            assert set(batch.errors) == {0, 1}
            assert all(isinstance(e, SessionLost) for e in batch.errors.values()), batch.errors
            death = pool.fleet.deaths[0]
            assert death[1].startswith("the server did not answer for 3 s")
            assert death[2] >= 3.0
            later = await pool.step([CountAction(amount=1)] * 2)
            assert all(isinstance(e, SessionLost) for e in later.errors.values())
            figures["unreachable_declared_dead_s"] = round(death[2], 2)
            os.killpg(server.process.pid, signal.SIGCONT)
    finally:
        server.stop_now()


async def test_a_deadline_within_the_resume_window_is_refused(url_server: LocalServer):
    pool = EnvPool(1, url_server.url, env=CounterEnv, server_dead_after=5.0, progress=False)
    with pytest.raises(ValueError, match="resume window"):
        await pool.start()
    await pool.close()

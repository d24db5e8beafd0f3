"""Environments that overrun or raise: a structured error, a clear session state, a
healthy server.

A step beyond the step timeout gets ``StepTimeout`` saying the session was closed; the
session then answers ``SessionLost`` with that reason, its slot is freed, and the other
sessions never notice. An environment raising anything at all (``SystemExit`` and
``KeyboardInterrupt`` included) from reset, step, state or close yields ``ENV_ERROR`` and
the session stays usable; the server process keeps serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from tests.faults.conftest import local_server, started
from tests.faults.envs import (
    AsyncRaisingEnv,
    RaiseAction,
    RaisingEnv,
    RecAction,
    RecordingEnv,
)

from corral.client import AsyncEnvClient
from corral.client.local_server import LocalServer
from corral.errors import EnvError, FactoryError, InvalidAction, SessionLost, StepTimeout

KINDS = ["runtime", "value", "recursion", "memory", "keyboard", "exit"]


@pytest.fixture(scope="module")
def slow_server() -> Iterator[LocalServer]:
    server = started(
        local_server(
            "tests.faults.envs:RecordingEnv", "--step-timeout", "0.5", "--executor-threads", "2"
        )
    )
    yield server
    server.stop_now()


@pytest.fixture(scope="module", params=["sync", "async"])
def raising_server(request: pytest.FixtureRequest) -> Iterator[tuple[LocalServer, type]]:
    env = RaisingEnv if request.param == "sync" else AsyncRaisingEnv
    server = started(local_server(f"tests.faults.envs:{env.__name__}"))
    yield server, env
    server.stop_now()


async def healthy(url: str) -> dict:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
        assert (await http.get(f"{url}/health")).json() == {"status": "healthy"}
        return (await http.get(f"{url}/ready")).json()


async def test_step_beyond_the_timeout(slow_server, figures):
    url = slow_server.url
    before = (await healthy(url))["active_sessions"]
    victim = AsyncEnvClient(url, env=RecordingEnv)
    bystanders = [AsyncEnvClient(url, env=RecordingEnv) for _ in range(3)]
    await asyncio.gather(victim.reset(), *(b.reset() for b in bystanders))

    async def keep_stepping(c: AsyncEnvClient) -> int:
        for seq in range(40):
            assert (await c.step(RecAction(seq=seq))).observation.applied == seq + 1
            await asyncio.sleep(0.02)
        return 40

    stepping = [asyncio.ensure_future(keep_stepping(b)) for b in bystanders]
    with pytest.raises(StepTimeout) as err:
        await victim.step(RecAction(seq=0, sleep=2.0))
    assert err.value.details["session"] == "closed"
    assert err.value.details["timeout_s"] == 0.5
    with pytest.raises(SessionLost) as lost:
        await victim.state()
    assert "step timeout" in lost.value.details["reason"]
    assert sum(await asyncio.gather(*stepping)) == 120  # nobody else noticed
    ready = await healthy(url)
    assert ready["active_sessions"] == before + len(bystanders)  # the victim's slot is free
    await asyncio.gather(victim.close(), *(b.close() for b in bystanders))
    figures["timeouts"] = 1
    figures["bystander_steps_ok"] = 120


async def test_hung_steps_never_starve_the_server_of_threads(slow_server, figures):
    """More steps hang than the server has threads; new sessions are served all the same."""
    hung = [AsyncEnvClient(slow_server.url, env=RecordingEnv) for _ in range(4)]
    await asyncio.gather(*(h.reset() for h in hung))
    results = await asyncio.gather(
        *(h.step(RecAction(seq=0, sleep=4.0)) for h in hung), return_exceptions=True
    )
    assert all(isinstance(r, StepTimeout) for r in results), results
    async with AsyncEnvClient(slow_server.url, env=RecordingEnv) as fresh:
        await fresh.reset()
        for seq in range(20):
            assert (await fresh.step(RecAction(seq=seq))).observation.applied == seq + 1
    await asyncio.gather(*(h.close() for h in hung))
    await healthy(slow_server.url)
    figures["hung_steps"] = len(hung)
    figures["threads"] = 2


@pytest.mark.parametrize("kind", KINDS)
async def test_env_raising_anywhere_gives_env_error(raising_server, kind, figures):
    server, env = raising_server
    async with AsyncEnvClient(server.url, env=env) as c:
        with pytest.raises(EnvError) as err:
            await c.reset(fail={"reset": kind})
        assert err.value.details["op"] == "reset"
        await c.reset(fail={"state": kind, "close": kind})
        with pytest.raises(EnvError):
            await c.step(RaiseAction(raise_in=kind))
        with pytest.raises(EnvError):
            await c.state()
        with pytest.raises(InvalidAction):  # a custom validator's error, not a dead session
            await c.step({"note": "invalid"})
        assert (await c.step(RaiseAction())).observation.ok  # the session lives on
    # close() raised inside the env: the client closed cleanly and the slot is free.
    ready = await healthy(server.url)
    assert ready["active_sessions"] == 0
    async with AsyncEnvClient(server.url, env=env) as again:
        await again.reset()
        assert (await again.step(RaiseAction())).observation.ok
    figures.add("env_errors", 3)


async def test_constructor_raising_systemexit_gives_factory_error():
    server = local_server("tests.faults.envs:ExplodingEnv")
    await server.start()
    try:
        client = AsyncEnvClient(server.url, env=RecordingEnv)
        for _ in range(3):  # the connection survives and the open can be retried
            with pytest.raises(FactoryError) as err:
                await client.connect()
            assert "SystemExit" in err.value.message
        await client.close()
        assert (await healthy(server.url))["active_sessions"] == 0
    finally:
        await server.stop()

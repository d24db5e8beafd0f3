"""The async client and its sync twin against a real server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time

import pytest
from tests.support.envs import CountAction, CounterEnv, CountObservation, CountState
from tests.support.servers import running

from corral.client import AsyncEnvClient, SyncEnvClient
from corral.client.connection import http_url, ws_url
from corral.client.local_server import LocalServer
from corral.contract import Environment
from corral.envs.echo import EchoAction, EchoEnv
from corral.errors import (
    ClientClosed,
    ConnectionLost,
    ContractMismatch,
    EnvError,
    FrameTooLarge,
    InvalidAction,
    RequestTimeout,
    ResetRequired,
)
from corral.testing import InProcessServer


def test_urls():
    assert ws_url("http://h:1") == "ws://h:1/ws"
    assert ws_url("https://h:1/base/") == "wss://h:1/base/ws"
    assert ws_url("ws://h:1/ws") == "ws://h:1/ws"
    assert http_url("ws://h:1/ws") == "http://h:1"
    assert http_url("h:2") == "http://h:2"
    with pytest.raises(ValueError, match="scheme"):
        ws_url("ftp://h")


@pytest.fixture(scope="module")
def server():
    with running(CounterEnv, max_frame_bytes=32 * 1024) as srv:
        yield srv


async def test_late_reply_is_never_taken_for_the_next_answer(server):
    client = AsyncEnvClient(server.url, env=CounterEnv, timeout=0.2)
    await client.reset(limit=1000)
    with pytest.raises(RequestTimeout):
        await client.step(CountAction(amount=100, sleep=0.6))
    client.timeout = 5.0
    await asyncio.sleep(0.6)  # the slow step's reply arrives now and must be dropped
    state = await client.state()
    assert state.total == 100  # the slow step did happen on the server...
    nxt = await client.step(CountAction(amount=1))
    assert nxt.observation.total == 101  # ...and this reply is this step's, not the late one
    assert client.connection.tracker.stale == 1
    await client.close()


async def test_one_timer_serves_requests_of_any_timeout(server):
    # A connection keeps one timer armed for its earliest deadline, and a reply leaves
    # it armed: a later request with a further deadline must not time out when it
    # rings, and one with a nearer deadline must move it.
    client = AsyncEnvClient(server.url, env=CounterEnv, timeout=0.3)
    await client.reset(limit=1000)
    await client.step(CountAction(amount=1))  # the timer is now armed 0.3 s ahead
    client.timeout = 30.0
    assert (await client.step(CountAction(amount=1, sleep=0.6))).observation.total == 2
    client.timeout = 0.2
    with pytest.raises(RequestTimeout):
        await client.step(CountAction(amount=1, sleep=0.6))  # nearer than the 30 s one
    await client.close()


@pytest.fixture
async def in_process():
    async with InProcessServer(CounterEnv, max_frame_bytes=32 * 1024) as srv:
        yield srv


# Contract behaviour, not the transport's: in process (corral.testing).


async def test_typed_results_and_errors(in_process):
    async with in_process.client() as client:
        with pytest.raises(ResetRequired):
            await client.step(CountAction())
        first = await client.reset(seed=5, label="x")
        assert isinstance(first.observation, CountObservation)
        assert first.info == {"seed": 5} and first.observation.label == "x"
        with pytest.raises(InvalidAction):
            await client.step({"amount": "many"})  # caught locally, same exception
        with pytest.raises(EnvError):
            await client.step(CountAction(fail=True))
        with pytest.raises(FrameTooLarge):
            await client.step(CountAction(note="x" * 40_000))
        result = await client.step({"amount": 3})
        assert result.reward == 3.0 and not result.done
        state = await client.state()
        assert isinstance(state, CountState) and state.history == [3]
    with pytest.raises(ClientClosed):
        await client.step(CountAction())


async def test_contract_mismatch_is_caught_at_connect(in_process):
    class Renamed(Environment[EchoAction, CountObservation, CountState]):
        contract_version = "2.0.0"

    with pytest.raises(ContractMismatch) as err:
        await in_process.client(env=Renamed).connect()
    assert err.value.details["server_version"] == "1.0.0"


async def test_models_from_the_servers_schema(in_process):
    async with in_process.client(env=None) as client:  # no classes given
        result = await client.reset(seed=1)
        assert type(result.observation).__name__ == "CountObservation"
        assert result.observation.blob == bytes(range(256))
        step = await client.step({"amount": 2})
        assert step.observation.total == 2
        with pytest.raises(InvalidAction):
            await client.step({"amount": "x"})


async def test_many_sessions_concurrently(in_process):
    clients = [in_process.client() for _ in range(20)]
    await asyncio.gather(*(c.reset(limit=100) for c in clients))
    totals = await asyncio.gather(*(c.step(CountAction(amount=i)) for i, c in enumerate(clients)))
    assert [t.observation.total for t in totals] == list(range(20))
    await asyncio.gather(*(c.close() for c in clients))


# The transport and the blocking twin's threads: a real server.


def test_sync_twin_in_a_script_and_inside_a_running_loop(server):
    with AsyncEnvClient(server.url, env=CounterEnv).sync() as env:
        env.reset(limit=5)
        assert env.step(CountAction(amount=2)).observation.total == 2
        with pytest.raises(InvalidAction):
            env.step({"amount": "x"})
        assert env.state().total == 2

    async def notebook_cell():  # Jupyter runs cells inside a running loop
        env = SyncEnvClient.connect_to(server.url, env=CounterEnv)
        env.reset()
        result = env.step(CountAction(amount=4))
        env.close()
        return result

    assert asyncio.run(notebook_cell()).observation.total == 4


def test_sync_call_timeout(server):
    env = AsyncEnvClient(server.url, env=CounterEnv, timeout=0.2).sync()
    env.reset(limit=100)
    with pytest.raises(RequestTimeout):
        env.step(CountAction(sleep=0.5))
    env.close()


async def test_connection_refused_is_clear():
    with pytest.raises(ConnectionLost, match="cannot connect"):
        await AsyncEnvClient("http://127.0.0.1:9", connect_timeout=2).connect()


async def test_from_env_starts_and_stops_a_server_process():
    client = await AsyncEnvClient.from_env("corral.envs.echo:EchoEnv", env=EchoEnv)
    server = client.server
    assert server is not None and server.running
    result = await client.reset()
    assert result.observation.echoed_message == "ready"
    assert (await client.step(EchoAction(message="hi"))).reward == pytest.approx(0.2)
    await client.close()
    assert not server.running


async def test_launcher_reports_a_crashing_server():
    server = LocalServer("corral.envs.echo:NoSuchEnv", startup_timeout=20)
    with pytest.raises(ConnectionLost) as err:
        await server.start()
    assert "NoSuchEnv" in str(err.value)
    assert not server.running


def test_servers_die_with_their_parent(tmp_path):
    script = tmp_path / "parent.py"
    pid_file = tmp_path / "pid"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, os, sys
            from corral.client.local_server import LocalServer
            async def main():
                server = LocalServer("corral.envs.echo:EchoEnv")
                await server.start()
                open({str(pid_file)!r}, "w").write(str(server.process.pid))
                if sys.argv[1] == "kill":
                    os.kill(os.getpid(), 9)   # no atexit, no cleanup: PDEATHSIG must act
            asyncio.run(main())             # normal exit: atexit stops the server
            """
        )
    )
    for mode in ("exit", "kill"):
        subprocess.run([sys.executable, str(script), mode], timeout=60, check=False)
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), f"server {pid} outlived its parent ({mode})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False

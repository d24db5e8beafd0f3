"""``corral serve --workers N`` through a real server process."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from tests.support.process_envs import AsyncPidEnv, PidEnv
from tests.support.raw import RawPeer

from corral.client.local_server import LocalServer
from corral.errors import ErrorCode
from corral.server.workers import env_reference


def worker_pids(server: LocalServer) -> set[int]:
    assert server.process is not None
    children = f"/proc/{server.process.pid}/task/{server.process.pid}/children"
    with open(children) as f:
        return {int(p) for p in f.read().split()}


async def start(target: str, *args: str) -> LocalServer:
    server = LocalServer(target, server_args=["--workers", "2", *args], startup_timeout=60)
    await server.start()
    return server


async def sessions(peer: RawPeer, n: int) -> list[str]:
    sids = [await peer.open_session() for _ in range(n)]
    reply = await peer.request({"type": "reset_batch", "items": [{"session": s} for s in sids]})
    assert all("observation" in r for r in reply["results"]), reply
    return sids


def step_batch(items):
    return {"type": "step_batch", "items": [{"session": s, "action": a} for s, a in items]}


@pytest.fixture(scope="module")
def server():
    srv = asyncio.run(start("tests.support.process_envs:PidEnv", "--step-timeout", "1"))
    yield srv
    srv.stop_now()


async def test_sessions_are_spread_over_workers_and_pinned(server):
    peer = await RawPeer.open(server.url)
    sids = await sessions(peer, 4)
    workers = worker_pids(server)
    assert len(workers) == 2 and server.process.pid not in workers
    seen = {}
    for _ in range(3):
        for sid in sids:
            reply = await peer.request({"type": "step", "session": sid, "action": {}})
            seen.setdefault(sid, set()).add(reply["observation"]["pid"])
    assert all(len(pids) == 1 for pids in seen.values())  # pinned to one worker
    assert set().union(*seen.values()) == workers  # spread over both
    state = await peer.request({"type": "state", "session": sids[0]})
    assert state["state"]["step_count"] == 3
    await peer.close()


async def test_batches_through_workers_keep_per_session_errors(server):
    peer = await RawPeer.open(server.url)
    a, b, c = await sessions(peer, 3)
    reply = await peer.request(step_batch([(a, {}), (b, {"fail": True}), (c, {"spin": 0.01})]))
    results = reply["results"]
    assert results[1]["error"]["code"] == ErrorCode.ENV_ERROR
    assert "ValueError: failed on purpose" in results[1]["error"]["message"]
    assert [results[i]["observation"]["steps"] for i in (0, 2)] == [1, 1]
    lockstep = await peer.request({"type": "step", "session": b, "action": {"fail": True}})
    assert lockstep["code"] == ErrorCode.ENV_ERROR
    again = await peer.request(step_batch([(b, {})]))
    assert again["results"][0]["observation"]["steps"] == 1  # b lives on
    await peer.close()


async def test_a_step_timeout_closes_only_its_session(server):
    peer = await RawPeer.open(server.url)
    slow, other = await sessions(peer, 2)
    reply = await peer.request(
        {"type": "step", "session": slow, "action": {"sleep": 3}}, timeout=20
    )
    assert reply["code"] == ErrorCode.STEP_TIMEOUT
    lost = await peer.request({"type": "step", "session": slow, "action": {}})
    assert lost["code"] == ErrorCode.SESSION_LOST
    ok = await peer.request({"type": "step", "session": other, "action": {}})
    assert ok["type"] == "result"
    await peer.close()


async def test_a_dead_worker_loses_its_sessions_and_is_replaced():
    server = await start("tests.support.process_envs:AsyncPidEnv")
    try:
        peer = await RawPeer.open(server.url)
        sids = await sessions(peer, 4)
        pids = {}
        for sid in sids:
            reply = await peer.request({"type": "step", "session": sid, "action": {}})
            pids[sid] = reply["observation"]["pid"]
        victim = pids[sids[0]]
        os.kill(victim, signal.SIGKILL)
        for _ in range(100):
            if victim not in worker_pids(server) and len(worker_pids(server)) == 2:
                break
            await asyncio.sleep(0.1)
        for sid in sids:
            reply = await peer.request({"type": "step", "session": sid, "action": {}})
            if pids[sid] == victim:
                assert reply["code"] == ErrorCode.SESSION_LOST
                assert "worker process died" in reply["message"]
            else:
                assert reply["observation"]["steps"] == 2
        fresh = await sessions(peer, 2)
        reply = await peer.request(step_batch([(s, {}) for s in fresh]))
        assert {r["observation"]["pid"] for r in reply["results"]} <= worker_pids(server)
        await peer.close()
    finally:
        await server.stop()


def test_workers_need_an_importable_environment():
    assert env_reference(PidEnv) == "tests.support.process_envs:PidEnv"
    assert env_reference(AsyncPidEnv) == "tests.support.process_envs:AsyncPidEnv"

    class Local(PidEnv):
        pass

    with pytest.raises(ValueError, match="importable by name"):
        env_reference(Local)
    with pytest.raises(ValueError, match="importable by name"):
        env_reference(lambda: PidEnv())


async def test_a_broken_environment_fails_at_start():
    server = LocalServer(
        "tests.support.envs:BrokenFactoryEnv", server_args=["--workers", "1"], startup_timeout=30
    )
    await server.start()  # the factory runs per session, so start succeeds
    try:
        peer = await RawPeer.open(server.url)
        reply = await peer.request({"type": "open"})
        assert reply["code"] == ErrorCode.FACTORY_ERROR
        await peer.close()
    finally:
        await server.stop()

"""``corral serve --workers N`` through a real server process."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import httpx
import pytest
from tests.support.process_envs import AsyncPidEnv, PidEnv
from tests.support.raw import RawPeer
from tests.support.starting_envs import FLAG

from corral.client.local_server import LocalServer
from corral.errors import ErrorCode
from corral.server.workers import backoff_s, env_reference


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


async def until(predicate: Callable[[], bool], seconds: float = 120.0) -> None:
    """Wait (bounded) until ``predicate()`` holds."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.1)


def get(server: LocalServer, path: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", timeout=30)


async def test_a_slot_whose_replacement_dies_while_starting_is_retried(tmp_path):
    """Issue 30.5: a replacement worker that dies while starting is retried with back-off
    until one starts; meanwhile /health, /ready, /metrics and the capacity say so."""
    flag = tmp_path / "die-at-start"
    server = LocalServer(
        "tests.support.starting_envs:StartingEnv",
        server_args=["--workers", "2", "--max-sessions", "4"],
        env={FLAG: str(flag)},
        startup_timeout=60,
    )
    await server.start()
    try:
        peer = await RawPeer.open(server.url)
        a, b = await sessions(peer, 2)
        reply = await peer.request(step_batch([(a, {}), (b, {})]))
        pids = [r["observation"]["pid"] for r in reply["results"]]
        assert len(set(pids)) == 2  # one session on each worker
        flag.touch()  # from now on every worker dies while starting
        os.kill(pids[0], signal.SIGKILL)

        def report() -> dict:
            return get(server, "/ready").json()["workers"]

        await until(lambda: report()["start_failures"] >= 2)
        workers = report()
        assert workers["alive"] == 1 and len(workers["down"]) == 1
        assert "failed to start" in next(iter(workers["down"].values()))
        assert workers["capacity"] == 2  # half the slots, half of max_sessions
        health = get(server, "/health").json()
        assert health["status"] == "degraded" and health["workers"]["alive"] == 1
        lost = await peer.request({"type": "step", "session": a, "action": {}})
        assert lost["code"] == ErrorCode.SESSION_LOST
        assert get(server, "/ready").status_code == 200  # 1 session of the 2 it holds now
        (c,) = await sessions(peer, 1)
        full = get(server, "/ready")
        assert full.status_code == 503 and "being restarted" in full.json()["reason"]
        refused = await peer.request({"type": "open"})
        assert refused["code"] == ErrorCode.NOT_READY, refused
        metrics = get(server, "/metrics").text
        assert 'corral_workers{state="down"} 1.0' in metrics
        assert "corral_sessions_capacity 2.0" in metrics
        assert "corral_worker_start_failures_total" in metrics

        os.kill(pids[1], signal.SIGKILL)  # both slots gone: not ready at all
        await until(lambda: report()["alive"] == 0)
        ready = get(server, "/ready")
        assert ready.status_code == 503 and "no worker process" in ready.json()["reason"]
        assert (await peer.request({"type": "open"}))["code"] == ErrorCode.NOT_READY

        failures = report()["start_failures"]
        flag.unlink()  # the environment imports again: both slots come back
        await until(lambda: report()["alive"] == 2)
        assert report()["down"] == {} and report()["start_failures"] >= failures
        assert get(server, "/health").json()["status"] == "healthy"
        assert get(server, "/ready").status_code == 200
        fresh = await sessions(peer, 2)
        reply = await peer.request(step_batch([(s, {}) for s in fresh]))
        assert len({r["observation"]["pid"] for r in reply["results"]}) == 2
        assert (await peer.request({"type": "step", "session": c, "action": {}}))["code"] == (
            ErrorCode.SESSION_LOST
        )
        await peer.close()
    finally:
        server.stop_now()


def test_the_back_off_grows_to_its_cap():
    assert [backoff_s(n) for n in range(8)] == [0, 0.5, 1, 2, 4, 8, 16, 30]
    assert backoff_s(10_000) == 30

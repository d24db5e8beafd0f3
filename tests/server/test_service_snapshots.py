"""Snapshot and restore through real servers on 127.0.0.1, both codecs: the state carries
on exactly, every error code, the runner's rules (thread affinity, async, step timeout)
and worker processes."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.raw import RawPeer
from tests.support.servers import ThreadServer, running, wait_until
from tests.support.snapshot_envs import (
    AffineTallyEnv,
    AsyncTallyEnv,
    NoSnapshotEnv,
    TallyAction,
    TallyEnv,
)

from corral.client import AsyncEnvClient
from corral.client.local_server import LocalServer
from corral.errors import (
    BadSnapshot,
    ContractMismatch,
    EpisodeEnded,
    ResetRequired,
    SnapshotUnsupported,
)
from corral.protocol.snapshot import SessionSnapshot

CODECS = ["msgpack", "json"]
KEY = b"k" * 32


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    with running(TallyEnv, step_timeout_s=2.0, max_sessions=16) as srv:
        yield srv


def client(server: ThreadServer, codec: str = "msgpack", **kwargs: Any) -> AsyncEnvClient:
    return AsyncEnvClient(server.url, env=TallyEnv, codec=codec, **kwargs)


def same(a: Any, b: Any) -> bool:
    """Observations equal but for where they ran (process, thread)."""
    strip = {"pid", "thread"}
    return a.model_dump(exclude=strip) == b.model_dump(exclude=strip)


@pytest.mark.parametrize("codec", CODECS)
async def test_a_restored_session_continues_exactly_where_the_snapshot_was(
    server: ThreadServer, codec: str
) -> None:
    async with client(server, codec) as source, client(server, codec) as copy_:
        await source.reset(seed=7)
        last = None
        for add in (1, 2, 3):
            last = await source.step(TallyAction(add=add))
        saved = await source.snapshot()
        assert isinstance(saved, SessionSnapshot) and saved.env == "tally"
        assert saved.position.episodes == 1 and saved.position.steps == 3
        restored = await copy_.restore(saved)
        assert last is not None and same(restored.observation, last.observation)
        assert restored.reward == 3.0 and not restored.done
        for add in (4, 5, 6):
            a, b = await source.step(TallyAction(add=add)), await copy_.step(TallyAction(add=add))
            assert same(a.observation, b.observation)  # the random walk too
        assert (await source.state()) == (await copy_.state())
        position = server.manager.sessions[copy_.session_id].machine.position()
        assert position == server.manager.sessions[source.session_id].machine.position()


async def test_a_snapshot_crosses_codecs_and_restore_replaces_the_clients_session(
    server: ThreadServer,
) -> None:
    async with client(server, "msgpack") as source, client(server, "json") as other:
        await source.reset(seed=3)
        await source.step(TallyAction(add=2))
        saved = await source.snapshot()
        await other.reset(seed=99)
        old = other.session_id
        result = await other.restore(saved)
        assert other.session_id != old and result.observation.count == 2
        assert old not in server.manager.sessions  # the replaced session was closed
        assert (await other.step(TallyAction(add=1))).observation.count == 3
        # The source went on unchanged.
        assert (await source.step(TallyAction(add=1))).observation.count == 3


async def test_fork_gives_independent_sessions_at_the_same_state(server: ThreadServer) -> None:
    async with client(server) as source:
        await source.reset(seed=11)
        await source.step(TallyAction(add=5))
        forks = await source.fork(3)
        try:
            ids = {f.session_id for f in forks} | {source.session_id}
            assert len(ids) == 4
            walks = {(await f.step(TallyAction(add=1))).observation.walk for f in forks}
            assert len(walks) == 1  # the same generator state in each
            counts = [
                (await f.step(TallyAction(add=n))).observation.count for n, f in enumerate(forks)
            ]
            assert counts == [6, 7, 8]  # then each its own way
            assert (await source.state()).count == 5
        finally:
            await asyncio.gather(*(f.close() for f in forks))
    with pytest.raises(ValueError, match="n >= 1"):
        await client(server).fork(0)


async def test_the_lifecycle_position_travels_with_the_snapshot(server: ThreadServer) -> None:
    async with client(server) as source, client(server) as copy_:
        fresh = await source.snapshot()  # a session never reset
        assert fresh.position.phase.value == "new"
        await copy_.restore(fresh)
        with pytest.raises(ResetRequired):
            await copy_.step(TallyAction())
        await source.reset(seed=1)
        ended = await source.step(TallyAction(add=100))
        assert ended.done
        saved = await source.snapshot()
        assert saved.position.phase.value == "ended"
        again = await copy_.restore(saved)
        assert again.done and again.observation.count == 100
        with pytest.raises(EpisodeEnded):
            await copy_.step(TallyAction())
        assert (await copy_.reset(seed=2)).observation.count == 0


@pytest.mark.parametrize("codec", CODECS)
async def test_a_resent_snapshot_request_is_answered_from_the_cache(
    server: ThreadServer, codec: str
) -> None:
    peer = await RawPeer.open(server.url, codec)
    try:
        sid = await peer.open_session()
        await peer.request({"type": "reset", "session": sid, "seed": 1})
        first = await peer.request({"id": 50, "type": "snapshot", "session": sid})
        again = await peer.request({"id": 50, "type": "snapshot", "session": sid})
        assert first["type"] == "snapshot" and again == first
    finally:
        await peer.close()


# -- errors, each through a real server on both codecs ----------------------------------------


async def snapshot_of(peer: RawPeer, **action: Any) -> tuple[str, dict[str, Any]]:
    sid = await peer.open_session()
    assert (await peer.request({"type": "reset", "session": sid, "seed": 5}))["type"] == "result"
    if action:
        reply = await peer.request({"type": "step", "session": sid, "action": action})
        assert reply["type"] == "result", reply
    reply = await peer.request({"type": "snapshot", "session": sid})
    assert reply["type"] == "snapshot", reply
    return sid, reply["snapshot"]


def code(reply: dict[str, Any]) -> str:
    assert reply["type"] == "error", reply
    return str(reply["code"])


@pytest.mark.parametrize("codec", CODECS)
async def test_an_environment_without_snapshots_says_how_to_declare_one(codec: str) -> None:
    with running(NoSnapshotEnv) as plain, running(TallyEnv) as tally:
        source = await RawPeer.open(tally.url, codec)
        peer = await RawPeer.open(plain.url, codec)
        try:
            _, envelope = await snapshot_of(source)
            sid = await peer.open_session()
            reply = await peer.request({"type": "snapshot", "session": sid})
            assert code(reply) == "SNAPSHOT_UNSUPPORTED"
            assert (
                "declares no snapshot" in reply["message"] and "snapshot(self)" in reply["message"]
            )
            assert code(await peer.request({"type": "restore", "snapshot": envelope})) == (
                "SNAPSHOT_UNSUPPORTED"
            )
            state = await peer.request({"type": "state", "session": sid})
            assert state["type"] == "state"  # the session lives on
        finally:
            await asyncio.gather(source.close(), peer.close())
        async with AsyncEnvClient(plain.url, env=NoSnapshotEnv, codec=codec) as env:
            with pytest.raises(SnapshotUnsupported, match="cannot fork this session"):
                await env.fork(2)


@pytest.mark.parametrize("codec", CODECS)
async def test_too_large_snapshots_and_replies_are_refused(codec: str) -> None:
    with running(TallyEnv, max_snapshot_bytes=20_000) as srv:
        peer = await RawPeer.open(srv.url, codec)
        try:
            welcome = await peer.request({"type": "hello", "protocol": "corral/1"})
            assert welcome["limits"]["max_snapshot_bytes"] == 20_000
            sid, _ = await snapshot_of(peer)
            step = {"type": "step", "session": sid, "action": {"pad": 30_000}}
            assert (await peer.request(step))["type"] == "result"
            reply = await peer.request({"type": "snapshot", "session": sid})
            assert code(reply) == "SNAPSHOT_TOO_LARGE"
            assert reply["details"]["limit"] == 20_000 and reply["details"]["size"] > 30_000
            small = await peer.request(
                {"type": "step", "session": sid, "action": {"add": 0, "pad": 0}}
            )
            assert small["type"] == "result"  # the session lives on
        finally:
            await peer.close()
        # The client's announced frame limit: the existing REPLY_TOO_LARGE path.
        shy = await RawPeer.open(srv.url, codec, hello=False)
        try:
            hello = {"type": "hello", "protocol": "corral/1", "max_frame_bytes": 4000}
            assert (await shy.request(hello))["type"] == "welcome"
            sid = await shy.open_session()
            await shy.request({"type": "reset", "session": sid, "seed": 1})
            await shy.request({"type": "step", "session": sid, "action": {"pad": 5000}})
            assert code(await shy.request({"type": "snapshot", "session": sid})) == (
                "REPLY_TOO_LARGE"
            )
        finally:
            await shy.close()


@pytest.mark.parametrize("codec", CODECS)
async def test_bad_snapshots_are_refused_and_take_no_slot(server: ThreadServer, codec: str) -> None:
    peer = await RawPeer.open(server.url, codec)
    try:
        _, envelope = await snapshot_of(peer, add=4)
        active = server.manager.active
        malformed = {**envelope, "position": {**envelope["position"], "phase": "closed"}}
        other_env = {**envelope, "env": "wordle"}
        failing = copy.deepcopy(envelope)
        failing["snapshot"]["count"] = "many"
        major = {**envelope, "contract": {**envelope["contract"], "version": "2.0.0"}}
        for bad, expected in [
            (malformed, "BAD_SNAPSHOT"),
            ({"format": "pickle"}, "BAD_SNAPSHOT"),
            (other_env, "BAD_SNAPSHOT"),
            (failing, "BAD_SNAPSHOT"),
            (major, "CONTRACT_MISMATCH"),
        ]:
            reply = await peer.request({"type": "restore", "snapshot": bad})
            assert code(reply) == expected, bad
        assert code(await peer.request({"type": "restore"})) == "BAD_MESSAGE"
        assert server.manager.active == active
        assert (await peer.request({"type": "restore", "snapshot": envelope}))["type"] == "restored"
    finally:
        await peer.close()


@pytest.mark.parametrize("codec", CODECS)
async def test_a_fleet_key_signs_snapshots_and_refuses_forged_ones(codec: str) -> None:
    with (
        running(TallyEnv, fleet_key=KEY) as first,
        running(TallyEnv, fleet_key=KEY) as second,
        running(TallyEnv, fleet_key=b"another key of the right length!!") as stranger,
        running(TallyEnv) as keyless,
    ):
        a = await RawPeer.open(first.url, codec)
        b = await RawPeer.open(second.url, codec)
        c = await RawPeer.open(stranger.url, codec)
        d = await RawPeer.open(keyless.url, codec)
        try:
            _, signed = await snapshot_of(a, add=3)
            assert signed["sig"].startswith("hmac-sha256:")
            moved = await b.request({"type": "restore", "snapshot": signed})
            assert moved["type"] == "restored" and moved["observation"]["count"] == 3
            forged = copy.deepcopy(signed)
            forged["snapshot"]["count"] = 99
            reply = await b.request({"type": "restore", "snapshot": forged})
            assert code(reply) == "BAD_SNAPSHOT" and "signature does not match" in reply["message"]
            assert code(await c.request({"type": "restore", "snapshot": signed})) == "BAD_SNAPSHOT"
            _, unsigned = await snapshot_of(d, add=1)
            assert "sig" not in unsigned
            reply = await b.request({"type": "restore", "snapshot": unsigned})
            assert code(reply) == "BAD_SNAPSHOT" and "not signed" in reply["message"]
            # A keyless server restores what the model admits, signed or not.
            assert (await d.request({"type": "restore", "snapshot": signed}))["type"] == "restored"
        finally:
            await asyncio.gather(a.close(), b.close(), c.close(), d.close())


async def test_the_client_raises_each_refusal_as_its_exception(server: ThreadServer) -> None:
    async with client(server) as source, client(server, "json") as other:
        await source.reset(seed=1)
        saved = await source.snapshot()
        with pytest.raises(BadSnapshot):
            await other.restore(SessionSnapshot.from_wire({**saved.to_wire(), "env": "x"}))
        newer = SessionSnapshot.from_wire(
            {**saved.to_wire(), "contract": {"version": "9.0.0", "fingerprint": "sha256:1"}}
        )
        with pytest.raises(ContractMismatch):
            await other.restore(newer)


@pytest.mark.parametrize("codec", CODECS)
async def test_busy_and_closed_sessions_refuse_a_snapshot(server: ThreadServer, codec: str) -> None:
    peer = await RawPeer.open(server.url, codec)
    try:
        sid, _ = await snapshot_of(peer, add=1, snapshot_sleep=0.5)
        slow = await peer.send({"type": "snapshot", "session": sid})
        busy = await peer.request({"type": "snapshot", "session": sid})
        assert code(busy) == "SESSION_BUSY"
        while (reply := await peer.recv())["id"] != slow:
            pass
        assert reply["type"] == "snapshot"
        await peer.request({"type": "close", "session": sid})
        assert code(await peer.request({"type": "snapshot", "session": sid})) == "SESSION_LOST"
    finally:
        await peer.close()


@pytest.mark.parametrize("codec", CODECS)
async def test_a_failing_or_overrunning_restore_frees_its_slot(codec: str) -> None:
    with running(TallyEnv, step_timeout_s=0.5, max_sessions=4) as srv:
        peer = await RawPeer.open(srv.url, codec)
        try:
            _, fails = await snapshot_of(peer, add=1, restore_fails=True)
            _, slow = await snapshot_of(peer, add=1, restore_sleep=3.0)
            _, wrong = await snapshot_of(peer, add=1)
            reply = await peer.request({"type": "restore", "snapshot": fails})
            assert code(reply) == "ENV_ERROR" and "restore failed on purpose" in reply["message"]
            assert code(await peer.request({"type": "restore", "snapshot": slow})) == "STEP_TIMEOUT"
            assert srv.manager.active == 3  # the three sources; nothing leaked
            sid = await peer.open_session()
            await peer.request({"type": "reset", "session": sid})
            await peer.request({"type": "step", "session": sid, "action": {"wrong_model": True}})
            reply = await peer.request({"type": "snapshot", "session": sid})
            assert code(reply) == "BAD_OBSERVATION" and "returned TallyState" in reply["message"]
            full = await peer.request({"type": "restore", "snapshot": wrong})
            assert code(full) == "CAPACITY_REACHED"
        finally:
            await peer.close()
        assert wait_until(lambda: srv.manager.active == 0)


@pytest.mark.parametrize("env", [AffineTallyEnv, AsyncTallyEnv])
async def test_restore_follows_the_runner_rules(env: type[TallyEnv]) -> None:
    with running(env) as srv:
        async with (
            AsyncEnvClient(srv.url, env=env) as source,
            AsyncEnvClient(srv.url, env=env) as copy_,
        ):
            await source.reset(seed=4)
            await source.step(TallyAction(add=2, snapshot_sleep=0.01))
            restored = await copy_.restore(await source.snapshot())
            after = await copy_.step(TallyAction(add=1))
            if env.thread_affinity:
                # restore ran on the new session's own thread, as every later call does
                assert restored.observation.thread == after.observation.thread
                assert after.observation.thread.startswith("corral-env")
            assert after.observation.count == 3


async def test_snapshot_and_restore_reach_worker_processes() -> None:
    server = LocalServer(
        "tests.support.snapshot_envs:WhereTallyEnv",
        server_args=["--workers", "2", "--step-timeout", "1"],
        startup_timeout=60,
    )
    url = await server.start()
    try:
        async with AsyncEnvClient(url, env=TallyEnv) as source:
            await source.reset(seed=8)
            await source.step(TallyAction(add=3))
            forks = await source.fork(2)
            try:
                steps = [await f.step(TallyAction(add=1)) for f in forks]
                assert {s.observation.count for s in steps} == {4}
                assert len({s.observation.walk for s in steps}) == 1
                assert server.process is not None
                assert server.process.pid not in {s.observation.pid for s in steps}
                peer = await RawPeer.open(url)
                _, slow = await snapshot_of(peer, add=1, restore_sleep=3.0)
                assert code(await peer.request({"type": "restore", "snapshot": slow})) == (
                    "STEP_TIMEOUT"
                )
                await peer.close()
            finally:
                await asyncio.gather(*(f.close() for f in forks))
    finally:
        await server.stop()

"""Nothing lost silently, nothing wedged: each guarantee through a real server on 127.0.0.1.

One test per class of failure an outside audit found (issue 11): a reused request id,
unbounded echoes in error replies, a session left running by a failure, non-finite
rewards, replies the client cannot take, hung environment calls. Each drives a real
server (uvicorn in a thread, real sockets) with a raw ``corral/1`` peer or the real
client, and checks both the structured error and that the session lives on.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from tests.faults.envs import RELEASE, HardAction, HardEnv
from tests.support.envs import AsyncCounterEnv, CounterEnv
from tests.support.raw import RawPeer
from tests.support.servers import ThreadServer, running, wait_until

from corral.client import AsyncEnvClient
from corral.errors import ErrorCode, ReplyTooLarge

CODECS = ["msgpack", "json"]


@pytest.fixture(scope="module")
def counter() -> Any:
    with running(CounterEnv, step_timeout_s=30) as server:
        yield server


async def reset_session(peer: RawPeer, **reset: Any) -> str:
    session = await peer.open_session()
    reply = await peer.request({"type": "reset", "session": session, **reset})
    assert reply["type"] == "result", reply
    return session


# -- 11.2: a reused request id is not a replay -------------------------------------


@pytest.mark.parametrize("codec", CODECS)
async def test_a_reused_request_id_is_refused_not_replayed(counter: ThreadServer, codec: str):
    peer = await RawPeer.open(counter.url, codec)
    try:
        session = await reset_session(peer, options={"limit": 1000})
        step_a = {"type": "step", "id": 500, "session": session, "action": {"amount": 1}}
        first = await peer.request(dict(step_a))
        assert first["type"] == "result" and first["observation"]["total"] == 1
        # The same id with another action: refused, B never applied, A never replayed.
        step_b = {**step_a, "action": {"amount": 5}}
        refused = await peer.request(step_b)
        assert refused["type"] == "error" and refused["code"] == ErrorCode.REQUEST_ID_REUSED
        assert refused["id"] == 500 and refused["details"]["id"] == 500
        # An identical re-send is a replay: the remembered reply, not a second step.
        assert await peer.request(dict(step_a)) == first
        state = await peer.request({"type": "state", "session": session})
        assert state["state"]["total"] == 1 and state["state"]["history"] == [1]
        # A single request's id reused by a batch item, and a batch id by a request.
        batch = await peer.request(
            {"type": "step_batch", "id": 500, "items": [{"session": session, "action": {}}]}
        )
        assert batch["type"] == "batch"
        assert batch["results"][0]["error"]["code"] == ErrorCode.REQUEST_ID_REUSED
        ok = await peer.request(
            {"type": "step_batch", "id": 600, "items": [{"session": session, "action": {}}]}
        )
        assert "observation" in ok["results"][0]
        single = await peer.request({**step_a, "id": 600, "action": {}})
        assert single["type"] == "error" and single["code"] == ErrorCode.REQUEST_ID_REUSED
        # The session lives on.
        later = await peer.request({**step_a, "id": 700})
        assert later["type"] == "result" and later["observation"]["total"] == 3
    finally:
        await peer.close()


@pytest.mark.parametrize("codec", CODECS)
async def test_acked_requests_leave_one_reply_per_session(counter: ThreadServer, codec: str):
    """``"acked": true`` over a real socket: the session forgets the replies before it,
    keeps its own for a re-send, and corral's client sends it (one reply remembered)."""
    peer = await RawPeer.open(counter.url, codec)
    try:
        session = await reset_session(peer, options={"limit": 1000})

        def step(rid: int, **extra: Any) -> dict[str, Any]:
            action = {"amount": 1}
            return {"type": "step", "id": rid, "session": session, "action": action, **extra}

        first = await peer.request(step(10))
        await peer.request(step(11))
        assert await peer.request(step(10)) == first  # not acked: remembered, replayed
        acked = await peer.request(step(12, acked=True))
        assert acked["observation"]["total"] == 3
        assert await peer.request(step(12, acked=True)) == acked  # its own: still a replay
        # This side said it held the replies of 10 and 11: they are forgotten, yet known
        # to be answered, so a re-send of 10 is refused, not run a second time (30.9).
        again = await peer.request(step(10))
        assert again["code"] == ErrorCode.REQUEST_ID_REUSED, again
        assert again["details"]["reason"] == "acked" and again["details"]["acked"] == 12
        batch = await peer.request(
            {"type": "step_batch", "id": 11, "items": [{"session": session, "action": {}}]}
        )
        assert batch["results"][0]["error"]["code"] == ErrorCode.REQUEST_ID_REUSED, batch
        fresh = await peer.request(step(13))
        assert fresh["observation"]["total"] == 4  # nothing ran in between
    finally:
        await peer.close()
    client = AsyncEnvClient(counter.url, env=CounterEnv, codec=codec)
    try:
        await client.reset(limit=1000)
        for _ in range(5):
            await client.step({"amount": 1})
        held = counter.manager.registry.sessions[client.session_id]
        assert len(held.cache) == 1
    finally:
        await client.close()


# -- 11.8: error replies do not amplify --------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
async def test_error_replies_echo_bounded_ids(counter: ThreadServer, codec: str):
    peer = await RawPeer.open(counter.url, codec)
    huge = "s" * (1024 * 1024)
    try:
        for message in (
            {"type": "step", "session": huge, "action": {}},
            {"type": "attach", "session": huge, "token": huge},
            {"type": "step_batch", "items": [{"session": huge, "action": {}}] * 4},
            {"type": "teleport", "session": huge},
        ):
            await peer.send(message)
            frame = await peer.ws.recv()
            reply = peer.codec.decode(frame)
            assert len(frame) < 16 * 1024, (message["type"], len(frame))
            assert reply["type"] in ("error", "batch"), reply
            if reply["type"] == "error":
                assert reply["code"] in (
                    ErrorCode.UNKNOWN_SESSION,
                    ErrorCode.UNKNOWN_TYPE,
                ), reply
        ok = await reset_session(peer)
        assert ok
    finally:
        await peer.close()


# -- 11.9: any failure after a session is marked running releases it ---------------

BAD_OPTIONS = [{1: 0, "zz": 0}, {"seed": 3}, {"self": 1}, {2: "x"}, {"limit": 5, 0: 1}]


@pytest.mark.parametrize("env", [CounterEnv, AsyncCounterEnv])
async def test_option_problems_are_invalid_argument_and_release_the_session(env: Any):
    with running(env) as server:
        peer = await RawPeer.open(server.url, "msgpack")
        try:
            a, b = await peer.open_session(), await peer.open_session()
            for options in BAD_OPTIONS:
                batch = await peer.request(
                    {
                        "type": "reset_batch",
                        "items": [{"session": a, "options": options}, {"session": b}],
                    }
                )
                assert batch["type"] == "batch", batch
                bad, good = batch["results"]
                assert bad["error"]["code"] == ErrorCode.INVALID_ARGUMENT, bad
                assert "observation" in good, good
                single = await peer.request({"type": "reset", "session": a, "options": options})
                assert single["code"] == ErrorCode.INVALID_ARGUMENT, single
                # Neither session is left running: both reset and step at once.
                for sid in (a, b):
                    reply = await peer.request({"type": "reset", "session": sid})
                    assert reply["type"] == "result", reply
                    reply = await peer.request(
                        {"type": "step", "session": sid, "action": {"amount": 1}}
                    )
                    assert reply["type"] == "result", reply
        finally:
            await peer.close()


# -- 11.3 / 11.10: one rule for rewards; every request gets a reply --------------------


@pytest.fixture(scope="module")
def hard() -> Any:
    with running(HardEnv, step_timeout_s=30) as server:
        yield server


@pytest.mark.parametrize("codec", CODECS)
async def test_a_non_finite_reward_is_bad_observation_on_every_codec(hard: ThreadServer, codec):
    peer = await RawPeer.open(hard.url, codec)
    try:
        session = await reset_session(peer)
        for reward in ("nan", "inf", "-inf", "NaN"):
            step = {"type": "step", "session": session, "action": {"reward": reward}}
            reply = await peer.request(step)
            assert reply["code"] == ErrorCode.BAD_OBSERVATION, reply
            assert reply["details"]["field"] == "reward"
            batch = await peer.request(
                {"type": "step_batch", "items": [{"session": session, "action": step["action"]}]}
            )
            assert batch["results"][0]["error"]["code"] == ErrorCode.BAD_OBSERVATION
        ok = await peer.request({"type": "step", "session": session, "action": {"reward": "2.5"}})
        assert ok["observation"]["reward"] == 2.5
    finally:
        await peer.close()


@pytest.mark.parametrize("codec", CODECS)
async def test_an_unencodable_reply_is_an_error_reply_every_time(hard: ThreadServer, codec):
    peer = await RawPeer.open(hard.url, codec)
    try:
        session = await reset_session(peer)
        step = {"type": "step", "id": 42, "session": session, "action": {"unencodable": True}}
        for _ in range(2):  # the retry of the same request gets the same answer, at once
            reply = await peer.request(dict(step), timeout=10)
            assert reply["type"] == "error" and reply["id"] == 42, reply
            assert reply["code"] == ErrorCode.BAD_OBSERVATION, reply
        batch = await peer.request(
            {"type": "step_batch", "items": [{"session": session, "action": step["action"]}]}
        )
        assert batch["type"] == "batch"
        assert batch["results"][0]["error"]["code"] == ErrorCode.BAD_OBSERVATION, batch
        ok = await peer.request({"type": "step", "session": session, "action": {}})
        assert ok["type"] == "result", ok
    finally:
        await peer.close()


async def test_a_reply_larger_than_the_clients_limit_is_an_error_not_a_reconnect_loop(
    hard: ThreadServer,
):
    limit = 64 * 1024
    client = AsyncEnvClient(hard.url, env=HardEnv, max_frame_bytes=limit, timeout=20)
    async with client:
        await client.reset()
        with pytest.raises(ReplyTooLarge) as caught:
            await client.step(HardAction(size=4 * limit))
        assert caught.value.details["limit"] == limit
        assert client.connection.reconnects == 0  # type: ignore[union-attr]
        result = await client.step(HardAction(size=limit // 2))
        assert len(result.observation.payload) == limit // 2
    # In a batch only the item at fault becomes an error.
    peer = await RawPeer.open(hard.url, "msgpack", hello=False)
    try:
        hello = {"type": "hello", "protocol": "corral/1", "max_frame_bytes": limit}
        assert (await peer.request(hello))["type"] == "welcome"
        a, b = await reset_session(peer), await reset_session(peer)
        batch = await peer.request(
            {
                "type": "step_batch",
                "items": [
                    {"session": a, "action": {"size": 4 * limit}},
                    {"session": b, "action": {"size": 10}},
                ],
            }
        )
        big, small = batch["results"]
        assert big["error"]["code"] == ErrorCode.REPLY_TOO_LARGE, big
        assert small["observation"]["payload"] == b"x" * 10
    finally:
        await peer.close()


# -- 11.11: hung steps cannot exhaust the server ---------------------------------------


async def test_hung_calls_are_bounded_and_ready_tells_the_truth():
    RELEASE.clear()
    bound = 3
    with running(HardEnv, step_timeout_s=0.3, max_hung_calls=bound) as server:
        peer = await RawPeer.open(server.url, "msgpack")
        try:
            assert httpx.get(server.url + "/ready").status_code == 200
            hung = [await reset_session(peer) for _ in range(bound)]
            for index, session in enumerate(hung):
                reply = await peer.request(
                    {"type": "step", "session": session, "action": {"block": True}}
                )
                assert reply["code"] == ErrorCode.STEP_TIMEOUT, reply
                expected = 200 if index + 1 < bound else 503
                assert httpx.get(server.url + "/ready").status_code == expected
            ready = httpx.get(server.url + "/ready")
            assert ready.json()["ready"] is False and "hung" in ready.json()["reason"]
            assert ready.headers["retry-after"] == "1"
            assert server.manager.executor.hung == bound
            refused = await peer.request({"type": "open"})
            assert refused["code"] == ErrorCode.NOT_READY, refused
            assert "hung" in refused["details"]["reason"]
            # The hung threads return: the server is ready and serves sessions again.
            RELEASE.set()
            assert wait_until(lambda: httpx.get(server.url + "/ready").status_code == 200, 30)
            assert await reset_session(peer)
        finally:
            RELEASE.set()
            await peer.close()


async def test_a_worker_holding_hung_calls_is_replaced():
    with running(HardEnv, step_timeout_s=0.3, max_hung_calls=2, workers=1) as server:
        peer = await RawPeer.open(server.url, "msgpack")
        try:
            a, b, c = [await reset_session(peer) for _ in range(3)]
            pool = server.app.state.workers
            first = pool.workers[0].process.pid
            for session in (a, b):
                reply = await peer.request(
                    {"type": "step", "session": session, "action": {"sleep": 20}}
                )
                assert reply["code"] == ErrorCode.STEP_TIMEOUT, reply
            # The worker held two hung calls: replaced; its other session is lost, loudly.
            lost = await peer.request({"type": "step", "session": c, "action": {}})
            assert lost["code"] == ErrorCode.SESSION_LOST, lost
            assert wait_until(lambda: pool.workers[0].alive, 60)
            assert pool.workers[0].process.pid != first
            assert wait_until(lambda: httpx.get(server.url + "/ready").status_code == 200, 30)
            assert await reset_session(peer)
        finally:
            await peer.close()

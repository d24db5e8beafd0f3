"""The /ws endpoint against a raw peer: every bad input gets a structured error."""

from __future__ import annotations

import struct

import msgpack
import pytest
from tests.support.envs import BadObsEnv, BrokenFactoryEnv, CounterEnv
from tests.support.raw import RawPeer
from tests.support.servers import running

from corral.errors import ErrorCode
from corral.protocol.arrays import NDARRAY_EXT


@pytest.fixture(scope="module")
def server():
    with running(CounterEnv, max_frame_bytes=64 * 1024, step_timeout_s=5) as srv:
        yield srv


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_episode_over_raw_frames(server, codec):
    peer = await RawPeer.open(server.url, codec)
    sid = await peer.open_session()
    reply = await peer.request(
        {"type": "reset", "session": sid, "seed": 7, "options": {"limit": 2}}
    )
    assert reply["type"] == "result" and reply["session"] == sid
    assert reply["observation"]["metadata"] == {"seed": 7}
    reply = await peer.request({"type": "step", "session": sid, "action": {"amount": 2}})
    assert reply["observation"]["total"] == 2 and reply["observation"]["done"] is True
    state = await peer.request({"type": "state", "session": sid})
    assert state["state"]["total"] == 2 and state["state"]["extra_field"] == "kept"
    closed = await peer.request({"type": "close", "session": sid})
    assert closed["type"] == "closed"
    await peer.close()


async def expect_error(peer: RawPeer, message: dict, code: ErrorCode) -> dict:
    reply = await peer.request(message)
    assert reply["type"] == "error", reply
    assert reply["code"] == code, reply
    assert reply["message"]
    return reply


async def test_lifecycle_errors_keep_the_session(server):
    peer = await RawPeer.open(server.url)
    sid = await peer.open_session()
    await expect_error(
        peer, {"type": "step", "session": sid, "action": {}}, ErrorCode.RESET_REQUIRED
    )
    await peer.request({"type": "reset", "session": sid, "options": {"limit": 1}})
    await peer.request({"type": "step", "session": sid, "action": {"amount": 1}})
    reply = await expect_error(
        peer, {"type": "step", "session": sid, "action": {}}, ErrorCode.EPISODE_ENDED
    )
    assert reply["session"] == sid
    again = await peer.request({"type": "reset", "session": sid})
    assert again["type"] == "result"
    await peer.close()


async def test_bad_actions_and_env_errors(server):
    peer = await RawPeer.open(server.url)
    sid = await peer.open_session()
    await peer.request({"type": "reset", "session": sid, "options": {"limit": 100}})
    wrong_type = await expect_error(
        peer,
        {"type": "step", "session": sid, "action": {"amount": "lots"}},
        ErrorCode.INVALID_ACTION,
    )
    assert wrong_type["details"]["errors"][0]["loc"] == ["amount"]
    await expect_error(
        peer, {"type": "step", "session": sid, "action": {"bogus": 1}}, ErrorCode.INVALID_ACTION
    )
    custom = await expect_error(
        peer, {"type": "step", "session": sid, "action": {"note": "LOUD"}}, ErrorCode.INVALID_ACTION
    )
    assert "no shouting" in str(custom["details"])
    await expect_error(
        peer, {"type": "step", "session": sid, "action": {"fail": True}}, ErrorCode.ENV_ERROR
    )
    await expect_error(
        peer, {"type": "step", "session": sid, "action": [1, 2]}, ErrorCode.INVALID_ACTION
    )
    await expect_error(
        peer,
        {"type": "reset", "session": sid, "options": {"nope": 1}},
        ErrorCode.INVALID_ARGUMENT,
    )
    await expect_error(
        peer, {"type": "reset", "session": sid, "seed": -1}, ErrorCode.INVALID_ARGUMENT
    )
    ok = await peer.request({"type": "step", "session": sid, "action": {"amount": 3}})
    assert ok["observation"]["total"] == 3  # every failure above left the episode intact
    await peer.close()


async def test_malformed_frames(server):
    peer = await RawPeer.open(server.url)
    await peer.send_frame(b"\xc1\xff not msgpack")
    reply = await peer.recv()
    assert reply["code"] == ErrorCode.BAD_FRAME and reply["id"] is None
    await peer.send_frame(msgpack.packb([1, 2, 3]))
    assert (await peer.recv())["code"] == ErrorCode.BAD_MESSAGE
    await peer.send_frame("a text frame")
    assert (await peer.recv())["code"] == ErrorCode.BAD_FRAME
    await expect_error(peer, {"type": "teleport"}, ErrorCode.UNKNOWN_TYPE)
    await expect_error(peer, {"type": "step", "action": {}}, ErrorCode.BAD_MESSAGE)
    await expect_error(peer, {"type": "reset", "session": 5}, ErrorCode.BAD_MESSAGE)
    await peer.send({"type": "open", "id": True})
    assert (await peer.recv())["code"] == ErrorCode.BAD_MESSAGE
    await expect_error(peer, {"type": "state", "session": "nope"}, ErrorCode.UNKNOWN_SESSION)
    big = {"type": "step", "session": "x", "action": {"note": "a" * 100_000}}
    reply = await expect_error(peer, big, ErrorCode.FRAME_TOO_LARGE)
    assert reply["details"]["limit"] == 64 * 1024
    sid = await peer.open_session()  # the connection survived all of it
    assert (await peer.request({"type": "reset", "session": sid}))["type"] == "result"
    await peer.close()


async def test_handshake_is_required_and_checked(server):
    peer = await RawPeer.open(server.url, hello=False)
    await expect_error(peer, {"type": "open"}, ErrorCode.HANDSHAKE_REQUIRED)
    await expect_error(
        peer, {"type": "hello", "protocol": "corral/9"}, ErrorCode.UNSUPPORTED_PROTOCOL
    )
    await expect_error(
        peer,
        {
            "type": "hello",
            "protocol": "corral/1",
            "contract": {"version": "2.0.0", "fingerprint": "x"},
        },
        ErrorCode.CONTRACT_MISMATCH,
    )
    await expect_error(peer, {"type": "open"}, ErrorCode.HANDSHAKE_REQUIRED)
    welcome = await peer.request(
        {"type": "hello", "protocol": "corral/1", "contract": {"version": "1.3.0"}, "schemas": True}
    )
    assert welcome["compat"] == "compatible"
    assert set(welcome["schemas"]) == {"action", "observation", "state", "reset_options"}
    assert welcome["env"]["fingerprint"] == server.service.fingerprint
    await peer.close()


async def test_busy_session_and_other_sessions_unaffected(server):
    peer = await RawPeer.open(server.url)
    a, b = await peer.open_session(), await peer.open_session()
    for sid in (a, b):
        await peer.request({"type": "reset", "session": sid, "options": {"limit": 1000}})
    slow = await peer.send({"type": "step", "session": a, "action": {"sleep": 0.5}})
    busy = await peer.request({"type": "reset", "session": a})
    assert busy["code"] == ErrorCode.SESSION_BUSY
    quick = await peer.request({"type": "step", "session": b, "action": {"amount": 5}})
    assert quick["observation"]["total"] == 5  # b answered while a was still stepping
    while (reply := await peer.recv())["id"] != slow:
        pass
    assert reply["type"] == "result"
    await peer.close()


async def test_retried_request_is_applied_at_most_once(server):
    peer = await RawPeer.open(server.url)
    sid = await peer.open_session()
    await peer.request({"type": "reset", "session": sid, "options": {"limit": 1000}})
    first = await peer.request({"type": "step", "session": sid, "action": {"amount": 4}, "id": 500})
    again = await peer.request({"type": "step", "session": sid, "action": {"amount": 4}, "id": 500})
    assert first == again
    state = await peer.request({"type": "state", "session": sid})
    assert state["state"]["total"] == 4
    await peer.close()


async def test_factory_and_observation_errors():
    with running(BrokenFactoryEnv) as srv:
        peer = await RawPeer.open(srv.url)
        await expect_error(peer, {"type": "open"}, ErrorCode.FACTORY_ERROR)
        await peer.close()
        assert srv.manager.active == 0
    with running(BadObsEnv) as srv:
        peer = await RawPeer.open(srv.url)
        sid = await peer.open_session()
        await peer.request({"type": "reset", "session": sid})
        await expect_error(
            peer, {"type": "step", "session": sid, "action": {}}, ErrorCode.BAD_OBSERVATION
        )
        await peer.close()


async def test_malformed_array_extensions_are_bad_frames(server):
    # An array's header is parsed once and then kept: a frame whose header was seen
    # before but whose data does not fit it is refused the same way, and the session
    # the frames named goes on.
    peer = await RawPeer.open(server.url)
    sid = await peer.open_session()
    await peer.request({"type": "reset", "session": sid, "options": {"limit": 100}})
    header = struct.pack("<B3sB1Q", 3, b"<i4", 1, 3)
    for payload in (header + b"\x00" * 11, header + b"\x00" * 13, header[:6], b""):
        step = {"type": "step", "id": 99, "session": sid, "action": {"amount": 1}}
        step["action"]["amount"] = msgpack.ExtType(NDARRAY_EXT, payload)
        await peer.send_frame(msgpack.packb(step))
        reply = await peer.recv()
        assert reply["code"] == ErrorCode.BAD_FRAME and "array extension" in reply["message"]
    ok = await peer.request({"type": "step", "session": sid, "action": {"amount": 3}})
    assert ok["observation"]["total"] == 3
    await peer.close()

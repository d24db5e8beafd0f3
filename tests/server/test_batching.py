"""reset_batch / step_batch through a real server: per-item errors, grouping, timeouts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

import pytest
from tests.support.envs import (
    AsyncCounterEnv,
    AutoResetEnv,
    BadObsEnv,
    CountAction,
    CounterEnv,
    CountObservation,
    CountState,
)
from tests.support.raw import RawPeer
from tests.support.servers import running, wait_until

from corral.contract import Environment
from corral.errors import ErrorCode


class ThreadTrackingEnv(CounterEnv):
    """Records the thread each step ran on."""

    threads: ClassVar[list[int]] = []

    def step(self, action: CountAction) -> CountObservation:
        self.threads.append(threading.get_ident())
        return super().step(action)


class AffineEnv(ThreadTrackingEnv):
    thread_affinity = True
    threads: ClassVar[list[int]] = []


class ConcurrencyEnv(Environment[CountAction, CountObservation, CountState]):
    """Async; tracks how many steps are in flight at once across all instances."""

    in_flight: ClassVar[int] = 0
    peak: ClassVar[int] = 0

    async def reset(self, seed: int | None = None, **options: Any) -> CountObservation:
        return CountObservation()

    async def step(self, action: CountAction) -> CountObservation:
        cls = type(self)
        cls.in_flight += 1
        cls.peak = max(cls.peak, cls.in_flight)
        await asyncio.sleep(action.sleep)
        cls.in_flight -= 1
        return CountObservation(total=action.amount)

    async def state(self) -> CountState:
        return CountState()


async def sessions(peer: RawPeer, n: int, limit: int = 100) -> list[str]:
    sids = [await peer.open_session() for _ in range(n)]
    reply = await peer.request(
        {
            "type": "reset_batch",
            "items": [{"session": s, "options": {"limit": limit}} for s in sids],
        }
    )
    assert all("observation" in r for r in reply["results"]), reply
    return sids


def step_batch(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {"type": "step_batch", "items": [{"session": s, "action": a} for s, a in items]}


def codes(reply: dict[str, Any]) -> list[str | None]:
    return [r["error"]["code"] if "error" in r else None for r in reply["results"]]


@pytest.fixture(scope="module")
def server():
    with running(CounterEnv, max_batch=8) as srv:
        yield srv


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_batch_results_in_item_order(server, codec):
    peer = await RawPeer.open(server.url, codec)
    sids = await sessions(peer, 3)
    reply = await peer.request(step_batch([(s, {"amount": i + 1}) for i, s in enumerate(sids)]))
    assert reply["type"] == "batch"
    assert [r["session"] for r in reply["results"]] == sids
    assert [r["observation"]["total"] for r in reply["results"]] == [1, 2, 3]
    for i, sid in enumerate(sids):
        state = await peer.request({"type": "state", "session": sid})
        assert state["state"]["history"] == [i + 1]
    await peer.close()


async def test_a_failed_item_is_an_error_for_its_session_only(server):
    peer = await RawPeer.open(server.url)
    a, b, c, d, e = await sessions(peer, 5, limit=3)
    fresh = await peer.open_session()  # never reset
    await peer.request(step_batch([(e, {"amount": 5})]))  # e's episode is over
    reply = await peer.request(
        step_batch(
            [
                (a, {"amount": 1}),
                (b, {"amount": "lots"}),
                (c, {"fail": True}),
                ("no-such-session", {}),
                (fresh, {}),
                (e, {}),
                (a, {"amount": 1}),
                (d, {"amount": 2}),
            ]
        )
    )
    assert codes(reply) == [
        None,
        ErrorCode.INVALID_ACTION,
        ErrorCode.ENV_ERROR,
        ErrorCode.UNKNOWN_SESSION,
        ErrorCode.RESET_REQUIRED,
        ErrorCode.EPISODE_ENDED,
        ErrorCode.SESSION_BUSY,
        None,
    ]
    results = reply["results"]
    assert results[1]["error"]["details"]["errors"][0]["loc"] == ["amount"]
    assert "the env failed on purpose" in results[2]["error"]["message"]
    assert results[3]["session"] == "no-such-session"
    assert results[0]["observation"]["total"] == 1 and results[7]["observation"]["total"] == 2
    # Every failure left its session usable and its episode intact.
    again = await peer.request(step_batch([(b, {"amount": 1}), (c, {"amount": 1})]))
    assert [r["observation"]["total"] for r in again["results"]] == [1, 1]
    await peer.close()


async def test_malformed_items_and_messages(server):
    peer = await RawPeer.open(server.url)
    (sid,) = await sessions(peer, 1)
    reply = await peer.request(
        {"type": "step_batch", "items": [{"session": sid, "action": {}}, 5, {"session": sid}]}
    )
    assert codes(reply) == [None, ErrorCode.BAD_MESSAGE, ErrorCode.BAD_MESSAGE]
    assert reply["results"][1]["session"] is None
    whole = await peer.request({"type": "step_batch", "items": "everything"})
    assert whole["type"] == "error" and whole["code"] == ErrorCode.BAD_MESSAGE
    resets = await peer.request(
        {
            "type": "reset_batch",
            "items": [
                {"session": sid, "seed": 4, "options": {"limit": 7, "label": "x"}},
                {"session": sid, "options": {"nope": 1}},
            ],
        }
    )
    assert codes(resets) == [None, ErrorCode.SESSION_BUSY]
    assert resets["results"][0]["observation"]["label"] == "x"
    assert resets["results"][0]["observation"]["metadata"] == {"seed": 4}
    bad_option = await peer.request(
        {"type": "reset_batch", "items": [{"session": sid, "options": {"nope": 1}}]}
    )
    assert codes(bad_option) == [ErrorCode.INVALID_ARGUMENT]
    assert bad_option["results"][0]["error"]["details"]["unknown"] == ["nope"]
    await peer.close()


async def test_batch_too_large_runs_nothing(server):
    peer = await RawPeer.open(server.url)
    (sid,) = await sessions(peer, 1)
    reply = await peer.request(step_batch([(sid, {"amount": 1})] * 9))
    assert reply["type"] == "error" and reply["code"] == ErrorCode.BATCH_TOO_LARGE
    assert reply["details"] == {"items": 9, "limit": 8}
    state = await peer.request({"type": "state", "session": sid})
    assert state["state"]["total"] == 0
    await peer.close()


async def test_batches_need_the_handshake_and_own_sessions(server):
    peer = await RawPeer.open(server.url, hello=False)
    reply = await peer.request(step_batch([("x", {})]))
    assert reply["code"] == ErrorCode.HANDSHAKE_REQUIRED
    await peer.close()
    owner, stranger = await RawPeer.open(server.url), await RawPeer.open(server.url)
    (sid,) = await sessions(owner, 1)
    reply = await stranger.request(step_batch([(sid, {})]))
    assert codes(reply) == [ErrorCode.UNKNOWN_SESSION]
    await owner.close()
    await stranger.close()


async def test_retried_batch_is_applied_at_most_once(server):
    peer = await RawPeer.open(server.url)
    a, b = await sessions(peer, 2)
    message = {**step_batch([(a, {"amount": 2}), (b, {"amount": "x"})]), "id": 900}
    first = await peer.request(dict(message))
    again = await peer.request(dict(message))
    assert first == again
    state = await peer.request({"type": "state", "session": a})
    assert state["state"]["history"] == [2]
    await peer.close()


async def test_a_batch_resent_while_it_runs_gets_the_original_answer(server):
    peer = await RawPeer.open(server.url)
    a, b = await sessions(peer, 2)
    message = {**step_batch([(a, {"amount": 2, "sleep": 0.3}), (b, {"amount": 1})]), "id": 901}
    await peer.send(dict(message))
    await peer.send(dict(message))  # what a reconnecting client does with its unanswered ids
    first, second = await peer.recv(), await peer.recv()
    assert first == second and first["id"] == 901
    assert codes(first) == [None, None]
    state = await peer.request({"type": "state", "session": a})
    assert state["state"]["history"] == [2]  # applied once
    await peer.close()


async def test_sync_envs_share_one_executor_call():
    ThreadTrackingEnv.threads.clear()
    with running(ThreadTrackingEnv, executor_threads=8, inline_step_s=0) as srv:
        peer = await RawPeer.open(srv.url)
        sids = await sessions(peer, 6)
        for _ in range(3):
            ThreadTrackingEnv.threads.clear()
            reply = await peer.request(step_batch([(s, {}) for s in sids]))
            assert codes(reply) == [None] * 6
            assert len(ThreadTrackingEnv.threads) == 6
            assert len(set(ThreadTrackingEnv.threads)) == 1  # one thread ran the whole batch
        await peer.close()


async def test_thread_affinity_envs_keep_their_own_threads():
    AffineEnv.threads.clear()
    with running(AffineEnv) as srv:
        peer = await RawPeer.open(srv.url)
        sids = await sessions(peer, 3)
        seen: list[list[int]] = []
        for _ in range(2):
            AffineEnv.threads.clear()
            reply = await peer.request(step_batch([(s, {}) for s in sids]))
            assert codes(reply) == [None] * 3
            seen.append(sorted(AffineEnv.threads))
        assert len(set(seen[0])) == 3 and seen[0] == seen[1]
        await peer.close()


async def test_async_envs_are_awaited_concurrently():
    ConcurrencyEnv.peak = 0
    with running(ConcurrencyEnv) as srv:
        peer = await RawPeer.open(srv.url)
        sids = [await peer.open_session() for _ in range(5)]
        await peer.request({"type": "reset_batch", "items": [{"session": s} for s in sids]})
        reply = await peer.request(
            step_batch([(s, {"amount": i, "sleep": 0.2}) for i, s in enumerate(sids)])
        )
        assert [r["observation"]["total"] for r in reply["results"]] == list(range(5))
        assert ConcurrencyEnv.peak == 5
        await peer.close()


async def test_a_stuck_item_times_out_alone():
    with running(CounterEnv, step_timeout_s=0.3) as srv:
        peer = await RawPeer.open(srv.url)
        a, b, c = await sessions(peer, 3)
        reply = await peer.request(
            step_batch([(a, {"amount": 1}), (b, {"sleep": 1.0}), (c, {"amount": 3})]),
            timeout=10,
        )
        assert codes(reply) == [None, ErrorCode.STEP_TIMEOUT, None]
        assert reply["results"][2]["observation"]["total"] == 3  # re-queued behind b, ran
        lost = await peer.request({"type": "state", "session": b})
        assert lost["code"] == ErrorCode.SESSION_LOST
        assert wait_until(lambda: srv.manager.active == 2)
        await peer.close()


async def test_a_waiting_async_item_past_the_timeout_fails_alone():
    """Async items wait together under the batch's one deadline: the one still waiting
    at it is answered ``STEP_TIMEOUT`` and its session closed; the others answer."""
    with running(ConcurrencyEnv, step_timeout_s=0.5) as srv:
        peer = await RawPeer.open(srv.url)
        sids = [await peer.open_session() for _ in range(3)]
        await peer.request({"type": "reset_batch", "items": [{"session": s} for s in sids]})
        reply = await peer.request(
            step_batch(
                [
                    (sids[0], {"amount": 1, "sleep": 0.05}),
                    (sids[1], {"amount": 2, "sleep": 30.0}),
                    (sids[2], {"amount": 3}),
                ]
            ),
            timeout=10,
        )
        assert codes(reply) == [None, ErrorCode.STEP_TIMEOUT, None]
        assert [reply["results"][i]["observation"]["total"] for i in (0, 2)] == [1, 3]
        lost = await peer.request({"type": "state", "session": sids[1]})
        assert lost["code"] == ErrorCode.SESSION_LOST
        again = await peer.request(step_batch([(sids[0], {"amount": 4, "sleep": 0.05})]))
        assert again["results"][0]["observation"]["total"] == 4
        await peer.close()


async def test_auto_reset_and_bad_observations_in_batches():
    with running(AutoResetEnv) as srv:
        peer = await RawPeer.open(srv.url)
        (sid,) = await sessions(peer, 1, limit=1)
        ended = await peer.request(step_batch([(sid, {"amount": 1})]))
        assert ended["results"][0]["observation"]["done"] is True
        fresh = await peer.request(step_batch([(sid, {"amount": 1})]))
        assert fresh["results"][0]["observation"]["total"] == 0  # the step ran reset instead
        await peer.close()
    with running(BadObsEnv) as srv:
        peer = await RawPeer.open(srv.url)
        (sid,) = await sessions(peer, 1)
        reply = await peer.request(step_batch([(sid, {})]))
        assert codes(reply) == [ErrorCode.BAD_OBSERVATION]
        await peer.close()


async def test_async_env_batches_and_stats():
    with running(AsyncCounterEnv) as srv:
        peer = await RawPeer.open(srv.url)
        sids = [await peer.open_session() for _ in range(4)]
        await peer.request({"type": "reset_batch", "items": [{"session": s} for s in sids]})
        for _ in range(2):
            reply = await peer.request(step_batch([(s, {"amount": 2}) for s in sids]))
        assert [r["observation"]["total"] for r in reply["results"]] == [4] * 4
        assert srv.manager.stats.steps == 8 and srv.manager.stats.resets == 4
        await peer.close()

"""Same-step resets (``step_batch`` with ``"autoreset": true``) through a real server:
both reply forms and codecs, failed and stuck resets, re-sends, statistics."""

from __future__ import annotations

import time
from typing import Any

import pytest
from tests.support.envs import CountAction, CounterEnv, CountObservation
from tests.support.raw import RawPeer
from tests.support.servers import running, wait_until
from tests.support.snapshot_envs import TallyAction, TallyEnv

from corral.client.local_server import LocalServer
from corral.errors import ErrorCode


class NoAutoResetEnv(CounterEnv):
    """Resets with a seed only: an auto-reset (no seed) fails; with ``limit=99`` it hangs
    instead, past any test's step timeout."""

    def reset(self, seed: int | None = None, limit: int = 10, label: str | None = None) -> Any:
        if seed is None:
            if self.limit == 99:
                time.sleep(2.0)
            raise RuntimeError("this env needs a seed")
        return super().reset(seed, limit, label)


class SlowCounterEnv(CounterEnv):
    """Every call goes to the executor (never inline), so a batch runs in a task."""

    blocking = True

    def step(self, action: CountAction) -> CountObservation:
        time.sleep(0.05)
        return super().step(action)


@pytest.fixture(scope="module")
def server():
    with running(CounterEnv, max_batch=8) as srv:
        yield srv


async def sessions(peer: RawPeer, n: int, limit: int, seed: int | None = None) -> list[str]:
    sids = [await peer.open_session() for _ in range(n)]
    items = [{"session": s, "seed": seed, "options": {"limit": limit}} for s in sids]
    reply = await peer.request({"type": "reset_batch", "items": items})
    assert all("observation" in r for r in reply["results"]), reply
    return sids


def step_batch(items: list[tuple[str, Any]], **flags: Any) -> dict[str, Any]:
    wire = [{"session": s, "action": a} for s, a in items]
    return {"type": "step_batch", "items": wire, "autoreset": True, **flags}


def observations(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The item observations of a reply in either form (None for a failed item)."""
    if "results" in reply:
        return [r.get("observation") for r in reply["results"]]
    columns, failed = reply["columns"], {i for i, _ in reply["errors"]}
    rows = iter(
        [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    )
    return [None if k in failed else next(rows) for k in range(len(reply["sessions"]))]


@pytest.mark.parametrize("codec", ["msgpack", "json"])
@pytest.mark.parametrize("columns", [False, True], ids=["rows", "columns"])
async def test_an_ended_item_restarts_in_the_same_reply(server, codec, columns):
    peer = await RawPeer.open(server.url, codec)
    a, b, c = await sessions(peer, 3, limit=2)
    before = server.manager.stats.resets
    reply = await peer.request(
        step_batch([(a, {"amount": 2}), (b, {"amount": 1}), (c, {"amount": "x"})], columns=columns)
    )
    assert ("columns" in reply) is columns
    ended, going, failed = observations(reply)
    # The item's own observation is the ended step's; the new episode's is beside it.
    assert ended["done"] is True and ended["total"] == 2 and ended["reward"] == 2.0
    assert going["done"] is False and going["total"] == 1 and failed is None
    ((index, fresh),) = reply["resets"]
    assert index == 0 and fresh["total"] == 0 and fresh["done"] is False
    assert fresh["metadata"] == {"seed": None}  # reset with no seed and no options
    assert "reset_errors" not in reply
    assert server.manager.stats.resets == before + 1
    # The session is in its new episode (default limit 10): it steps, it does not end.
    state = await peer.request({"type": "state", "session": a})
    assert state["state"]["total"] == 0 and state["state"]["history"] == []
    again = await peer.request(step_batch([(a, {"amount": 2}), (b, {"amount": 1})]))
    assert [o["total"] for o in observations(again)] == [2, 2]
    assert [o["done"] for o in observations(again)] == [False, True]
    assert [i for i, _ in again["resets"]] == [1]
    await peer.close()


@pytest.mark.parametrize("codec", ["msgpack", "json"])
@pytest.mark.parametrize("columns", [False, True], ids=["rows", "columns"])
async def test_a_same_step_reset_takes_its_items_reset_seed(codec, columns):
    """The new episode is exactly a fresh env's ``reset(seed=reset_seed)``; an item
    without one resets unseeded; a malformed one fails that item only."""
    expected = TallyEnv().reset(seed=7)
    with running(TallyEnv) as srv:
        peer = await RawPeer.open(srv.url, codec)
        sids = [await peer.open_session() for _ in range(4)]
        items = [{"session": s, "seed": 1} for s in sids]
        assert all(
            "observation" in r
            for r in (await peer.request({"type": "reset_batch", "items": items}))["results"]
        )
        ends = {"add": 100}  # the episode ends at a count of 100
        wire = step_batch([(s, ends) for s in sids], columns=columns)
        wire["items"][0]["reset_seed"] = 7
        wire["items"][1]["reset_seed"] = 7
        wire["items"][3]["reset_seed"] = "7"
        reply = await peer.request(wire)
        first, second, unseeded, bad = observations(reply)
        assert first["done"] and second["done"] and unseeded["done"] and bad is None
        resets = dict(reply["resets"])
        assert sorted(resets) == [0, 1, 2] and "reset_errors" not in reply
        assert resets[0]["walk"] == resets[1]["walk"] == expected.walk
        assert resets[0]["count"] == expected.count == 0
        assert resets[2]["walk"] != expected.walk  # the env's own generator: unseeded
        errors = dict(reply["errors"]) if columns else {3: reply["results"][3]["error"]}
        assert errors[3]["code"] == ErrorCode.BAD_MESSAGE
        assert errors[3]["details"]["field"] == "reset_seed"
        # The new episode goes on from that seed, as a fresh env's would.
        expected_step = TallyEnv()
        expected_step.reset(seed=7)
        after = await peer.request(step_batch([(sids[0], {"add": 1})]))
        assert observations(after)[0]["walk"] == expected_step.step(TallyAction(add=1)).walk
        await peer.close()


async def test_without_the_flag_the_episode_stays_ended(server):
    peer = await RawPeer.open(server.url)
    (a,) = await sessions(peer, 1, limit=1)
    plain = {"type": "step_batch", "items": [{"session": a, "action": {"amount": 1}}]}
    reply = await peer.request(dict(plain))
    assert reply["results"][0]["observation"]["done"] is True
    assert "resets" not in reply and "reset_errors" not in reply
    refused = await peer.request(dict(plain))
    assert refused["results"][0]["error"]["code"] == ErrorCode.EPISODE_ENDED
    await peer.close()


@pytest.mark.parametrize("columns", [False, True], ids=["rows", "columns"])
async def test_a_failed_reset_leaves_the_final_step_and_an_ended_session(columns):
    with running(NoAutoResetEnv) as srv:
        peer = await RawPeer.open(srv.url)
        a, b = await sessions(peer, 2, limit=1, seed=3)
        reply = await peer.request(
            step_batch([(a, {"amount": 1}), (b, {"amount": 0})], columns=columns)
        )
        ended, going = observations(reply)
        assert ended["done"] is True and going["done"] is False
        ((index, error),) = reply["reset_errors"]
        assert index == 0 and error["code"] == ErrorCode.ENV_ERROR
        assert "this env needs a seed" in error["message"]
        assert "resets" not in reply
        # The step counted, the reset did not: the session waits for a reset.
        refused = await peer.request(step_batch([(a, {"amount": 1})]))
        assert refused["results"][0]["error"]["code"] == ErrorCode.EPISODE_ENDED
        items = [{"session": a, "seed": 4, "options": {"limit": 5}}]
        fresh = await peer.request({"type": "reset_batch", "items": items})
        assert fresh["results"][0]["observation"]["metadata"] == {"seed": 4}
        assert srv.manager.stats.errors.get(ErrorCode.ENV_ERROR) == 1
        await peer.close()


async def test_a_stuck_reset_times_out_and_closes_its_session():
    with running(NoAutoResetEnv, step_timeout_s=0.3, inline_step_s=0) as srv:
        peer = await RawPeer.open(srv.url)
        a, b = await sessions(peer, 2, limit=99, seed=1)
        reply = await peer.request(
            step_batch([(a, {"amount": 99}), (b, {"amount": 1})]), timeout=20
        )
        ended, going = observations(reply)
        assert ended["done"] is True and going["total"] == 1
        ((index, error),) = reply["reset_errors"]
        assert index == 0 and error["code"] == ErrorCode.STEP_TIMEOUT
        lost = await peer.request({"type": "state", "session": a})
        assert lost["code"] == ErrorCode.SESSION_LOST
        assert wait_until(lambda: srv.manager.active == 1)
        await peer.close()


@pytest.mark.parametrize("env", [CounterEnv, SlowCounterEnv], ids=["inline", "executor"])
async def test_a_retried_batch_replays_its_reset_and_runs_it_once(env):
    with running(env) as srv:
        peer = await RawPeer.open(srv.url)
        a, b = await sessions(peer, 2, limit=2)
        resets = srv.manager.stats.resets
        message = {**step_batch([(a, {"amount": 2}), (b, {"amount": 1})]), "id": 900}
        first = await peer.request(dict(message))
        again = await peer.request(dict(message))
        assert first == again and [i for i, _ in first["resets"]] == [0]
        assert srv.manager.stats.resets == resets + 1
        assert srv.manager.stats.latency["auto_reset"].observations == 1
        state = await peer.request({"type": "state", "session": a})
        assert state["state"]["history"] == []  # reset once, not stepped again
        await peer.close()


async def test_a_batch_resent_while_its_reset_runs_gets_the_whole_answer():
    with running(SlowCounterEnv) as srv:
        peer = await RawPeer.open(srv.url)
        a, b = await sessions(peer, 2, limit=2)
        resets = srv.manager.stats.resets
        message = {**step_batch([(a, {"amount": 2, "sleep": 0.2}), (b, {"amount": 1})]), "id": 7}
        await peer.send(dict(message))
        await peer.send(dict(message))  # what a reconnecting client does
        first, second = await peer.recv(), await peer.recv()
        assert first == second and first["id"] == 7
        assert [i for i, _ in first["resets"]] == [0]
        assert srv.manager.stats.resets == resets + 1
        await peer.close()


async def test_same_step_resets_in_worker_processes():
    server = LocalServer(
        "tests.support.envs:CounterEnv", server_args=["--workers", "2"], startup_timeout=60
    )
    await server.start()
    try:
        peer = await RawPeer.open(server.url)
        sids = await sessions(peer, 4, limit=1)
        wire = step_batch([(s, {"amount": k % 2}) for k, s in enumerate(sids)])
        wire["items"][1]["reset_seed"] = 5  # carried to the worker's reset
        reply = await peer.request(wire)
        assert [o["done"] for o in observations(reply)] == [False, True, False, True]
        assert [(i, r["total"]) for i, r in reply["resets"]] == [(1, 0), (3, 0)]
        assert [r["metadata"] for _, r in reply["resets"]] == [{"seed": 5}, {"seed": None}]
        again = await peer.request(step_batch([(s, {"amount": 1}) for s in sids]))
        assert [o["total"] for o in observations(again)] == [1, 1, 1, 1]  # limit 10 now
        await peer.close()
    finally:
        server.stop_now()

"""Sessions outlive their server: the pool re-homes them (issue 29), in process.

Real pools, fleets, connections, protocol objects and servers (:mod:`corral.testing`);
only the socket is in memory. ``CounterEnv`` can only be replayed; ``TallyEnv`` declares
a snapshot (and walks a seeded random walk, so a restore must carry its generator).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.support.envs import CountAction, CounterEnv
from tests.support.snapshot_envs import TallyAction, TallyEnv

import corral.client.pool as pool_module
from corral.client import AsyncEnvClient, EnvPool
from corral.client.batch import ResultTable
from corral.client.membership import DnsMembership, StaticMembership
from corral.client.rehoming import row_digest, row_digests
from corral.episodes import iter_episodes
from corral.errors import SessionLost, SnapshotUnsupported
from corral.protocol.codecs import codec_for_subprotocols
from corral.protocol.messages import GoingAway
from corral.testing import InProcessNetwork, InProcessServer


def going_away(server: InProcessServer, deadline_s: float = 30.0) -> int:
    """Send the drain notice to every open socket of ``server`` (what its drain sends to
    clients that asked for notices); how many got it."""
    notice = GoingAway(deadline_s, "draining", server.service.server_id)
    sent = 0
    for socket in server.sockets:
        if not socket.closed and socket.subprotocol is not None:
            codec = codec_for_subprotocols([socket.subprotocol])
            assert codec is not None
            socket._deliver(codec.encode(notice.to_wire()))
            sent += 1
    return sent


def pool_of(network: InProcessNetwork, n: int, urls: Any, env: Any, **kwargs: Any) -> EnvPool:
    kwargs.setdefault("health_interval", None)
    kwargs.setdefault("progress", False)
    return EnvPool(n, urls, env=env, dialer=network, **kwargs)


def where(pool: EnvPool) -> list[str | None]:
    return [s.link.server_id if s.link else None for s in pool.fleet.slots]


async def test_a_restarted_servers_sessions_are_restored_by_verified_replay():
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        b = network.serve(CounterEnv, server_id="b")
        async with pool_of(network, 4, [a.url, b.url], CounterEnv) as pool:
            await pool.reset(seed=1, options={"limit": 100})
            for _ in range(3):
                await pool.step([CountAction(amount=2)] * 4)
            assert where(pool) == ["a", "a", "b", "b"]
            await b.restart()  # a new instance: its sessions are gone
            batch = await pool.step([CountAction(amount=1)] * 4)
            assert not batch.errors
            assert batch.obs["total"].tolist() == [7, 7, 7, 7]  # episodes intact
            assert not batch.truncated.any()
            stats = pool.stats()
            assert stats["restored_by_replay"] == 2 and stats["truncated"] == 0
            assert stats["seconds"]["replay"]["count"] == 2
            assert where(pool)[:2] == ["a", "a"]
            # They went elsewhere than the server that lost them... or back to it, when
            # it is the only other one: here "a" was free and less loaded? Both end up
            # on a live server and the step went through exactly once.
            assert [s.total for s in await pool.state()] == [7, 7, 7, 7]


@pytest.mark.parametrize("event", ["killed", "left"])
async def test_episodes_a_server_started_in_the_same_step_are_restored_by_replay(event: str):
    """An SB3 trainer's pool (``SAME_STEP``): after the first episode every episode
    starts on the server, in the step that ended the one before, seeded with what the
    pool sent in advance; so when that server goes, its episodes move by verified replay
    instead of ending truncated."""
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        b = network.serve(CounterEnv, server_id="b")
        members = StaticMembership([a.url, b.url])
        pool = pool_of(network, 4, members, CounterEnv, autoreset_mode="same_step", seed=3)
        async with pool:
            await pool.reset()  # unseeded, as SB3's first reset: only this one
            ended = await pool.step([CountAction(amount=10)] * 4)  # limit 10: all end
            assert ended.terminated.all() and ended.obs["total"].tolist() == [0] * 4
            logs = [slot.log for slot in pool.fleet.slots]
            assert all(log.replayable and log.seed is not None for log in logs)
            seeds = [f"seed-{log.seed}" for log in logs]
            assert [s.episode_id for s in await pool.state()] == seeds  # what the server used
            await pool.step([CountAction(amount=3)] * 4)
            assert where(pool) == ["a", "a", "b", "b"]
            if event == "killed":
                await b.kill()
            else:
                members.members = [a.url]
                assert (await pool.fleet.refresh())[1] == [b.url]
            batch = await pool.step([CountAction(amount=2)] * 4)
            assert not batch.errors and not batch.truncated.any()
            assert batch.obs["total"].tolist() == [5] * 4  # the episodes went on
            stats = pool.stats()
            assert stats["restored_by_replay"] == 2 and stats["truncated"] == 0
            assert where(pool) == ["a"] * 4
            assert [s.episode_id for s in await pool.state()] == seeds


async def test_an_unseeded_episode_ends_truncated_with_the_reason_and_the_next_step_works():
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        b = network.serve(CounterEnv, server_id="b")
        async with pool_of(network, 2, [a.url, b.url], CounterEnv) as pool:
            await pool.reset(options={"limit": 100})  # no seed: cannot be replayed
            await pool.step([CountAction(amount=2)] * 2)
            await b.restart()
            batch = await pool.step([CountAction(amount=1)] * 2)
            assert not batch.errors
            assert batch.truncated.tolist() == [False, True]
            info = batch.infos[1]["corral"]
            assert "truncated" in info and "without a seed" in info["truncated"]
            assert batch.obs["total"].tolist()[0] == 3
            assert pool.stats()["truncated"] == 1
            batch = await pool.step([CountAction(amount=1)] * 2)  # NEXT_STEP: a reset
            assert not batch.errors and batch.obs["total"].tolist() == [4, 0]
            batch = await pool.step([CountAction(amount=1)] * 2)
            assert batch.obs["total"].tolist() == [5, 1]


async def test_only_a_replayable_episode_pays_for_observation_digests(
    monkeypatch: pytest.MonkeyPatch,
):
    """A digest encodes the observation: an unseeded episode, which no replay can
    repeat, must not make one per step (an SB3 trainer's sessions never are seeded)."""
    digested: list[int] = []
    real = pool_module.row_digests

    def counting(table: Any, positions: Any = None) -> list[int]:
        digests = real(table, positions)
        digested.extend(range(len(digests)))
        return digests

    monkeypatch.setattr(pool_module, "row_digests", counting)
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        async with pool_of(network, 2, [a.url], CounterEnv) as pool:
            await pool.reset(options={"limit": 100})  # unseeded
            await pool.step([CountAction(amount=1)] * 2)
            assert digested == []
            assert [s.log.reset_digest for s in pool.fleet.slots] == [0, 0]
            await pool.reset(seed=3, options={"limit": 100})
            await pool.step([CountAction(amount=1)] * 2)
            assert digested == [0, 1]
            assert all(s.log.steps == 1 and s.log.reset_digest for s in pool.fleet.slots)


async def test_a_drain_moves_sessions_by_snapshot_before_their_next_step():
    async with InProcessNetwork() as network:
        a = network.serve(TallyEnv, server_id="a")
        b = network.serve(TallyEnv, server_id="b")
        async with pool_of(network, 4, [a.url, b.url], TallyEnv) as pool:
            await pool.reset(seed=[5] * 4)
            before = await pool.step([TallyAction(add=1)] * 4)
            drain = asyncio.ensure_future(a.service.drain(30.0))
            for _ in range(200):  # the notice arrives in a later turn of the loop
                if pool.fleet.slots[0].move is not None:
                    break
                await asyncio.sleep(0.01)
            batch = await pool.step([TallyAction(add=1)] * 4)
            assert where(pool) == ["b"] * 4
            assert batch.obs["count"].tolist() == [2, 2, 2, 2]
            # The walk went on from where it was (the generator moved with the snapshot).
            assert batch.obs["walk"].tolist()[:2] == batch.obs["walk"].tolist()[2:]
            assert before.obs["walk"].tolist()[0] != batch.obs["walk"].tolist()[0]
            stats = pool.stats()
            assert stats["restored_by_snapshot"] == 2 and stats["restored_by_replay"] == 0
            assert stats["servers"] == {"b": 4}
            await asyncio.wait_for(drain, 20.0)  # it ends early: no session left there
            assert a.service.manager.active == 0


async def test_a_notice_alone_moves_replay_only_sessions_by_replay():
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        b = network.serve(CounterEnv, server_id="b")
        async with pool_of(network, 4, [a.url, b.url], CounterEnv) as pool:
            await pool.reset(seed=2, options={"limit": 100})
            await pool.step([CountAction(amount=3)] * 4)
            assert going_away(a) == 1
            for _ in range(200):
                if pool.fleet.slots[0].move is not None:
                    break
                await asyncio.sleep(0.01)
            batch = await pool.step([CountAction(amount=1)] * 4)
            assert batch.obs["total"].tolist() == [4] * 4
            assert pool.stats()["restored_by_replay"] == 2
            assert where(pool) == ["b"] * 4


async def test_an_unreachable_server_is_left_at_once_no_dead_after_wait():
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        b = network.serve(CounterEnv, server_id="b")
        pool = pool_of(network, 4, [a.url, b.url], CounterEnv, server_dead_after=600.0)
        async with pool:
            await pool.reset(seed=3, options={"limit": 100})
            await pool.step([CountAction(amount=1)] * 4)
            await a.kill()
            batch = await pool.step([CountAction(amount=1)] * 4)
            assert not batch.errors
            assert batch.obs["total"].tolist() == [2, 2, 2, 2]
            assert where(pool) == ["b"] * 4
            assert pool.stats()["restored_by_replay"] == 2


async def test_reset_recovers_every_session_whatever_happened():
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        b = network.serve(CounterEnv, server_id="b")
        async with pool_of(network, 4, [a.url, b.url], CounterEnv) as pool:
            await pool.reset(options={"limit": 100})
            await a.kill()
            await b.restart()
            batch = await pool.reset(seed=0, options={"limit": 100})
            assert not batch.errors and len(batch) == 4
            assert pool.stats()["reopened"] == 4
            assert where(pool) == ["b"] * 4


async def test_sessions_spread_evenly_through_one_front_door():
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        b = network.serve(CounterEnv, server_id="b")
        door = network.door(a, b)
        async with pool_of(network, 8, [door] * 2, CounterEnv) as pool:
            assert pool.stats()["servers"] == {"a": 4, "b": 4}
            await pool.reset(seed=0)
            # A cut through the door comes back to each session's own server.
            a.drop_connections()
            b.drop_connections()
            batch = await pool.step([CountAction(amount=1)] * 8)
            assert not batch.errors and batch.obs["total"].tolist() == [1] * 8
            assert pool.stats()["restored_by_replay"] == 0


async def test_a_door_that_lands_a_resume_elsewhere_is_followed_home():
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        b = network.serve(CounterEnv, server_id="b")
        door = network.door(a, b)
        async with pool_of(network, 2, door, CounterEnv) as pool:
            await pool.reset(seed=0, options={"limit": 100})
            link = pool.fleet.slots[0].link
            assert link is not None
            home = link.server_id
            stranger = b if home == "a" else a
            through = network._through
            misrouted: list[str] = []

            def lose_the_header_once(url: str, headers: Any) -> Any:
                if not misrouted:  # the first resume: a door that ignored the header
                    misrouted.append(url)
                    return stranger
                return through(url, headers)

            network._through = lose_the_header_once  # type: ignore[method-assign]
            a.drop_connections()
            b.drop_connections()
            batch = await pool.step([CountAction(amount=1)] * 2)
            assert batch.obs["total"].tolist() == [1, 1]
            assert misrouted and link.connection.protocol.misroutes == 1
            assert pool.stats()["restored_by_replay"] == 0  # re-attached at home
            assert stranger.service.manager.active == 0
            assert where(pool) == [home, home]


async def test_membership_refresh_moves_a_leaving_servers_sessions_and_uses_new_ones():
    async with InProcessNetwork() as network:
        a = network.serve(TallyEnv, server_id="a")
        b = network.serve(TallyEnv, server_id="b")
        members = StaticMembership([a.url, b.url])
        async with pool_of(network, 4, members, TallyEnv) as pool:
            await pool.reset(seed=1)
            await pool.step([TallyAction(add=2)] * 4)
            c = network.serve(TallyEnv, server_id="c")
            members.members = [b.url, c.url]
            added, removed = await pool.fleet.refresh()
            assert added == [c.url] and removed == [a.url]
            batch = await pool.step([TallyAction(add=1)] * 4)
            assert batch.obs["count"].tolist() == [3, 3, 3, 3]
            assert "a" not in where(pool)
            assert "c" in where(pool)  # the newcomer took the moving sessions
            assert pool.stats()["restored_by_snapshot"] == 2


async def test_dns_membership_reresolves():
    answers = [["10.0.0.2", "10.0.0.1", "10.0.0.1"], ["10.0.0.3", "fd00::1"], []]

    async def resolve(host: str, port: int) -> list[str]:
        assert (host, port) == ("corral-headless.ns.svc", 8000)
        answer = answers.pop(0)
        if not answer:
            raise OSError("NXDOMAIN")
        return answer

    dns = DnsMembership("http://corral-headless.ns.svc:8000", resolve)
    assert await dns.urls() == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert await dns.urls() == ["http://10.0.0.3:8000", "http://[fd00::1]:8000"]
    assert await dns.urls() == []  # unknown now: the fleet keeps its servers
    with pytest.raises(ValueError, match="name:port"):
        DnsMembership("http://corral-headless")


async def test_fork_by_snapshot_and_by_replay_and_lineage():
    async with InProcessNetwork() as network:
        a = network.serve(TallyEnv, server_id="a")
        async with pool_of(network, 2, [a.url], TallyEnv) as pool:
            await pool.reset(seed=9)
            await pool.step([TallyAction(add=3)] * 2)
            new = await pool.fork(0, 3)
            assert new == [2, 3, 4] and pool.n == 5
            assert pool.lineage(3) == (0, 1) and pool.lineage(0) is None
            batch = await pool.step([TallyAction(add=1)] * 5)
            counts = batch.obs["count"].tolist()
            walks = batch.obs["walk"].tolist()
            assert counts == [4] * 5 and len(set(walks[2:] + walks[:1])) == 1
        c = network.serve(CounterEnv, server_id="c")
        async with pool_of(network, 2, [c.url], CounterEnv) as pool:
            await pool.reset(seed=1, options={"limit": 100})
            await pool.step([CountAction(amount=4)] * 2)
            (child,) = await pool.fork(1, 1)
            assert child == 2 and pool.stats()["restored_by_replay"] == 0
            batch = await pool.step([CountAction(amount=1)] * 3)
            assert batch.obs["total"].tolist() == [5, 5, 5]
            await pool.reset(ids=[0], options={"limit": 100})  # unseeded
            with pytest.raises(SnapshotUnsupported, match="without a seed"):
                await pool.fork(0, 2)


async def test_a_client_moves_its_session_when_its_server_drains():
    async with InProcessNetwork() as network:
        a = network.serve(TallyEnv, server_id="a")
        b = network.serve(TallyEnv, server_id="b")
        door = network.door(a, b)
        async with AsyncEnvClient(door, env=TallyEnv, dialer=network, ping_interval=None) as env:
            await env.reset(seed=4)
            await env.step(TallyAction(add=2))
            here = env.connection.server_id
            source, other = (a, b) if here == "a" else (b, a)
            drain = asyncio.ensure_future(source.service.drain(30.0))
            for _ in range(200):
                if env._leaving:
                    break
                await asyncio.sleep(0.01)
            result = await env.step(TallyAction(add=1))
            assert result.observation.count == 3
            assert env.connection.server_id == other.service.server_id
            assert env.moves == {"snapshot": 1, "replay": 0}
            await asyncio.wait_for(drain, 20.0)


async def test_a_client_replays_a_lost_session_and_sends_the_step_again():
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        async with AsyncEnvClient(a.url, env=CounterEnv, dialer=network, ping_interval=None) as env:
            await env.reset(seed=4, limit=100)
            await env.step(CountAction(amount=2))
            await env.step(CountAction(amount=3))
            await a.restart()
            result = await env.step(CountAction(amount=1))
            assert result.observation.total == 6
            assert env.moves == {"snapshot": 0, "replay": 1}
            await env.reset(limit=100)  # unseeded: a loss now cannot be replayed
            await env.step(CountAction(amount=1))
            await a.restart()
            with pytest.raises(SessionLost, match="restarted"):  # as before: not replayable
                await env.step(CountAction(amount=1))


async def test_an_unmovable_episode_stays_on_its_draining_server_and_leaves_at_its_reset():
    async with InProcessNetwork() as network:
        a = network.serve(CounterEnv, server_id="a")
        b = network.serve(CounterEnv, server_id="b")
        async with pool_of(network, 2, [a.url, b.url], CounterEnv) as pool:
            await pool.reset(options={"limit": 100})  # unseeded: no replay
            await pool.step([CountAction(amount=1)] * 2)
            assert going_away(a) == 1
            for _ in range(200):
                if pool.fleet.slots[0].move is not None:
                    break
                await asyncio.sleep(0.01)
            batch = await pool.step([CountAction(amount=1)] * 2)
            assert batch.obs["total"].tolist() == [2, 2] and not batch.truncated.any()
            assert where(pool) == ["a", "b"] and pool.stats()["stayed"] == 1
            await pool.reset(seed=0, options={"limit": 100})
            assert where(pool) == ["b", "b"] and pool.stats()["reopened"] == 1


async def test_forked_episodes_record_their_lineage(tmp_path: Path):
    async with InProcessNetwork() as network:
        a = network.serve(TallyEnv, server_id="a")
        pool = pool_of(network, 1, [a.url], TallyEnv, record=tmp_path)
        async with pool:
            await pool.reset(seed=3)
            await pool.step([TallyAction(add=2)])
            await pool.step([TallyAction(add=2)])
            assert await pool.fork(0, 2) == [1, 2]
            await pool.step([TallyAction(add=1)] * 3)
        (path,) = tmp_path.glob("*.jsonl")
        episodes = {e.session: e for e in iter_episodes(path)}
        parent = episodes["pool-0"]
        for child in ("pool-1", "pool-2"):
            first = episodes[child].records[0]
            assert first.parent is not None
            assert (first.parent.episode, first.parent.session, first.parent.step) == (
                parent.id,
                "pool-0",
                2,
            )
            assert first.observation is not None and first.observation["count"] == 4
            second = episodes[child].records[1].observation
            assert second is not None and second["count"] == 5
        assert parent.records[0].parent is None


def test_row_digests_tell_observations_apart_by_every_value_and_array_byte() -> None:
    grid = np.arange(6, dtype=np.int16).reshape(2, 3)
    arrays = [grid, grid.copy(), grid.astype(np.int32), grid.reshape(3, 2), grid.T, None]
    flipped = grid.copy()
    flipped[1, 2] = -1
    arrays.append(flipped)
    n = len(arrays)
    table = ResultTable(
        list(range(n)),
        {"done": [False] * n, "metadata": [{"a": np.ones(2)}] * n, "board": arrays},
    )
    digests = row_digests(table)
    assert digests == [row_digest(table, k) for k in range(n)]  # one row or all: the same
    assert digests[0] == digests[1]  # equal arrays, whatever object holds them
    assert len(set(digests[1:])) == n - 1  # dtype, shape, order, None, a byte: all differ
    # A row digests the same whichever rows share its table (a replay's rows are others).
    alone = ResultTable([0], {"done": [False], "metadata": [{"a": np.ones(2)}], "board": [grid]})
    assert row_digests(alone) == digests[:1] == row_digests(table, [1])
    # A sparse table's rows are digested as rows.
    sparse = ResultTable([0, 1], {"done": [False, True]}, sparse=True)
    assert row_digests(sparse)[0] != row_digests(sparse)[1]

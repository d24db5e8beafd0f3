"""EnvPool's SAME_STEP mode on the server's same-step resets: one request per step, the
same batches as the two-request path (which a server that ignores the flag still gets),
failed resets, and recording."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.support.envs import CountAction, CounterEnv

from corral.client import EnvPool, PoolError
from corral.client.connection import Connection
from corral.envs.echo import EchoAction, EchoEnv
from corral.episodes import read
from corral.errors import EnvError
from corral.protocol.batch import StepItem
from corral.testing import InProcessServer


class SeedOnlyEnv(CounterEnv):
    """An auto-reset (no seed) fails."""

    def reset(self, seed: int | None = None, limit: int = 10, label: str | None = None) -> Any:
        if seed is None:
            raise RuntimeError("this env needs a seed")
        return super().reset(seed, limit, label)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many messages of each type the clients send."""
    counts: Counter[str] = Counter()
    original = Connection.request

    async def request(self: Connection, request: Any, *args: Any, **kwargs: Any) -> Any:
        counts[request.type] += 1
        return await original(self, request, *args, **kwargs)

    monkeypatch.setattr(Connection, "request", request)
    return counts


def ignore_the_flag(server: InProcessServer) -> None:
    """Make ``server`` answer as one that does not know ``autoreset``."""
    batches = server.service.batches
    submit = batches.submit

    def old_submit(peer: Any, batch: Any) -> None:
        request = batch.request
        if getattr(request, "autoreset", False):
            plain = dataclasses.replace(request, autoreset=False)
            batch = dataclasses.replace(batch, request=plain)
        submit(peer, batch)

    batches.submit = old_submit


async def play(pool: EnvPool[Any, Any, Any]) -> list[Any]:
    """The scenario of test_pool.py's same-step test, and what each batch said."""
    seen = []
    await pool.reset(seed=5, options={"limit": 2})
    for amounts in ([1, 2, 1], [1, 1, 1], [3, 3, 3]):
        batch = await pool.step([CountAction(amount=a) for a in amounts])
        seen.append(
            (
                batch.obs["total"].tolist(),
                batch.rewards.tolist(),
                batch.terminated.tolist(),
                batch.truncated.tolist(),
                [(_final_total(i), i.get("final_info"), "seed" in i) for i in batch.infos],
                [o.total for o in batch.observations],
            )
        )
    return seen


def _final_total(info: dict[str, Any]) -> int | None:
    final = info.get("final_obs")
    return None if final is None else int(final.total)


EXPECTED = [
    (
        [1, 0, 1],
        [1.0, 2.0, 1.0],
        [False, True, False],
        [False, False, False],
        [(None, None, False), (2, {}, True), (None, None, False)],
        [1, 0, 1],
    ),
    (
        [0, 1, 0],
        [1.0, 1.0, 1.0],
        [True, False, True],
        [False, False, False],
        [(2, {}, True), (None, None, False), (2, {}, True)],
        [0, 1, 0],
    ),
    (
        [3, 4, 3],
        [3.0, 3.0, 3.0],
        [False, False, False],
        [False, False, False],
        [(None, None, False)] * 3,
        [3, 4, 3],
    ),
]


@pytest.mark.parametrize("codec", ["msgpack", "json"])
@pytest.mark.parametrize("old_server", [False, True], ids=["autoreset", "ignored"])
async def test_same_step_batches_are_the_same_on_either_path(
    sent: Counter[str], codec: str, old_server: bool
) -> None:
    async with InProcessServer(CounterEnv) as srv:
        if old_server:
            ignore_the_flag(srv)
        async with srv.pool(3, autoreset_mode="SameStep", codec=codec) as pool:
            sent.clear()
            assert await play(pool) == EXPECTED
        assert sent["step_batch"] == 3
        # Two steps ended episodes: the server reset them, or the pool did, asking again.
        assert sent["reset_batch"] == (3 if old_server else 1)  # the first is reset()
        assert srv.manager.stats.resets == 3 + 3  # the reset wave, and three auto-resets


@pytest.mark.parametrize("old_server", [False, True], ids=["autoreset", "ignored"])
async def test_a_failed_same_step_reset_is_the_sessions_error(old_server: bool) -> None:
    async with InProcessServer(SeedOnlyEnv) as srv:
        if old_server:
            ignore_the_flag(srv)
        # Without recovery the pool's auto-resets are unseeded (with it, each draws a
        # seed so its episode can be replayed, and this env's reset would not fail).
        async with srv.pool(2, autoreset_mode="SameStep", recover=False) as pool:
            await pool.reset(seed=1, options={"limit": 1})
            with pytest.raises(PoolError) as failed:
                await pool.step([CountAction(amount=1), CountAction(amount=0)])
            assert list(failed.value.errors) == [0]
            assert isinstance(failed.value.errors[0], EnvError)
            assert failed.value.batch.ids.tolist() == [1]
            assert pool.fleet.slots[0].needs_reset
            # Its next step resets it first (and fails again: the env needs a seed).
            with pytest.raises(PoolError) as again:
                await pool.step([CountAction(amount=1), CountAction(amount=0)])
            assert list(again.value.errors) == [0]
            await pool.reset(seed=2, ids=[0], options={"limit": 5})
            batch = await pool.step([CountAction(amount=1), CountAction(amount=0)])
            assert batch.obs["total"].tolist() == [1, 0]


async def test_same_step_resets_are_recorded_as_resets(tmp_path: Path) -> None:
    async with InProcessServer(EchoEnv) as srv:
        pool: EnvPool[Any, Any, Any] = srv.pool(2, autoreset_mode="SameStep", record=tmp_path)
        async with pool:
            await pool.reset(seed=10)
            batch = await pool.step([EchoAction(message="bye"), EchoAction(message="hi")])
            assert batch.terminated.tolist() == [True, False]
            await pool.step([EchoAction(message="again"), EchoAction(message="bye")])
            seeds = [slot.log.seed for slot in pool.fleet.slots]
        assert None not in seeds and 10 not in seeds and 11 not in seeds
        (path,) = tmp_path.glob("*.jsonl")
        episodes = {(e.records[0].session, e.seed): e for e in read(path)}
        first = episodes[("pool-0", 10)]
        assert [r.op for r in first.records] == ["reset", "step"] and first.complete
        # the same-step reset, recorded as a reset with the seed the server used
        second = episodes[("pool-0", seeds[0])]
        assert [r.op for r in second.records] == ["reset", "step"]
        assert second.records[1].action == {"message": "again"}
        other = episodes[("pool-1", 11)]
        assert [r.op for r in other.records] == ["reset", "step", "step"] and other.complete
        assert ("pool-1", seeds[1]) in episodes


async def episode_ids(old_server: bool, **kwargs: Any) -> list[str]:
    """The episode of each session after :func:`play` (``CounterEnv`` names it by its
    seed), with a server that runs the same-step resets or one that ignores the flag."""
    async with InProcessServer(CounterEnv) as srv:
        if old_server:
            ignore_the_flag(srv)
        async with srv.pool(3, autoreset_mode="SameStep", **kwargs) as pool:
            assert await play(pool) == EXPECTED
            return [state.episode_id for state in await pool.state()]


@pytest.mark.parametrize("recover", [True, False], ids=["recover", "no-recover"])
async def test_same_step_resets_are_seeded_from_the_pools_generator(recover: bool) -> None:
    """A pool given a seed plays the same episodes again, whoever runs its resets."""
    seeded = await episode_ids(False, seed=5, recover=recover)
    assert len(set(seeded)) == 3 and "seed-None" not in seeded
    assert await episode_ids(False, seed=5, recover=recover) == seeded
    assert await episode_ids(True, seed=5, recover=recover) == seeded
    assert await episode_ids(False, seed=6, recover=recover) != seeded


async def test_a_seeded_reset_makes_the_same_step_resets_after_it_repeatable() -> None:
    """No pool seed, recovery on: the auto-resets' seeds come from the reset's seeds (as
    a local env's generator would go on from its seed), not from the OS."""
    seeded = await episode_ids(False)
    assert len(set(seeded)) == 3 and "seed-None" not in seeded
    assert await episode_ids(False) == seeded


async def test_without_a_seed_or_recovery_same_step_resets_are_unseeded() -> None:
    """Nothing to repeat or replay: the environment's own generator goes on, and the
    steps carry no seed."""
    seen: list[Any] = []
    original = Connection.request

    async def request(self: Connection, message: Any, *args: Any, **kwargs: Any) -> Any:
        seen.extend(getattr(message, "items", ()))
        return await original(self, message, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Connection, "request", request)
        assert await episode_ids(False, recover=False) == ["seed-None"] * 3
    steps = [item for item in seen if isinstance(item, StepItem)]
    assert steps and all(item.reset_seed is None for item in steps)

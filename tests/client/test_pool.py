"""EnvPool: batching, stacking, autoreset modes, send/recv, recovery.

The pool's own behaviour runs against in-process servers (:mod:`corral.testing`: the same
client code, no socket); what is about processes (servers the pool starts, a killed one
replaced) runs against real ones.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from tests.support.envs import CountAction, CounterEnv, CountObservation, CountState
from tests.support.pools import launched_pool

from corral.client import AutoresetMode, EnvPool, PoolError
from corral.contract import Environment, Observation
from corral.contract.arrays import Array
from corral.envs.echo import EchoAction, EchoEnv
from corral.errors import (
    ConnectionLost,
    EnvError,
    EpisodeEnded,
    ErrorCode,
    InvalidAction,
    SessionLost,
)
from corral.testing import InProcessNetwork, InProcessServer


class ShortEcho(EchoEnv):
    """Echo whose episodes are truncated after two steps."""

    def __init__(self) -> None:
        super().__init__(max_steps=2)


class Frame(Observation):
    pixels: Array(dtype="uint8", shape=(4, 5, 3))  # type: ignore[valid-type]
    score: float = 0.0


class ImageEnv(Environment[CountAction, Frame, CountState]):
    """Observations with an image; pixel values encode the session's step count."""

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, seed: int | None = None, **options: Any) -> Frame:
        self.steps = 0
        return Frame(pixels=np.full((4, 5, 3), seed or 0, dtype=np.uint8))

    def step(self, action: CountAction) -> Frame:
        self.steps += action.amount
        return Frame(pixels=np.full((4, 5, 3), self.steps, dtype=np.uint8), score=0.5)

    def state(self) -> CountState:
        return CountState(step_count=self.steps)


@pytest.fixture
async def counter():
    async with InProcessServer(CounterEnv, max_batch=4, step_timeout_s=10) as srv:
        yield srv


@pytest.fixture
def counter_twin():
    """The server of the blocking twins' tests (closed on corral's background loop)."""
    with InProcessServer(CounterEnv, max_batch=4, step_timeout_s=10) as srv:
        yield srv


async def test_reset_and_step_are_batched_and_stacked(counter):
    async with counter.pool(10, sessions_per_connection=3) as pool:
        assert pool.num_envs == len(pool) == 10
        first = await pool.reset(seed=100, options={"limit": 50})
        assert first.ids.tolist() == list(range(10))
        assert [info["seed"] for info in first.infos] == list(range(100, 110))
        batch = await pool.step([CountAction(amount=i) for i in range(10)])
        assert batch.ids.tolist() == list(range(10))
        assert batch.rewards.dtype == np.float64 and batch.rewards.tolist() == list(range(10))
        assert batch.terminated.dtype == bool and not batch.dones.any()
        assert isinstance(batch.observations[3], CountObservation)
        assert batch.obs["total"].dtype == np.int64 and batch.obs["total"].tolist() == list(
            range(10)
        )
        assert batch.obs["label"] == [None] * 10  # not numeric: a list
        states = await pool.state([2, 9])
        assert [s.total for s in states] == [2, 9]
        results = batch.results()
        assert [r.observation.total for r in results] == list(range(10))
        assert results[4].reward == 4.0 and not results[4].done and results[4].info == {}
        # Dicts are validated locally; per-session seeds and options work too.
        again = await pool.reset(seed=[1, None] * 5, options=[{"label": str(i)} for i in range(10)])
        assert [o.label for o in again.observations] == [str(i) for i in range(10)]
        assert again.infos[1] == {"seed": None}
        with pytest.raises(InvalidAction) as err:
            await pool.step([{"amount": "many"}] * 10)
        assert err.value.details["index"] == 0
        with pytest.raises(ValueError, match="10 actions"):
            await pool.step([CountAction()])


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_array_observations_stack_into_arrays(codec):
    async with InProcessServer(ImageEnv) as srv, srv.pool(6, codec=codec) as pool:
        first = await pool.reset(seed=7)
        assert first.obs["pixels"].shape == (6, 4, 5, 3)
        assert first.obs["pixels"].dtype == np.uint8
        assert first.obs["pixels"][:, 0, 0, 0].tolist() == list(range(7, 13))
        batch = await pool.step([CountAction(amount=i) for i in range(6)])
        assert batch.obs["pixels"][:, 3, 4, 2].tolist() == list(range(6))
        assert batch.obs["score"].tolist() == [0.5] * 6


async def test_models_from_the_servers_schema(counter):
    async with counter.pool(2, env=None) as pool:
        await pool.reset()
        batch = await pool.step([{"amount": 3}, {"amount": 4}])
        assert type(batch.observations[0]).__name__ == "CountObservation"
        assert batch.obs["total"].tolist() == [3, 4]


async def test_failed_sessions_raise_or_return(counter):
    async with counter.pool(4) as pool:
        await pool.reset(options={"limit": 100})
        actions = [
            CountAction(amount=1),
            CountAction(fail=True),
            CountAction(amount=1),
            CountAction(amount=2),
        ]
        with pytest.raises(PoolError) as err:
            await pool.step(actions)
        assert set(err.value.errors) == {1}
        assert isinstance(err.value.errors[1], EnvError)
        assert err.value.code == ErrorCode.ENV_ERROR
        assert err.value.batch.ids.tolist() == [0, 2, 3]
        assert "1 of 4 sessions failed" in err.value.message
    async with counter.pool(4, on_error="return") as pool:
        await pool.reset(options={"limit": 100})
        batch = await pool.step(actions)
        assert batch.ids.tolist() == [0, 2, 3] and list(batch.errors) == [1]
        assert batch.obs["total"].tolist() == [1, 1, 2]
        again = await pool.step([CountAction()] * 4)  # the failed session lives on
        assert again.obs["total"].tolist() == [2, 1, 2, 3]


async def test_next_step_autoreset():
    async with InProcessServer(ShortEcho) as srv, srv.pool(2) as pool:
        assert pool.autoreset_mode is AutoresetMode.NEXT_STEP
        await pool.reset()
        act = [EchoAction(message="abc")] * 2
        one = await pool.step(act)
        assert not one.dones.any()
        two = await pool.step(act)
        assert two.truncated.all() and not two.terminated.any()
        assert two.obs["echoed_message"] == ["abc", "abc"]
        three = await pool.step(act)  # resets instead of stepping
        assert three.obs["echoed_message"] == ["ready", "ready"]
        assert three.rewards.tolist() == [0.0, 0.0] and not three.dones.any()
        four = await pool.step(act)
        assert four.obs["echoed_message"] == ["abc", "abc"]
        assert four.rewards.tolist() == pytest.approx([0.3, 0.3])


async def test_same_step_autoreset():
    srv = InProcessServer(CounterEnv)
    async with srv, srv.pool(3, autoreset_mode="SameStep") as pool:
        assert pool.autoreset_mode is AutoresetMode.SAME_STEP
        await pool.reset(seed=5, options={"limit": 2})
        first = await pool.step([CountAction(amount=1), CountAction(amount=2), CountAction()])
        assert first.terminated.tolist() == [False, True, False]
        assert first.rewards.tolist() == [1.0, 2.0, 1.0]
        ended = first.infos[1]
        assert ended["final_obs"].total == 2 and ended["final_obs"].done
        assert ended["final_info"] == {}
        # the reset's info: the seed drawn for the new episode (so it can be replayed)
        assert ended["seed"] is not None and ended["seed"] == pool.fleet.slots[1].log.seed
        assert first.observations[1].total == 0  # already the new episode
        assert "final_obs" not in first.infos[0]
        second = await pool.step([CountAction(amount=1)] * 3)
        # 0 and 2 reach their limit and restart at once; 1's new episode (default
        # limit 10) goes on.
        assert second.terminated.tolist() == [True, False, True]
        assert second.obs["total"].tolist() == [0, 1, 0]
        assert [i["final_obs"].total for i in (second.infos[0], second.infos[2])] == [2, 2]


async def test_disabled_autoreset_needs_masked_resets():
    srv = InProcessServer(CounterEnv)
    async with srv, srv.pool(3, autoreset_mode=AutoresetMode.DISABLED) as pool:
        await pool.reset(options={"limit": 1})
        ended = await pool.step([CountAction()] * 3)
        assert ended.terminated.all()
        with pytest.raises(PoolError) as err:
            await pool.step([CountAction()] * 3)
        assert all(isinstance(e, EpisodeEnded) for e in err.value.errors.values())
        fresh = await pool.reset(mask=np.array([True, False, True]), options={"limit": 5})
        assert fresh.ids.tolist() == [0, 2]
        partial = await pool.reset(ids=[1], options={"limit": 5})  # ids work as well
        assert partial.ids.tolist() == [1]
        batch = await pool.step([CountAction()] * 3)
        assert batch.obs["total"].tolist() == [1, 1, 1]
        with pytest.raises(ValueError, match="mask must hold 3"):
            await pool.reset(mask=[True])
        with pytest.raises(ValueError, match="not both"):
            await pool.reset(ids=[0], mask=[True, True, True])


async def test_recv_returns_whichever_finished_first(counter):
    async with counter.pool(4) as pool:
        await pool.reset(options={"limit": 100})
        for sid, pause in [(0, 1.2), (1, 0.0), (2, 0.6)]:
            await pool.send([CountAction(amount=sid + 1, sleep=pause)], session_ids=[sid])
        with pytest.raises(ValueError, match="still have a step in flight"):
            await pool.send([CountAction()], session_ids=[2])
        with pytest.raises(ValueError, match="pending"):
            await pool.step([CountAction()] * 4)
        order = []
        for _ in range(3):
            got = await pool.recv(min_results=1, timeout=10)
            order.extend(got.ids.tolist())
        assert order == [1, 2, 0]
        empty = await pool.recv(min_results=0, timeout=0.05)
        assert len(empty) == 0
        with pytest.raises(ValueError, match="only 0 sessions are in flight"):
            await pool.recv(min_results=1)
        # Sessions sent together come back together; recv() waits for all by default.
        await pool.send([CountAction(amount=1)] * 4)
        everything = await pool.recv()
        assert everything.ids.tolist() == [0, 1, 2, 3]
        assert everything.obs["total"].tolist() == [2, 3, 4, 1]


async def test_send_waits_for_back_pressure(counter):
    async with counter.pool(2, max_in_flight=1) as pool:
        await pool.reset(options={"limit": 100})
        await pool.send([CountAction(sleep=0.5)], session_ids=[0])
        blocked = asyncio.ensure_future(pool.send([CountAction()], session_ids=[1]))
        await asyncio.sleep(0.2)
        assert not blocked.done()  # one message in flight on the only connection
        first = await pool.recv(min_results=1, timeout=10)
        assert first.ids.tolist() == [0]
        await asyncio.wait_for(blocked, 5)
        second = await pool.recv(timeout=10)
        assert second.ids.tolist() == [1]


async def test_batches_are_split_to_the_servers_limit(counter):
    # The server takes 4 items per batch.
    async with counter.pool(10, sessions_per_connection=10) as pool:
        await pool.reset(options={"limit": 100})
        batch = await pool.step([CountAction(amount=2)] * 10)
        assert batch.obs["total"].tolist() == [2] * 10
        assert len(pool.fleet.servers[0].links) == 1


async def test_many_servers_started_by_the_pool_with_a_progress_bar():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    pool = EnvPool(
        6,
        "tests.support.envs:CounterEnv",
        env=CounterEnv,
        servers=2,
        progress=True,
        console=console,
    )
    async with pool:
        assert len(set(pool.server_urls)) == 2
        await pool.reset(options={"limit": 100})
        batch = await pool.step([CountAction(amount=1)] * 6)
        assert batch.obs["total"].tolist() == [1] * 6
        handles = [s.handle for s in pool.fleet.servers]
    assert all(h is not None and not h.running for h in handles)
    shown = out.getvalue()
    assert "starting servers" in shown and "opening sessions" in shown


async def test_a_dead_server_is_replaced_and_its_sessions_reset():
    # Without recovery (with it, see test_rehoming: the sessions move, episodes intact).
    pool = EnvPool(
        4,
        "tests.support.envs:CounterEnv",
        env=CounterEnv,
        servers=2,
        health_interval=0.2,
        on_error="return",
        progress=False,
        recover=False,
    )
    async with pool:
        await pool.reset(options={"limit": 100})
        await pool.step([CountAction(amount=5)] * 4)
        victim = pool.fleet.servers[1]
        old_url = victim.url
        os.killpg(victim.handle.process.pid, signal.SIGKILL)
        victim.handle.process.wait()
        # Until it is replaced, its sessions fail; the others go on.
        for _ in range(200):
            batch = await pool.step([CountAction(amount=1)] * 4)
            if not batch.errors:
                break
            assert set(batch.errors) <= {2, 3}
            lost = (ConnectionLost, SessionLost)
            assert all(isinstance(e, lost) for e in batch.errors.values()), batch.errors
            await asyncio.sleep(0.05)
        assert pool.server_urls[1] != old_url
        # Sessions 2 and 3 were reset on the new server (next-step autoreset).
        assert batch.obs["total"].tolist()[2:] in ([0, 0], [1, 1])
        states = await pool.state()
        assert states[0].total >= 6 and states[2].total <= 1


async def test_a_health_check_that_raises_does_not_end_the_checks(counter, caplog):
    # A provider's API can fail (Docker's, Kubernetes'): the monitor says so and checks on.
    async with counter.pool(2, health_interval=0.01) as pool:
        fleet = pool.fleet
        real = fleet._healthy
        checked_after = asyncio.Event()
        calls = 0

        async def flaky(server: Any, http: Any) -> bool:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("the provider's API is down")
            checked_after.set()
            return await real(server, http)

        fleet._healthy = flaky  # type: ignore[method-assign]
        await asyncio.wait_for(checked_after.wait(), 60)
        assert fleet._monitor is not None and not fleet._monitor.done()
    assert "the provider's API is down" in caplog.text


async def test_a_dropped_connection_resumes_with_the_episode_intact(counter):
    async with counter.pool(2, health_interval=0.1) as pool:
        await pool.reset(options={"limit": 100})
        await pool.step([CountAction(amount=3)] * 2)
        connection = pool.fleet.servers[0].links[0].connection
        connection._ws.abort()
        batch = await pool.step([CountAction(amount=1)] * 2)  # re-sent once reconnected
        assert batch.obs["total"].tolist() == [4, 4]  # the episodes survived
        assert connection.reconnects >= 1


async def test_a_connection_that_gave_up_is_re_established_by_the_fleet(counter):
    pool = counter.pool(2, health_interval=None)
    async with pool:
        await pool.reset(options={"limit": 100})
        await pool.step([CountAction(amount=3)] * 2)
        sessions = [s.session for s in pool.fleet.slots]
        connection = pool.fleet.servers[0].links[0].connection
        connection.protocol.policy = None  # this drop fails the connection for good
        connection._ws.abort()
        for _ in range(200):
            if connection.protocol.failure is not None:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(PoolError) as err:  # the step in the way fails, and is reported
            await pool.step([CountAction(amount=1)] * 2)
        assert all(isinstance(e, ConnectionLost) for e in err.value.errors.values())
        # After the fleet's recovery: the same sessions, re-attached on the same connection;
        # the pool resets them, since the failed step left their state unknown.
        batch = await pool.step([CountAction(amount=1)] * 2)
        assert batch.obs["total"].tolist() == [0, 0] and batch.rewards.tolist() == [0, 0]
        assert [s.session for s in pool.fleet.slots] == sessions
        assert pool.fleet.servers[0].links[0].connection is connection and connection.connected
        assert (await pool.step([CountAction(amount=2)] * 2)).obs["total"].tolist() == [2, 2]


def test_sync_twin(counter_twin):
    with counter_twin.pool(3).sync() as pool:
        assert pool.num_envs == 3 and pool.autoreset_mode is AutoresetMode.NEXT_STEP
        pool.reset(options={"limit": 100})
        assert pool.step([CountAction(amount=2)] * 3).obs["total"].tolist() == [2, 2, 2]
        pool.send([CountAction(amount=1)], session_ids=[1])
        got = pool.recv(timeout=5)
        assert got.ids.tolist() == [1] and got.obs["total"].tolist() == [3]
        assert [s.total for s in pool.state()] == [2, 3, 2]


def test_a_blocking_send_returns_with_its_messages_written(counter_twin):
    with counter_twin.pool(2).sync() as pool:
        pool.reset(options={"limit": 100})
        pool.send([CountAction(sleep=1.0)] * 2)
        # Nothing runs the loop now (the caller computes, as a pipelining trainer does),
        # and the request is already out, not waiting for the next call.
        link = pool._async.fleet.slots[0].link
        assert link is not None
        assert list(link.connection.tracker.outstanding().values()) == ["step_batch"]
        assert pool.recv(timeout=30).obs["total"].tolist() == [1, 1]


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="n >= 1"):
        EnvPool(0, "http://127.0.0.1:1")
    with pytest.raises(ValueError, match="neither a URL nor"):
        EnvPool(1, "echo")
    with pytest.raises(ValueError, match="servers= is for targets"):
        EnvPool(1, ["http://127.0.0.1:1"], servers=2)
    with pytest.raises(ValueError, match="autoreset_mode"):
        EnvPool(1, "http://127.0.0.1:1", autoreset_mode="sometimes")
    with pytest.raises(ValueError, match="on_error"):
        EnvPool(1, "http://127.0.0.1:1", on_error="ignore")  # type: ignore[arg-type]


async def test_unstarted_and_closed_pools(counter):
    pool = counter.pool(1)
    with pytest.raises(RuntimeError, match="start the pool first"):
        await pool.step([CountAction()])
    await pool.start()
    await pool.close()
    with pytest.raises(Exception) as err:
        await pool.step([CountAction()])
    assert getattr(err.value, "code", None) == ErrorCode.CLIENT_CLOSED
    assert counter.manager.active == 0 or counter.manager.stats.closed > 0


async def test_a_pool_closed_by_a_cancelled_task_still_stops_its_servers():
    # A trainer's task cancelled (a Ctrl-C through asyncio.run, a timeout) leaves the
    # pool's `async with` while unwinding that cancellation: the close must run to its
    # end. It used to stop at its first wait for a task it had cancelled (the health
    # monitor's), re-raising the cancellation, and left the servers running.
    async with InProcessNetwork() as network:
        ready = asyncio.Event()

        async def train() -> None:
            async with launched_pool(network) as pool:
                await pool.reset()
                ready.set()
                await asyncio.Event().wait()

        training = asyncio.create_task(train())
        await ready.wait()
        assert len(network.servers) == 2
        training.cancel()
        with pytest.raises(asyncio.CancelledError):
            await training
        assert network.servers == []

"""PoolBatch built from columns: numpy first, typed models only on demand; the pool's
columnar path against a real server equals the row path; pipelined send/recv."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import numpy as np
import pytest
from tests.support.envs import CountAction, CounterEnv, CountObservation

from corral.client import PoolError
from corral.client.batch import PoolBatch, ResultTable, scalar_dtypes
from corral.errors import InvalidAction, SessionLost
from corral.protocol.batch import ABSENT
from corral.testing import InProcessServer


def _table() -> ResultTable:
    return ResultTable(
        [3, 1, 2],
        {
            "total": [5, 6, 7],
            "label": ["a", "b", None],
            "reward": [1.0, None, 2],
            "done": [False, True, True],
            "truncated": [False, False, True],
            "metadata": [{"k": 1}, {}, {}],
        },
    )


def test_arrays_come_from_columns_without_building_models():
    decoded: list[list[Any]] = []

    def decode(rows: list[Any]) -> list[CountObservation]:
        decoded.append(rows)
        return [CountObservation.model_validate(r) for r in rows]

    batch = PoolBatch(_table(), decode, scalar_dtypes(CountObservation))
    assert batch.ids.tolist() == [3, 1, 2]
    assert batch.rewards.tolist() == [1.0, 0.0, 2.0]
    assert batch.terminated.tolist() == [False, True, False]
    assert batch.truncated.tolist() == [False, False, True]
    assert batch.dones.tolist() == [False, True, True]
    assert batch.obs["total"].dtype == np.int64 and batch.obs["total"].tolist() == [5, 6, 7]
    assert batch.infos == [{"k": 1}, {}, {}]
    assert decoded == []  # nothing above needed a model
    observations = batch.observations
    assert [o.total for o in observations] == [5, 6, 7]
    assert batch.observations is observations and len(decoded) == 1  # built once
    results = batch.results()
    assert [r.reward for r in results] == [1.0, 0.0, 2.0]
    assert [r.terminated for r in results] == [False, True, False]


def test_array_columns_stack_as_np_stack_does():
    wire = np.frombuffer(np.arange(8, dtype=np.float32).tobytes(), dtype=np.float32)
    rows = [wire[:4], wire[4:]]  # read-only views of one payload, as decoded from the wire
    table = ResultTable([0, 1], {"x": rows, "y": [wire[:4], wire[:2]], "z": [wire[:1], 5]})
    obs = PoolBatch(table, lambda raws: [], {}).obs
    assert obs["x"].dtype == np.float32 and np.array_equal(obs["x"], np.stack(rows))
    assert obs["x"].flags.writeable and not np.shares_memory(obs["x"], wire)
    assert isinstance(obs["y"], list) and isinstance(obs["z"], list)  # shapes or types differ
    masked = [np.ma.masked_array([1, 2], mask=[True, False])] * 2  # a subclass: np.stack
    stacked = PoolBatch(ResultTable([0, 1], {"m": masked}), lambda raws: [], {}).obs["m"]
    assert type(stacked) is type(np.stack(masked))


def test_a_field_without_a_plain_type_is_read_from_the_models():
    calls = 0

    def decode(rows: list[Any]) -> list[CountObservation]:
        nonlocal calls
        calls += 1
        return [CountObservation.model_validate(r) for r in rows]

    table = _table()
    table.fields["when"] = ["2026-01-01T00:00:00", None, None]
    batch = PoolBatch(table, decode, scalar_dtypes(CountObservation))
    assert batch.obs["label"] == ["a", "b", None]  # a None: from the models, as a list
    assert batch.obs["when"][0].year == 2026  # parsed by the model, not the wire string
    assert calls == 1


def test_flags_and_extra_infos_override_by_session():
    table = _table()
    table.flags[1] = (0.0, False, False)
    table.extra[2] = {"final_info": {"x": 1}}
    batch = PoolBatch(table, lambda rows: [], {})
    assert batch.rewards.tolist() == [1.0, 0.0, 2.0]
    assert batch.terminated.tolist() == [False, False, False]
    assert batch.infos[2] == {"final_info": {"x": 1}}


def test_final_observations_are_typed_when_infos_are_read():
    table = _table()
    table.finals[2] = {"total": 9, "done": True, "metadata": {"m": 1}}
    table.extra[2] = {"final_info": {"m": 1}}
    decoded: list[list[Any]] = []

    def decode(rows: list[Any]) -> list[CountObservation]:
        decoded.append(rows)
        return [CountObservation.model_validate(r) for r in rows]

    batch = PoolBatch(table, decode, {})
    assert batch.rewards.tolist() == [1.0, 0.0, 2.0] and decoded == []
    assert batch.infos_with(lambda row: row["total"])[2] == {"final_obs": 9, "final_info": {"m": 1}}
    assert decoded == []  # an adapter's own form: no model
    info = batch.infos[2]
    assert list(info) == ["final_obs", "final_info"] and info["final_obs"].total == 9
    assert decoded == [[table.finals[2]]]
    head, tail = table.split(2)  # the final observation goes with its session's row
    assert head.finals == {} and tail.finals == {2: table.finals[2]}
    assert ResultTable.concat([head, tail], [3, 1, 2]).finals == table.finals


def test_concat_orders_rows_and_split_keeps_everything():
    a = ResultTable([0, 2], {"total": [0, 2]})
    b = ResultTable([1], {"total": [1], "label": ["x"]}, errors={3: SessionLost("gone")})
    merged = ResultTable.concat([a, b], [0, 1, 2, 3])
    assert merged.ids == [0, 1, 2]
    assert merged.fields == {"total": [0, 1, 2], "label": [ABSENT, "x", ABSENT]}
    assert merged.column("label") == [None, "x", None] and merged.row(0) == {"total": 0}
    assert set(merged.errors) == {3}
    head, tail = merged.split(2)
    assert set(head.errors) == {3} and head.ids == [0]
    assert tail.ids == [1, 2] and tail.fields["total"] == [1, 2]
    assert head.count + tail.count == merged.count == 4


def test_rows_with_different_fields_make_one_table():
    table = ResultTable.from_rows([0, 1], [{"a": 1}, {"a": 2, "b": 3}])
    assert table.fields == {"a": [1, 2], "b": [ABSENT, 3]} and table.sparse
    assert table.row(0) == {"a": 1} and table.column("b") == [None, 3]


@pytest.fixture
async def counter():
    async with InProcessServer(CounterEnv, max_batch=64) as srv:
        yield srv


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_the_pool_reads_either_reply_form_alike(counter, codec):
    async with counter.pool(6, codec=codec) as pool:
        first = await pool.reset(seed=1, options={"limit": 3, "label": "L"})
        assert first.obs["total"].tolist() == [0] * 6
        assert [o.label for o in first.observations] == ["L"] * 6
        batch = await pool.step([CountAction(amount=k % 3 + 1) for k in range(6)])
        assert batch.obs["total"].tolist() == [1, 2, 3, 1, 2, 3]
        assert batch.terminated.tolist() == [False, False, True] * 2
        assert [o.total for o in batch.observations] == [1, 2, 3, 1, 2, 3]
        # NEXT_STEP: the ended sessions come back reset, with zero reward and no flags
        again = await pool.step([CountAction(amount=1)] * 6)
        assert again.obs["total"].tolist() == [2, 3, 0, 2, 3, 0]
        assert again.terminated.tolist() == [False, True, False, False, True, False]
        assert again.rewards[[2, 5]].tolist() == [0.0, 0.0]


async def test_a_batch_larger_than_the_server_limit_is_split_and_ordered(counter):
    async with counter.pool(150) as pool:
        await pool.reset(options={"limit": 1000})
        batch = await pool.step([CountAction(amount=k) for k in range(150)])
        assert batch.ids.tolist() == list(range(150))
        assert batch.obs["total"].tolist() == list(range(150))


async def test_failed_items_are_named_never_dropped(counter):
    async with counter.pool(4) as pool:
        await pool.reset(options={"limit": 100})
        with pytest.raises(PoolError) as err:
            await pool.step([CountAction(), CountAction(fail=True), CountAction(), CountAction()])
        assert set(err.value.errors) == {1}
        assert err.value.batch.ids.tolist() == [0, 2, 3]
        assert err.value.batch.obs["total"].tolist() == [1, 1, 1]


async def test_pipelined_halves_come_back_whole_and_every_step_counts(counter):
    n = 8
    halves = [list(range(n // 2)), list(range(n // 2, n))]
    async with counter.pool(n, max_in_flight=2) as pool:
        await pool.reset(options={"limit": 10_000})
        sent = np.zeros(n, dtype=np.int64)
        seen = np.zeros(n, dtype=np.int64)
        for half in halves:
            await pool.send([CountAction(amount=1)] * 4, session_ids=half)
            sent[half] += 1
        for _ in range(30):  # the EnvPool loop: send back exactly what recv returned
            got = await pool.recv(min_results=4, max_results=4)
            assert sorted(got.ids.tolist()) in halves  # a half comes back whole
            seen[got.ids] = got.obs["total"]
            await pool.send([CountAction(amount=1)] * 4, session_ids=got.ids)
            sent[got.ids] += 1
        rest = await pool.recv()
        seen[rest.ids] = rest.obs["total"]
        assert len(rest) == 8
        assert seen.tolist() == sent.tolist()  # every step applied exactly once, none lost


async def test_pipelined_failures_come_back_as_errors(counter):
    async with counter.pool(4, on_error="return") as pool:
        await pool.reset(options={"limit": 100})
        await pool.send([CountAction(fail=True), CountAction()], session_ids=[0, 1])
        await pool.send([CountAction(), CountAction(fail=True)], session_ids=[2, 3])
        got = await pool.recv(min_results=4)
        assert len(got) + len(got.errors) == 4
        assert set(got.errors) == {0, 3}
        assert sorted(got.ids.tolist()) == [1, 2]
        with pytest.raises(InvalidAction):  # refused locally: nothing is sent or pending
            await pool.send([{"amount": "many"}], session_ids=[0])
        await pool.send([CountAction()], session_ids=[0])
        assert (await pool.recv()).ids.tolist() == [0]


async def test_recv_split_keeps_the_rest_ready(counter):
    async with counter.pool(6) as pool:
        await pool.reset(options={"limit": 100})
        await pool.send([CountAction()] * 6)
        await asyncio.sleep(0)
        head = await pool.recv(min_results=6, max_results=4)
        tail = await pool.recv(timeout=5)
        assert sorted(head.ids.tolist() + tail.ids.tolist()) == list(range(6))
        assert len(head) == 4


async def test_the_pool_keeps_no_earlier_batch_alive(counter):
    async with counter.pool(8) as pool:
        await pool.reset(options={"limit": 100})
        batch = await pool.step([CountAction()] * 8)
        probes = [weakref.ref(batch), weakref.ref(batch.observations[0])]
        del batch
        await pool.step([CountAction()] * 8)
        gc.collect()
        assert [probe() for probe in probes] == [None, None]


@pytest.mark.parametrize("control", [True, False, None])
async def test_no_collection_inside_a_batch_and_waves_are_frozen(counter, control):
    """Only a pool asked to (``gc_control=True``) touches the collector; by default the
    trainer's is left alone."""
    gc.unfreeze()
    chosen = {} if control is None else {"gc_control": control}
    control = control is True
    try:
        async with counter.pool(64, **chosen) as pool:
            assert (gc.get_freeze_count() > 0) is control  # start-up state frozen
            frozen = gc.get_freeze_count()
            await pool.reset(options={"limit": 100})
            assert (gc.get_freeze_count() > frozen) is control  # and the reset wave's
            collector_on: list[bool] = []
            exchange = pool._exchange

            async def watched(*args: Any, **kwargs: Any) -> Any:
                collector_on.append(gc.isenabled())  # while the batch is being sent
                table = await exchange(*args, **kwargs)
                collector_on.append(gc.isenabled())  # and when its reply was decoded
                return table

            pool._exchange = watched  # type: ignore[method-assign]
            actions = [CountAction()] * 64
            for _ in range(3):
                await pool.step(actions)
                assert gc.isenabled()  # back on after each batch
            assert collector_on == [not control] * 6
    finally:
        gc.unfreeze()


def test_a_field_some_observations_lack_stays_absent():
    table = ResultTable.from_rows(
        [0, 1], [{"total": 1, "reward": 1.0}, {"total": 2, "reward_components": {"a": 1.0}}]
    )
    assert table.sparse
    batch = PoolBatch(
        table, lambda rows: [CountObservation.model_validate(r) for r in rows], {"total": int}
    )
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert [o.reward_components for o in batch.observations] == [{}, {"a": 1.0}]
    merged = ResultTable.concat([ResultTable([2], {"total": [3]}), table], [0, 1, 2])
    assert merged.sparse and merged.row(2) == {"total": 3}

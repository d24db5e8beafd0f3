"""Batched throughput on one server: EnvPool in three ways, openenv-core, and a soak.

Every session count in each repeat, and per session count the same server serves, in
turns:

* **typed**: ``EnvPool.step()`` and the typed observations read (``batch.observations``),
  as a trainer that wants pydantic models does (and as openenv-core's client always does);
* **numpy**: ``EnvPool.step()`` and the arrays read (``batch.obs``, ``batch.rewards``,
  ``batch.dones``): what a vectorised trainer reads; no model is built;
* **pipelined**: ``send``/``recv`` with the sessions in two halves, one half stepping on
  the server while the client handles the other (numpy reads);
* openenv-core: one async client per session, all stepping concurrently.

The soak steps the largest pool for a while and reports both processes' RSS at its start
and end (memory must stay flat: no batch keeps the previous one's objects alive).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import numpy as np

from benchmarks import servers
from benchmarks.envs import MESSAGE
from benchmarks.measure import Log, Settings, close_all, openenv_clients
from corral.client import EnvPool
from corral.envs.echo import EchoAction, EchoEnv

MODES = ("typed", "numpy", "pipelined")


def _pool(url: str, n: int) -> EnvPool[Any, Any, Any]:
    return EnvPool(n, url, env=EchoEnv, progress=False, health_interval=None, gc_control=True)


async def pool_rate(url: str, n: int, seconds: float, mode: str) -> float:
    """Env-steps/s of an EnvPool of ``n`` sessions stepping for ``seconds`` in ``mode``."""
    async with _pool(url, n) as pool:
        await pool.reset()
        actions = [EchoAction(message=MESSAGE)] * n
        for _ in range(3):
            await pool.step(actions)
        if mode == "pipelined" and n >= 2:
            return await _pipelined(pool, actions, seconds)
        steps = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            batch = await pool.step(actions)
            if mode == "typed":
                steps += len(batch.observations)
            else:
                batch.obs, batch.rewards  # noqa: B018 - what a vectorised trainer reads
                steps += len(batch.dones)
        return steps / (time.perf_counter() - start)


async def _pipelined(pool: EnvPool[Any, Any, Any], actions: list[Any], seconds: float) -> float:
    halves = np.array_split(np.arange(pool.n), 2)
    size = len(halves[0])
    for ids in halves:
        await pool.send(actions[: len(ids)], session_ids=ids)
    steps = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        batch = await pool.recv(min_results=size, max_results=size)
        await pool.send(actions[: len(batch)], session_ids=batch.ids)
        batch.obs, batch.rewards  # noqa: B018 - the trainer's half, while the other steps
        steps += len(batch.dones)
    elapsed = time.perf_counter() - start
    await pool.recv()
    return steps / elapsed


async def openenv_rate(url: str, n: int, seconds: float) -> float:
    """Env-steps/s of ``n`` openenv-core clients stepping concurrently for ``seconds``."""
    from benchmarks.envs import openenv_models

    action = openenv_models()["EchoAction"](message=MESSAGE)
    clients = await openenv_clients(url, n)
    try:
        for client in clients:
            await client.step(action)
        counts = [0] * n
        start = time.perf_counter()
        deadline = start + seconds

        async def drive(k: int) -> None:
            client = clients[k]
            while time.perf_counter() < deadline:
                await client.step(action)
                counts[k] += 1

        await asyncio.gather(*(drive(k) for k in range(n)))
        return sum(counts) / (time.perf_counter() - start)
    finally:
        await close_all(clients)


async def soak(url: str, server: servers.Served, n: int, seconds: float) -> dict[str, Any]:
    """RSS of the client and the server over ``seconds`` of stepping ``n`` sessions."""
    async with _pool(url, n) as pool:
        await pool.reset()
        actions = [EchoAction(message=MESSAGE)] * n
        for _ in range(20):
            (await pool.step(actions)).obs  # noqa: B018 - warm up: the first batches' objects
        client0, server0 = servers.rss_kb_self(), server.rss_kb()
        rounds = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            batch = await pool.step(actions)
            batch.obs  # noqa: B018
            rounds += 1
        return {
            "sessions": n,
            "rounds": rounds,
            "seconds": time.perf_counter() - start,
            "client_kb": (client0, servers.rss_kb_self()),
            "server_kb": (server0, server.rss_kb()),
        }


async def batched(s: Settings, log: Log) -> dict[str, Any]:
    """Aggregate env-steps/s with many sessions on one server, and the soak."""
    log("2. batched throughput")
    largest = max(s.batched_sessions)
    started: list[servers.Served] = []
    rows = []
    try:
        launches = [servers.corral_echo("--max-sessions", str(largest * 2))]
        if s.openenv:
            launches.append(servers.openenv_echo(max_sessions=largest + 64))
        results = await asyncio.gather(*launches, return_exceptions=True)
        started.extend(r for r in results if isinstance(r, servers.Served))
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            raise failure
        corral = results[0]
        assert isinstance(corral, servers.Served)
        oe = results[1] if len(results) > 1 else None
        rates: dict[int, dict[str, list[float]]] = {
            n: {mode: [] for mode in (*MODES, "openenv")} for n in s.batched_sessions
        }
        # Every size in each repeat, so that a slow minute of the shared host weighs on
        # all sizes alike: the flatness target compares two of them.
        for repeat in range(s.repeats):
            for n, by_mode in rates.items():
                for mode in MODES:
                    by_mode[mode].append(await pool_rate(corral.url, n, s.batched_seconds, mode))
                if isinstance(oe, servers.Served):
                    by_mode["openenv"].append(await openenv_rate(oe.url, n, s.batched_seconds))
                shown = ", ".join(f"{m} {v[-1]:,.0f}/s" for m, v in by_mode.items() if v)
                log(f"  {n} sessions: repeat {repeat + 1}/{s.repeats}: {shown}")
        for n, by_mode in rates.items():
            row: dict[str, Any] = {"sessions": n}
            for mode, values in by_mode.items():
                row[mode] = statistics.median(values) if values else None
            rows.append(row)
        soaked = await soak(corral.url, corral, largest, s.soak_seconds)
        log(
            f"  soak: {soaked['rounds']} rounds of {largest}: client RSS "
            f"{soaked['client_kb'][0]:,} → {soaked['client_kb'][1]:,} KB, server "
            f"{soaked['server_kb'][0]:,} → {soaked['server_kb'][1]:,} KB"
        )
        return {"rows": rows, "soak": soaked}
    finally:
        await asyncio.gather(*(server.stop() for server in started))

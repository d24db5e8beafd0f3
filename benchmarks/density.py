"""Section 9: density — 100,000 open echo sessions on one server process.

One ``corral serve corral.envs.echo:EchoEnv`` process; one ``EnvPool`` opens N sessions
over connections of 1,000 (``pool.start()``: the time to open), resets them all (one
batch per connection), and then, with every session open:

* the server's resident memory per session (growth from idle, after the reset: what a
  session costs once it has an episode and a remembered reply);
* one more session stepping in lockstep (its own client and connection): p50 / p99;
* one ``EnvPool.step`` of every session (the batched round's time).

Section 3 compares corral with openenv-core at 10,000 sessions; this section asks what
one process holds. docs/performance.md says where each byte of a session goes.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks import servers
from benchmarks.capacity import tree_cpu_seconds
from benchmarks.tables import Report, fmt

Log = Callable[[str], None]
PER_CONNECTION = 1000


async def density(s: Any, log: Log) -> dict[str, Any]:
    """Section 9's figures (``s``: :class:`benchmarks.measure.Settings`)."""
    from benchmarks.envs import MESSAGE
    from benchmarks.measure import _latencies, corral_driver
    from corral.client import EnvPool
    from corral.envs.echo import EchoAction, EchoEnv

    log("9. density")
    n = s.density_sessions
    server = await servers.holding_server("corral.envs.echo:EchoEnv", n)
    try:
        await asyncio.sleep(0.5)
        idle = server.rss_kb()
        cpu0 = tree_cpu_seconds(server.pid)
        pool = EnvPool(
            n,
            server.url,
            env=EchoEnv,
            sessions_per_connection=PER_CONNECTION,
            progress=False,
            health_interval=None,
            timeout=600,
        )
        t0 = time.perf_counter()
        await pool.start()
        opened = time.perf_counter() - t0
        open_cpu = tree_cpu_seconds(server.pid) - cpu0
        after_open = server.rss_kb()
        t1 = time.perf_counter()
        await pool.reset()
        reset_s = time.perf_counter() - t1
        after_reset = server.rss_kb()
        log(f"  {n:,} sessions open in {opened:.1f} s, reset in {reset_s:.1f} s")
        try:
            step, close = await corral_driver(
                server.url, EchoEnv, "msgpack", EchoAction(message=MESSAGE)
            )
            try:
                single = await _latencies(step, s.density_steps)
            finally:
                await close()
            actions = [EchoAction(message=MESSAGE)] * n
            rounds = []
            for _ in range(3):
                r0 = time.perf_counter()
                await pool.step(actions)
                rounds.append(time.perf_counter() - r0)
        finally:
            await pool.close()
        return {
            "sessions": n,
            "open_s": opened,
            "reset_s": reset_s,
            "open_cpu_us": open_cpu / n * 1e6,
            "idle_mb": idle / 1024,
            "kb_open": (after_open - idle) / n,
            "kb_reset": (after_reset - idle) / n,
            **single,
            "round_ms": statistics.median(rounds) * 1e3,
        }
    finally:
        await server.stop()


def section(report: Report, r: dict[str, Any]) -> dict[str, Any]:
    """Section 9's table; returns what its targets are checked against."""
    report.add(
        f"9. Density: {r['sessions']:,} open echo sessions on one server process",
        ["measure", "value"],
        [
            ["sessions opened (`EnvPool.start()`), s", fmt(r["open_s"], 1)],
            ["server CPU per open, µs", fmt(r["open_cpu_us"])],
            ["all reset (one batch per connection), s", fmt(r["reset_s"], 1)],
            ["server RSS per session after opening, KB", fmt(r["kb_open"], 2)],
            ["server RSS per session after the reset, KB", fmt(r["kb_reset"], 2)],
            ["idle server RSS, MB", fmt(r["idle_mb"])],
            ["one more session in lockstep, step p50 µs", fmt(r["p50_us"])],
            ["one more session in lockstep, step p99 µs", fmt(r["p99_us"])],
            ["`EnvPool.step` of every session, ms", fmt(r["round_ms"], 1)],
        ],
        [
            f"One `corral serve` process; one `EnvPool` of {r['sessions']:,} sessions over "
            f"connections of {PER_CONNECTION:,}. RSS per session: the server's resident "
            "memory growth from idle, / sessions (after the reset each session holds an "
            "episode and its remembered reply). The lockstep row: a client and connection "
            "of its own, stepping while every session is open. docs/performance.md says "
            "where each byte goes.",
        ],
    )
    return r


def targets(r: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issue 34's targets for section 9."""
    n = r["sessions"]
    return [
        (
            f"{n:,} open echo sessions at ≤ 4 KB each",
            f"{fmt(r['kb_reset'], 2)} KB",
            r["kb_reset"] <= 4,
        ),
        (f"{n:,} sessions opened in ≤ 10 s", f"{fmt(r['open_s'], 1)} s", r["open_s"] <= 10),
        (
            f"lockstep step p99 ≤ 1 ms with {n:,} open",
            f"{fmt(r['p99_us'])} µs",
            r["p99_us"] <= 1000,
        ),
    ]

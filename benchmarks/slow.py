"""Section 8: many slow sessions — OpenEnv's scaling experiment, side by side.

OpenEnv's scaling guide serves an environment whose step only sleeps (10 s) and steps
many sessions at once, each client in its own loop, reporting step latency. Here the
step awaits a fixed delay ``D`` (:class:`benchmarks.envs.SleepEnv`, ``asyncio.sleep``),
so everything above ``D`` is the framework's: its queueing, its CPU, its timers.

* **corral, own loops**: N sessions multiplexed over connections of 1,000 sessions
  (corral's client ``Connection``, the one under ``AsyncEnvClient``), each session
  stepping in its own loop (send a ``step``, await its reply, send the next), their
  starts spread over the first ``D``. Latency of each step that started in the timed
  window; the server's CPU per step (its process, from ``/proc``).
* **corral, lockstep rounds**: the same N through one ``EnvPool``: ``pool.step`` of every
  session, round after round; a round's time is the latency of its slowest step.
* **openenv-core, own loops**: one openenv-core client (and WebSocket) per session, as
  its scaling experiment does, N doubling until the step p99 passes ``1.2 D`` (or a
  session fails, or the ladder's budget runs out): the largest N that met the bound.
"""

from __future__ import annotations

import asyncio
import math
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks import servers
from benchmarks.capacity import tree_cpu_seconds
from benchmarks.envs import DELAY_VARIABLE
from benchmarks.tables import Report, fmt

Log = Callable[[str], None]
BOUND = 1.2
"""The target: step p99 within this many times the delay."""
PER_CONNECTION = 1000
"""Sessions per corral connection (the server's default limit is 1,024)."""
MESSAGE = "x" * 16


def raise_file_limit() -> int:
    """Raise this process's descriptor limit to its hard limit (root: as far as needed);
    return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for wanted in (1_048_576, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, max(wanted, hard)))
            return wanted
        except (ValueError, OSError):
            continue
    return soft


def _percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    if not ordered:
        return {"p50_s": math.nan, "p99_s": math.nan, "max_s": math.nan, "steps": 0}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"p50_s": at(0.5), "p99_s": at(0.99), "max_s": ordered[-1], "steps": len(ordered)}


async def _own_loops(
    step: Callable[[int], Any], n: int, delay: float, warmup: float, window: float
) -> dict[str, Any]:
    """Run ``step(k)`` for sessions ``k < n``, each in its own loop, starts spread over
    ``delay``; time the steps that start within ``window`` after ``warmup``."""
    loop = asyncio.get_running_loop()
    begin = loop.time()
    opens, closes = begin + warmup, begin + warmup + window
    latencies: list[float] = []
    errors: list[str] = []

    async def one(k: int) -> None:
        await asyncio.sleep(delay * k / n)
        while True:
            t0 = loop.time()
            if t0 >= closes:
                return
            try:
                await step(k)
            except Exception as exc:  # counted: a failed step fails the bound
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                return
            if t0 >= opens:
                latencies.append(loop.time() - t0)

    await asyncio.gather(*(one(k) for k in range(n)))
    return {**_percentiles(latencies), "errors": len(errors), "first_error": errors[:1]}


# -- corral ------------------------------------------------------------------------------


async def _corral_sessions(url: str, n: int) -> list[tuple[Any, str]]:
    """``n`` sessions, opened and reset, over connections of :data:`PER_CONNECTION`."""
    from corral.client.connection import Connection
    from corral.protocol.messages import Open, Opened, Reset

    connections = [
        Connection(url, ping_interval=None) for _ in range(math.ceil(n / PER_CONNECTION))
    ]
    await asyncio.gather(*(c.connect() for c in connections))

    async def open_on(connection: Connection, count: int) -> list[tuple[Any, str]]:
        found = []
        for _ in range(count):  # one at a time per connection, the connections at once
            opened = await connection.request(Open(connection.next_id()), timeout=600)
            assert isinstance(opened, Opened)
            await connection.request(Reset(connection.next_id(), opened.session), timeout=600)
            found.append((connection, opened.session))
        return found

    counts = [min(PER_CONNECTION, n - k * PER_CONNECTION) for k in range(len(connections))]
    groups = await asyncio.gather(
        *(open_on(c, k) for c, k in zip(connections, counts, strict=True))
    )
    return [pair for group in groups for pair in group]


async def corral_case(n: int, delay: float, s: Any, log: Log) -> dict[str, Any]:
    """corral at ``n`` sessions and delay ``delay``: own loops, then lockstep rounds."""
    from benchmarks.envs import SleepEnv
    from corral import runtime
    from corral.client import EnvPool
    from corral.envs.echo import EchoAction
    from corral.protocol.messages import Step

    server = await servers.holding_server(
        "benchmarks.envs:SleepEnv",
        2 * n,  # the own loops' sessions may still be closing when the pool opens
        env={DELAY_VARIABLE: str(delay)},
    )
    try:
        t0 = time.perf_counter()
        sessions = await _corral_sessions(server.url, n)
        log(
            f"  corral N={n:,} D={delay:g}: {n:,} sessions open in {time.perf_counter() - t0:.1f} s"
        )
        # What a trainer opts into with EnvPool(gc_control=True), done by hand for the
        # bare connections: the sessions' state is long-lived, keep it out of the scans.
        runtime.freeze_survivors()
        action = EchoAction(message=MESSAGE).model_dump()

        def step(k: int) -> Any:
            connection, session = sessions[k]
            return connection.request(
                Step(connection.next_id(), session, action, acked=True), timeout=None
            )

        warmup, window = s.slow_warmup * delay, max(s.slow_window * delay, s.slow_min_window)
        cpu0 = tree_cpu_seconds(server.pid)
        own = await _own_loops(step, n, delay, warmup, window)
        spent = tree_cpu_seconds(server.pid) - cpu0
        # Steps over the whole run (warm-up included), for the CPU per step.
        steps_run = own["steps"] * (warmup + window) / window
        own["server_cpu_us"] = spent / max(1.0, steps_run) * 1e6
        log(
            f"  corral own loops: p50 {own['p50_s']:.3f} s, p99 {own['p99_s']:.3f} s, "
            f"{own['steps']:,} steps, {own['errors']} errors"
        )
        for connection in {c for c, _ in sessions}:
            await connection.close()
        rounds: list[float] = []
        pool = EnvPool(
            n,
            server.url,
            env=SleepEnv,
            sessions_per_connection=PER_CONNECTION,
            progress=False,
            health_interval=None,
            timeout=max(600.0, 10 * delay),
            gc_control=True,  # as a trainer driving 100,000 sessions would (see EnvPool)
        )
        async with pool:
            await pool.reset()
            actions = [EchoAction(message=MESSAGE)] * n
            cpu0 = tree_cpu_seconds(server.pid)
            for _ in range(s.slow_rounds + 1):
                r0 = time.perf_counter()
                await pool.step(actions)
                rounds.append(time.perf_counter() - r0)
            spent = tree_cpu_seconds(server.pid) - cpu0
        rounds = rounds[1:]  # the first round warms up
        log(f"  corral lockstep rounds: {', '.join(f'{r:.3f}' for r in rounds)} s")
        return {
            "sessions": n,
            "delay": delay,
            "own": own,
            "rounds": {
                "p50_s": statistics.median(rounds),
                "p99_s": max(rounds),
                "server_cpu_us": spent / ((s.slow_rounds + 1) * n) * 1e6,
                "count": len(rounds),
            },
        }
    finally:
        await server.stop()


# -- openenv-core --------------------------------------------------------------------------


async def openenv_case(n: int, delay: float, s: Any) -> dict[str, Any]:
    """openenv-core at ``n`` sessions (a client and WebSocket each), own loops."""
    from benchmarks.envs import openenv_models
    from benchmarks.measure import close_all, openenv_clients

    server = await servers.openenv_server(
        "sleep", max_sessions=n + 16, env={DELAY_VARIABLE: str(delay)}
    )
    clients: list[Any] = []
    try:
        clients = await openenv_clients(server.url, n)
        action = openenv_models()["EchoAction"](message=MESSAGE)
        warmup, window = s.slow_warmup * delay, max(s.slow_window * delay, s.slow_min_window)
        cpu0 = tree_cpu_seconds(server.pid)
        own = await _own_loops(lambda k: clients[k].step(action), n, delay, warmup, window)
        spent = tree_cpu_seconds(server.pid) - cpu0
        steps_run = own["steps"] * (warmup + window) / window
        own["server_cpu_us"] = spent / max(1.0, steps_run) * 1e6
        return own
    finally:
        await close_all(clients)
        await server.stop()


async def openenv_ladder(delay: float, s: Any, log: Log) -> dict[str, Any]:
    """N doubling from the ladder's start while openenv-core meets the bound."""
    passed: dict[str, Any] | None = None
    failed: dict[str, Any] | None = None
    started = time.monotonic()
    for n in s.slow_openenv_ladder:
        if time.monotonic() - started > s.slow_openenv_budget_s:
            failed = {"sessions": n, "reason": "the ladder's time budget ran out first"}
            break
        try:
            own = await asyncio.wait_for(openenv_case(n, delay, s), s.slow_openenv_budget_s)
        except Exception as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}"
            failed = {"sessions": n, "reason": f"{reason}: {exc}"[:200]}
            log(f"  openenv-core N={n:,} D={delay:g}: failed ({failed['reason']})")
            break
        log(
            f"  openenv-core N={n:,} D={delay:g}: p50 {own['p50_s']:.3f} s, "
            f"p99 {own['p99_s']:.3f} s, {own['errors']} errors"
        )
        row = {"sessions": n, **own}
        if own["errors"] or not own["p99_s"] <= BOUND * delay:
            failed = {**row, "reason": f"p99 {own['p99_s']:.3f} s > {BOUND} D"}
            if own["errors"]:
                failed["reason"] = f"{own['errors']} steps failed: {own['first_error']}"
            break
        passed = row
    return {"delay": delay, "passed": passed, "failed": failed}


async def slow(s: Any, log: Log) -> dict[str, Any]:
    """Section 8's figures (``s``: :class:`benchmarks.measure.Settings`)."""
    log("8. many slow sessions")
    limit = raise_file_limit()
    result: dict[str, Any] = {"corral": [], "openenv": [], "files": limit}
    for n, delay in s.slow_cases:
        result["corral"].append(await corral_case(n, delay, s, log))
    if s.openenv:
        for delay in sorted({d for _, d in s.slow_cases}):
            result["openenv"].append(await openenv_ladder(delay, s, log))
    return result


# -- the table ---------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return fmt(seconds * 1e3)


def section(report: Report, result: dict[str, Any]) -> dict[str, Any]:
    """Section 8's table; returns what its targets are checked against."""
    rows = []
    for case in result["corral"]:
        n, delay = case["sessions"], case["delay"]
        for mode, label in (("own", "own loops"), ("rounds", "lockstep rounds")):
            r = case[mode]
            rows.append(
                [
                    f"corral, {label}",
                    fmt(n),
                    f"{delay:g}",
                    _ms(r["p50_s"]),
                    _ms(r["p99_s"]),
                    f"{r['p99_s'] / delay:.2f}x",
                    fmt(r["server_cpu_us"]),
                ]
            )
    for ladder in result["openenv"]:
        for key, label in (("passed", "largest N within the bound"), ("failed", "next N")):
            r = ladder[key]
            if r is None or "p99_s" not in r:
                continue
            rows.append(
                [
                    f"openenv-core, own loops ({label})",
                    fmt(r["sessions"]),
                    f"{ladder['delay']:g}",
                    _ms(r["p50_s"]),
                    _ms(r["p99_s"]),
                    f"{r['p99_s'] / ladder['delay']:.2f}x",
                    fmt(r["server_cpu_us"]),
                ]
            )
    notes = [
        "Each step awaits D seconds on the server (`asyncio.sleep`); latency is the client's, "
        "send to reply. Own loops: every session steps as soon as its reply arrives, starts "
        "spread over the first D; steps that started in the timed window count. corral "
        f"multiplexes {PER_CONNECTION:,} sessions per connection (its client `Connection`, "
        "one `step` message per step); openenv-core opens one WebSocket per session, as its "
        "own scaling experiment does. Lockstep rounds: `EnvPool.step` of all N (batch "
        "messages); each round's time is the latency of its slowest step (p99 column: the "
        "slowest round). Server CPU: the server process's, per step, from `/proc`.",
        f"Descriptors: {result['files']:,} per process here (the hard limit; raising it "
        "needs CAP_SYS_RESOURCE, which this machine's root lacks). Every openenv-core "
        "session holds a socket in the client process and one in the server's, and a local "
        "port (32768 to 60999: about 28,000 connections to one server address), which "
        "bounds its ladder; corral's N sessions use N / 1,000 connections.",
    ]
    for ladder in result["openenv"]:
        failed, passed = ladder["failed"], ladder["passed"]
        best = "none of the ladder" if passed is None else f"{passed['sessions']:,}"
        why = "" if failed is None else f"; at {failed['sessions']:,}: {failed['reason']}"
        notes.append(
            f"openenv-core at D = {ladder['delay']:g} s: the largest N within p99 ≤ {BOUND} D "
            f"was {best}{why}."
        )
    report.add(
        "8. Many slow sessions: a step that awaits D seconds (OpenEnv's scaling experiment)",
        ["contender", "sessions", "D s", "step p50 ms", "step p99 ms", "p99 / D", "server CPU µs"],
        rows,
        notes,
    )
    return result


def targets(result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issue 34's targets for section 8."""
    found = []
    best = {ladder["delay"]: ladder["passed"] for ladder in result["openenv"]}
    for case in result["corral"]:
        n, delay = case["sessions"], case["delay"]
        worst = max(case["own"]["p99_s"], case["rounds"]["p99_s"])
        clean = case["own"]["errors"] == 0
        beside = best.get(delay)
        extra = "" if beside is None else f"; openenv-core's largest N: {beside['sessions']:,}"
        found.append(
            (
                f"N = {n:,} slow sessions at D = {delay:g} s: step p99 ≤ {BOUND} D "
                "(own loops and lockstep rounds)",
                f"{worst / delay:.2f}x{extra}",
                clean and worst <= BOUND * delay,
            )
        )
    return found

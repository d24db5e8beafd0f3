"""The server's transports side by side: lockstep latency, server CPU per step, layers, RSS.

    python -m benchmarks.transport                 # lockstep p50 + server CPU, both transports
    python -m benchmarks.transport --profile       # + the server's CPU by layer (cProfile)
    python -m benchmarks.transport --long-run 300  # + RSS over 300 s of steps and reset waves

Every contender is a separate ``corral serve`` process for the echo env; the client is
corral's own (msgpack), stepping one session in lockstep. The contenders take turns in
blocks of steps, so a busy machine weighs on all of them alike. Server CPU per step is
read from ``/proc/<pid>/stat`` (user + system time) over the measured steps.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks import servers
from benchmarks.envs import MESSAGE
from benchmarks.measure import corral_driver, floor_driver
from corral.client import AsyncEnvClient
from corral.envs.echo import EchoAction, EchoEnv

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def lockstep(steps: int, block: int) -> dict[str, dict[str, float]]:
    """p50/p99 per step and server CPU per step of each contender, in turns."""
    action = EchoAction(message=MESSAGE)
    native = await servers.corral_server("corral.envs.echo:EchoEnv", "--transport", "native")
    asgi = await servers.corral_server("corral.envs.echo:EchoEnv", "--transport", "asgi")
    floor = await servers.floor_server()
    started = [native, asgi, floor]
    contenders = {
        "corral native (picows)": (native, corral_driver(native.url, EchoEnv, "msgpack", action)),
        "corral asgi (uvicorn)": (asgi, corral_driver(asgi.url, EchoEnv, "msgpack", action)),
        "websockets floor": (floor, floor_driver(floor.url)),
    }
    latencies: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, float] = defaultdict(float)
    try:
        drivers = {name: (srv, await make) for name, (srv, make) in contenders.items()}
        for _, (_, (step, _)) in drivers.items():
            for _ in range(200):  # warm-up
                await step()
        done = 0
        while done < steps:
            for name, (srv, (step, _)) in drivers.items():
                before = cpu_s(srv.pid)
                for _ in range(block):
                    t0 = time.perf_counter_ns()
                    await step()
                    latencies[name].append((time.perf_counter_ns() - t0) / 1000)
                cpu[name] += cpu_s(srv.pid) - before
            done += block
        for _, (_, (_, close)) in drivers.items():
            await close()
    finally:
        await asyncio.gather(*(s.stop() for s in started))
    result = {}
    for name, values in latencies.items():
        values.sort()
        result[name] = {
            "p50_us": statistics.median(values),
            "p99_us": values[int(len(values) * 0.99)],
            "server_cpu_us": cpu[name] / len(values) * 1e6,
        }
    return result


# -- per-layer profile ---------------------------------------------------------------

LAYERS = [
    ("picows (framing)", ("picows",)),
    ("front door / native link", ("corral/server/native", "corral/server/front")),
    ("uvicorn + Starlette (ASGI)", ("uvicorn", "starlette", "fastapi")),
    ("websockets (framing)", ("websockets/",)),
    ("corral protocol", ("corral/protocol",)),
    ("corral service / sessions / runner", ("corral/server",)),
    ("corral contract", ("corral/contract",)),
    ("pydantic", ("pydantic",)),
    ("msgpack / orjson", ("msgpack", "orjson")),
    ("the env", ("corral/envs",)),
    (
        "thread-pool hop (sync env off the loop)",
        ("concurrent", "threading", "wrap_future", "run_in_executor", "call_soon_threadsafe"),
    ),
    ("asyncio tasks / event loop", ("asyncio", "uvloop")),
]


def layer_of(filename: str, name: str) -> str:
    key = f"{filename}:{name}"
    for layer, marks in LAYERS:
        if any(mark in key for mark in marks):
            return layer
    if filename == "~":  # a builtin: its name says where it belongs
        for layer, marks in LAYERS:
            if any(mark in name for mark in marks):
                return layer
        return "builtins (socket I/O, GC, ...)"
    return "other"


_PROFILED = """
import cProfile, signal, sys, time
from corral.cli.main import main

profiler = cProfile.Profile(time.thread_time)
out = sys.argv[1]
signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())


def dump(*_):
    profiler.disable()
    profiler.dump_stats(out)


signal.signal(signal.SIGUSR2, dump)
sys.argv = ["corral", "serve", "corral.envs.echo:EchoEnv", "--port", "0", *sys.argv[2:]]
main()
"""


async def profile(transport: str, steps: int) -> dict[str, float]:
    """µs of the server loop thread's CPU per step by layer (cProfile's own time on the
    thread's CPU clock, over the measured steps only; the profiler itself inflates it)."""
    out = Path(tempfile.mkdtemp()) / f"{transport}.prof"
    port_file = out.with_suffix(".port")
    args = ["--port-file", str(port_file), "--transport", transport]
    child = subprocess.Popen([sys.executable, "-c", _PROFILED, str(out), *args], cwd=servers.ROOT)
    try:
        while not port_file.exists():
            if child.poll() is not None:
                raise RuntimeError("profiled server did not start")
            await asyncio.sleep(0.05)
        client = AsyncEnvClient(port_file.read_text().strip(), env=EchoEnv)
        await client.reset()
        action = EchoAction(message=MESSAGE)
        for _ in range(200):
            await client.step(action)
        child.send_signal(signal.SIGUSR1)
        await asyncio.sleep(0.2)  # the handler runs at the server's next bytecode
        for _ in range(steps):
            await client.step(action)
        child.send_signal(signal.SIGUSR2)
        while not out.exists():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        await client.close()
    finally:
        child.send_signal(signal.SIGINT)
        child.wait(60)
    stats = pstats.Stats(str(out))
    by_layer: dict[str, float] = defaultdict(float)
    for (filename, _, name), row in stats.stats.items():  # type: ignore[attr-defined]
        by_layer[layer_of(filename, name)] += row[2]
    return {layer: seconds / steps * 1e6 for layer, seconds in by_layer.items()}


# -- long run --------------------------------------------------------------------------


async def long_run(seconds: float, sessions: int) -> dict[str, float]:
    """RSS of a native server over ``seconds`` of batched steps with a reset wave a second."""
    from corral.client import EnvPool

    server = await servers.corral_server("corral.envs.echo:EchoEnv", "--transport", "native")
    try:
        pool = EnvPool(sessions, [server.url], env=EchoEnv, autoreset_mode="disabled")
        await pool.start()
        start_rss = server.rss_kb()
        peak = start_rss
        steps = 0
        deadline = time.monotonic() + seconds
        action = EchoAction(message=MESSAGE)
        while time.monotonic() < deadline:
            await pool.reset()
            for _ in range(50):
                await pool.step([action] * sessions)
                steps += sessions
            peak = max(peak, server.rss_kb())
        end_rss = server.rss_kb()
        await pool.close()
    finally:
        await server.stop()
    return {
        "seconds": seconds,
        "env_steps": steps,
        "rss_start_mb": start_rss / 1024,
        "rss_peak_mb": peak / 1024,
        "rss_end_mb": end_rss / 1024,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--block", type=int, default=500)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--long-run", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--sessions", type=int, default=256)
    args = parser.parse_args(argv)
    console = Console()
    console.print(f"load average: {os.getloadavg()[0]:.2f}")
    result = asyncio.run(lockstep(args.steps, args.block))
    floor = result["websockets floor"]["p50_us"]
    table = Table(title=f"lockstep echo, {args.steps:,} steps each, in turns")
    for column in ("contender", "p50 µs", "p99 µs", "x floor", "server CPU µs/step"):
        table.add_column(column, justify="right")
    for name, row in result.items():
        table.add_row(
            name,
            f"{row['p50_us']:.0f}",
            f"{row['p99_us']:.0f}",
            f"{row['p50_us'] / floor:.2f}",
            f"{row['server_cpu_us']:.0f}",
        )
    console.print(table)
    if args.profile:
        layers = {t: asyncio.run(profile(t, args.steps)) for t in ("native", "asgi")}
        table = Table(title="server CPU by layer, µs/step (cProfile own time, profiled)")
        table.add_column("layer")
        table.add_column("native", justify="right")
        table.add_column("asgi", justify="right")
        names = sorted(
            set(layers["native"]) | set(layers["asgi"]), key=lambda n: -layers["asgi"].get(n, 0)
        )
        for name in names:
            table.add_row(
                name, f"{layers['native'].get(name, 0):.0f}", f"{layers['asgi'].get(name, 0):.0f}"
            )
        table.add_row(
            "total", f"{sum(layers['native'].values()):.0f}", f"{sum(layers['asgi'].values()):.0f}"
        )
        console.print(table)
    if args.long_run:
        figures: dict[str, Any] = asyncio.run(long_run(args.long_run, args.sessions))
        console.print(f"long run: {figures}")
    console.print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

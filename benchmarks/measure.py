"""The comparisons. Each returns plain rows; :mod:`benchmarks.suite` prints them.

Batched throughput lives in :mod:`benchmarks.batched`, the in-process ceiling in
:mod:`benchmarks.ceiling`.

Every contender runs against its own server process on 127.0.0.1, driven from this
process, on the same machine and event loop (uvloop when installed, for every
contender's client and server alike). Each figure is the median over ``repeats`` runs;
within a repeat the contenders take turns, so slow phases of a shared machine spread
over all of them instead of landing on one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks import servers
from benchmarks.envs import MESSAGE, AsyncEchoEnv, ImageEnv, TickAction
from corral.client import AsyncEnvClient, EnvPool
from corral.client.local_server import LocalServer
from corral.client.warm_start import WARM_START_ENV, warm_template
from corral.envs.echo import EchoAction, EchoEnv
from corral.protocol.codecs import MsgpackCodec

Log = Callable[[str], None]


@dataclass
class Settings:
    """Sizes of one run (``smoke`` shrinks everything to a few seconds)."""

    smoke: bool
    repeats: int = 5
    lockstep_steps: int = 5000
    warmup: int = 300
    batched_sessions: list[int] = field(default_factory=lambda: [1, 16, 256, 1024])
    batched_seconds: float = 3.0
    soak_seconds: float = 30.0
    ceiling_seconds: float = 2.0
    cliff_sessions: tuple[int, int] = (256, 1024)
    """The two session counts of the cache-cliff loop (the flatness target's)."""
    scale_sessions: int = 10_000
    openenv_ladder: list[int] = field(default_factory=lambda: [1000, 2500, 5000, 10_000])
    openenv_budget_s: float = 240.0
    payload_steps: int = 2000
    startup_repeats: int = 5
    ppo_steps: int = 8 * 256 * 8
    ppo_repeats: int = 3
    sandbox_episodes: int = 200
    """In-process coding episodes timed (warm; a quarter of them cold)."""
    sandbox_warmup: int = 10
    sandbox_sessions: int = 32
    sandbox_seconds: float = 20.0
    sandbox_runs: int = 30
    """Steps timed per bare-process contender (python -c, docker exec, OpenEnv)."""
    sandbox_docker_runs: int = 8
    """``docker run --rm`` steps timed (each starts a container)."""
    slow_cases: list[tuple[int, float]] = field(
        default_factory=lambda: [(10_000, 1.0), (100_000, 10.0)]
    )
    """(sessions, delay in s) of the slow-sessions section."""
    slow_warmup: float = 2.0
    """Delays before the slow section's timed window opens."""
    slow_window: float = 3.0
    """Delays the timed window lasts (at least ``slow_min_window`` seconds)."""
    slow_min_window: float = 10.0
    slow_rounds: int = 3
    slow_openenv_ladder: list[int] = field(
        default_factory=lambda: [100, 250, 500, 1000, 2000, 4000, 8000, 16_000]
    )
    slow_openenv_budget_s: float = 300.0
    density_sessions: int = 100_000
    density_steps: int = 2000
    openenv: bool = True

    @classmethod
    def for_run(cls, smoke: bool, openenv: bool) -> Settings:
        """Full sizes, or the smoke sizes."""
        if not smoke:
            return cls(smoke=False, openenv=openenv)
        return cls(
            smoke=True,
            repeats=1,
            lockstep_steps=100,
            warmup=20,
            batched_sessions=[1, 16],
            batched_seconds=0.3,
            soak_seconds=0.5,
            ceiling_seconds=0.2,
            cliff_sessions=(4, 16),
            scale_sessions=200,
            openenv_ladder=[20],
            openenv_budget_s=60.0,
            payload_steps=30,
            startup_repeats=1,
            ppo_steps=8 * 32 * 2,
            ppo_repeats=1,
            sandbox_episodes=6,
            sandbox_warmup=2,
            sandbox_sessions=4,
            sandbox_seconds=1.0,
            sandbox_runs=3,
            sandbox_docker_runs=1,
            slow_cases=[(20, 0.05)],
            slow_min_window=0.3,
            slow_rounds=1,
            slow_openenv_ladder=[10],
            slow_openenv_budget_s=60.0,
            density_sessions=300,
            density_steps=50,
            openenv=openenv,
        )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Run:
    """One timed run: per-step latencies (µs) and the wall time of the whole run."""

    latencies: list[float]
    seconds: float

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


class _Stopwatch:
    """Per-step latencies of a timed run that stops early after ``max_seconds``."""

    def __init__(self, max_seconds: float) -> None:
        self.latencies: list[float] = []
        self.start = time.perf_counter_ns()
        self.limit = self.start + int(max_seconds * 1e9)

    def lap(self, t0: int) -> bool:
        """Record the step started at ``t0``; True once the time is up."""
        t1 = time.perf_counter_ns()
        self.latencies.append((t1 - t0) / 1000)
        return t1 > self.limit

    def run(self) -> Run:
        return Run(self.latencies, (time.perf_counter_ns() - self.start) / 1e9)


async def _timed(
    step: Callable[[], Awaitable[Any]], steps: int, warmup: int, max_seconds: float = 10.0
) -> Run:
    """``steps`` timed steps after ``warmup`` ones, stopping early after ``max_seconds``."""
    for _ in range(warmup):
        await step()
    watch = _Stopwatch(max_seconds)
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        await step()
        if watch.lap(t0):
            break
    return watch.run()


def _timed_blocking(
    step: Callable[[], Any], steps: int, warmup: int, max_seconds: float = 10.0
) -> Run:
    """:func:`_timed` for a step that blocks (called from a thread without a loop)."""
    for _ in range(warmup):
        step()
    watch = _Stopwatch(max_seconds)
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        step()
        if watch.lap(t0):
            break
    return watch.run()


@dataclass
class Blocking:
    """A contender whose step blocks: timed in a thread of its own, as a script calls it."""

    step: Callable[[], Any]


def _summary(runs: list[Run]) -> dict[str, float]:
    return {
        "p50_us": statistics.median(_percentile(r.latencies, 0.50) for r in runs),
        "p99_us": statistics.median(_percentile(r.latencies, 0.99) for r in runs),
        "steps_s": statistics.median(r.rate for r in runs),
    }


async def _start(started: list[servers.Served], *launches: Awaitable[servers.Served]) -> list[Any]:
    """Start servers concurrently; every one that started is added to ``started``."""
    results = await asyncio.gather(*launches, return_exceptions=True)
    started.extend(r for r in results if isinstance(r, servers.Served))
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure
    return list(results)


# -- drivers: one connected client per contender, stepping one session --------------


Step = Callable[[], Awaitable[Any]] | Blocking


async def corral_driver(
    url: str, env: type[Any], codec: str, action: Any, transport: str = "auto"
) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[None]]]:
    """``(step, close)`` for a corral session (the default transport: what users get)."""
    client = AsyncEnvClient(url, env=env, codec=codec, transport=transport)
    await client.reset()
    return (lambda: client.step(action)), client.close


async def corral_sync_driver(
    url: str, env: type[Any], codec: str, action: Any
) -> tuple[Step, Callable[[], Awaitable[None]]]:
    """``(step, close)`` for a corral session through the blocking twin (``.sync()``)."""
    client = AsyncEnvClient(url, env=env, codec=codec).sync()
    await asyncio.to_thread(client.reset)
    return Blocking(lambda: client.step(action)), (lambda: asyncio.to_thread(client.close))


async def floor_driver(
    url: str,
) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[None]]]:
    """``(step, close)`` for the raw websockets round trip with corral's step frame."""
    from websockets.asyncio.client import connect

    payload = MsgpackCodec().encode(
        {
            "type": "step",
            "id": 1234,
            "session": "0" * 32,
            "action": EchoAction(message=MESSAGE).model_dump(),
        }
    )
    ws = await connect(url, compression=None, max_size=None)

    async def step() -> Any:
        await ws.send(payload)
        return await ws.recv()

    return step, ws.close


async def picows_floor_driver(
    url: str,
) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[None]]]:
    """``(step, close)`` for the raw picows round trip (picows client and server), with
    corral's step frame: the reply is taken in the frame callback, as corral's does."""
    from picows import WSFrame, WSListener, WSMsgType, WSTransport, ws_connect

    payload = MsgpackCodec().encode(
        {
            "type": "step",
            "id": 1234,
            "session": "0" * 32,
            "action": EchoAction(message=MESSAGE).model_dump(),
        }
    )
    loop = asyncio.get_running_loop()

    class Listener(WSListener):  # type: ignore[misc]
        waiter: asyncio.Future[bytes] | None = None

        def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
            waiter = self.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(frame.get_payload_as_bytes())

    transport, listener = await ws_connect(Listener, url)

    async def step() -> Any:
        listener.waiter = loop.create_future()
        transport.send(WSMsgType.BINARY, payload)
        return await listener.waiter

    async def close() -> None:
        transport.send_close()
        transport.disconnect()
        await transport.wait_disconnected()

    return step, close


async def openenv_driver(
    url: str, kind: str
) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[None]]]:
    """``(step, close)`` for an openenv-core session with its own async client."""
    from benchmarks.envs import openenv_models

    models = openenv_models()
    if kind == "image":
        client = models["ImageClient"](base_url=url)
        action = models["TickAction"](tick=1)
    else:
        client = models["EchoClient"](base_url=url)
        action = models["EchoAction"](message=MESSAGE)
    await client.connect()
    await client.reset()
    return (lambda: client.step(action)), client.close


Driver = Callable[[], Awaitable[tuple[Step, Callable[[], Awaitable[None]]]]]


async def _compare(
    contenders: list[tuple[str, Driver]], steps: int, warmup: int, repeats: int, log: Log
) -> dict[str, dict[str, float]]:
    runs: dict[str, list[Run]] = {name: [] for name, _ in contenders}
    for repeat in range(repeats):
        for name, make in contenders:
            step, close = await make()
            try:
                if isinstance(step, Blocking):
                    run = await asyncio.to_thread(_timed_blocking, step.step, steps, warmup)
                else:
                    run = await _timed(step, steps, warmup)
                runs[name].append(run)
            finally:
                await close()
            log(f"  {name}: repeat {repeat + 1}/{repeats}: {runs[name][-1].rate:,.0f} steps/s")
    return {name: _summary(r) for name, r in runs.items()}


# -- 1. lockstep ----------------------------------------------------------------------


async def lockstep(s: Settings, log: Log) -> dict[str, dict[str, float]]:
    """Latency and throughput of one session stepping in lockstep."""
    log("1. lockstep")
    started: list[servers.Served] = []
    try:
        launches = [
            servers.corral_echo(),
            servers.corral_server("benchmarks.envs:AsyncEchoEnv"),
            servers.floor_server(),
            servers.floor_server("picows"),
        ]
        if s.openenv:
            launches += [servers.openenv_echo(), servers.openenv_server("async-echo")]
        echo, aecho, floor, pfloor, *openenv = await _start(started, *launches)
        action = EchoAction(message=MESSAGE)
        contenders: list[tuple[str, Driver]] = [
            ("corral msgpack", lambda: corral_driver(echo.url, EchoEnv, "msgpack", action)),
            (
                "corral msgpack, sync twin",
                lambda: corral_sync_driver(echo.url, EchoEnv, "msgpack", action),
            ),
            ("corral JSON", lambda: corral_driver(echo.url, EchoEnv, "json", action)),
            (
                "corral msgpack, async env",
                lambda: corral_driver(aecho.url, AsyncEchoEnv, "msgpack", action),
            ),
            (
                "corral msgpack, websockets client",
                lambda: corral_driver(echo.url, EchoEnv, "msgpack", action, "websockets"),
            ),
            (
                "corral msgpack, asyncio client",
                lambda: corral_driver(echo.url, EchoEnv, "msgpack", action, "asyncio"),
            ),
            ("websockets floor", lambda: floor_driver(floor.url)),
            ("picows floor", lambda: picows_floor_driver(pfloor.url)),
        ]
        if openenv:
            oe, oe_async = openenv
            contenders += [
                ("openenv-core", lambda: openenv_driver(oe.url, "echo")),
                ("openenv-core, async env", lambda: openenv_driver(oe_async.url, "echo")),
            ]
        result = await _compare(contenders, s.lockstep_steps, s.warmup, s.repeats, log)
        ratio = await sync_over_async(echo.url, action, s.lockstep_steps, s.warmup)
        result["corral msgpack, sync twin"]["vs_async_interleaved"] = ratio
        log(f"  sync twin / async client, step by step: {ratio:.2f}x")
        return result
    finally:
        await asyncio.gather(*(server.stop() for server in started))


async def sync_over_async(url: str, action: Any, steps: int, warmup: int) -> float:
    """p50 of the sync twin's steps over the async client's, the two taking turns step by
    step (so both see the same moments of a shared machine)."""
    client = AsyncEnvClient(url, env=EchoEnv)
    twin = AsyncEnvClient(url, env=EchoEnv).sync()
    await client.reset()
    await asyncio.to_thread(twin.reset)

    def timed_twin_step() -> float:
        t0 = time.perf_counter_ns()
        twin.step(action)
        return (time.perf_counter_ns() - t0) / 1000

    try:
        async_us: list[float] = []
        sync_us: list[float] = []
        for k in range(warmup + steps):
            t0 = time.perf_counter_ns()
            await client.step(action)
            t1 = time.perf_counter_ns()
            twin_us = await asyncio.to_thread(timed_twin_step)
            if k >= warmup:
                async_us.append((t1 - t0) / 1000)
                sync_us.append(twin_us)
        return _percentile(sync_us, 0.5) / _percentile(async_us, 0.5)
    finally:
        await client.close()
        await asyncio.to_thread(twin.close)


async def openenv_clients(url: str, n: int, kind: str = "echo") -> list[Any]:
    """``n`` connected and reset openenv-core clients (at most 128 connecting at once)."""
    from benchmarks.envs import openenv_models

    models = openenv_models()
    factory = models["ImageClient"] if kind == "image" else models["EchoClient"]
    gate = asyncio.Semaphore(128)

    async def one() -> Any:
        async with gate:
            client = factory(base_url=url, connect_timeout_s=60.0, message_timeout_s=600.0)
            await client.connect()
            await client.reset()
            return client

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def close_all(clients: list[Any]) -> None:
    """Close openenv-core clients, ignoring failures."""
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


# -- 3. scale ---------------------------------------------------------------------------


async def _latencies(step: Callable[[], Awaitable[Any]], steps: int) -> dict[str, float]:
    run = await _timed(step, steps, warmup=min(50, steps))
    return {"p50_us": _percentile(run.latencies, 0.5), "p99_us": _percentile(run.latencies, 0.99)}


async def _corral_scale(s: Settings, log: Log) -> dict[str, Any]:
    n = s.scale_sessions
    server = await servers.corral_echo(*servers.holding_args(n))
    try:
        await asyncio.sleep(0.5)
        before = server.rss_kb()
        start = time.perf_counter()
        pool = EnvPool(
            n,
            server.url,
            env=EchoEnv,
            sessions_per_connection=1000,
            progress=False,
            health_interval=None,
            timeout=600,
            gc_control=True,
        )
        await pool.start()
        await pool.reset()
        opened = time.perf_counter() - start
        after = server.rss_kb()
        log(f"  corral: {n} sessions open and reset in {opened:.1f} s")
        try:
            step, close = await corral_driver(
                server.url, EchoEnv, "msgpack", EchoAction(message=MESSAGE)
            )
            try:
                single = await _latencies(step, 300 if not s.smoke else 50)
            finally:
                await close()
            actions = [EchoAction(message=MESSAGE)] * n
            rounds = []
            for _ in range(3):
                t0 = time.perf_counter()
                batch = await pool.step(actions)
                assert len(batch.observations) == n
                rounds.append(time.perf_counter() - t0)
        finally:
            await pool.close()
        return {
            "sessions": n,
            "open_s": opened,
            "kb_per_session": (after - before) / n,
            **single,
            "all_step_ms": statistics.median(rounds) * 1000,
        }
    finally:
        await server.stop()


async def _openenv_scale_one(n: int, s: Settings) -> dict[str, Any]:
    from benchmarks.envs import openenv_models

    action = openenv_models()["EchoAction"](message=MESSAGE)
    server = await servers.openenv_echo(max_sessions=n + 16)
    clients: list[Any] = []
    try:
        await asyncio.sleep(0.5)
        before = server.rss_kb()
        start = time.perf_counter()
        clients = await openenv_clients(server.url, n)
        opened = time.perf_counter() - start
        after = server.rss_kb()
        single = await _latencies(lambda: clients[0].step(action), 300 if not s.smoke else 50)
        t0 = time.perf_counter()
        await asyncio.gather(*(c.step(action) for c in clients))
        all_step = time.perf_counter() - t0
        return {
            "sessions": n,
            "open_s": opened,
            "kb_per_session": (after - before) / n,
            **single,
            "all_step_ms": all_step * 1000,
        }
    finally:
        await close_all(clients)
        await server.stop()


async def scale(s: Settings, log: Log) -> dict[str, Any]:
    """Many open sessions on one server: memory, open time, step latency."""
    log("3. scale")
    result: dict[str, Any] = {
        "corral": await _corral_scale(s, log),
        "openenv": None,
        "openenv_failed": None,
    }
    if not s.openenv:
        return result
    for n in s.openenv_ladder:
        try:
            row = await asyncio.wait_for(_openenv_scale_one(n, s), s.openenv_budget_s)
        except Exception as exc:  # the largest count it sustains is the last that worked
            reason = (
                "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            )
            result["openenv_failed"] = {"sessions": n, "reason": reason[:200]}
            log(f"  openenv-core: {n} sessions failed: {reason[:200]}")
            break
        result["openenv"] = row
        log(f"  openenv-core: {n} sessions open in {row['open_s']:.1f} s")
    return result


# -- 4. observation payload -------------------------------------------------------------


async def payload(s: Settings, log: Log) -> dict[str, dict[str, float]]:
    """Lockstep steps/s with an 84x84x3 uint8 observation."""
    log("4. 84x84x3 observation")
    started: list[servers.Served] = []
    try:
        launches = [servers.corral_server("benchmarks.envs:ImageEnv")]
        if s.openenv:
            launches.append(servers.openenv_server("image"))
        image, *rest = await _start(started, *launches)
        tick = TickAction(tick=1)
        contenders: list[tuple[str, Driver]] = [
            ("corral msgpack", lambda: corral_driver(image.url, ImageEnv, "msgpack", tick)),
            ("corral JSON", lambda: corral_driver(image.url, ImageEnv, "json", tick)),
        ]
        if rest:
            oe = rest[0]
            contenders.append(("openenv-core", lambda: openenv_driver(oe.url, "image")))
        return await _compare(contenders, s.payload_steps, min(20, s.payload_steps), s.repeats, log)
    finally:
        await asyncio.gather(*(server.stop() for server in started))


# -- 5. start-up ------------------------------------------------------------------------


STARTUP_WARM = "corral, warm start"
"""The start-up row of a server forked from a template (``corral.client.warm_start``)."""


async def _corral_startup(*, warm: bool) -> float:
    """Cold: a fresh interpreter. Warm: a fork of this interpreter's template, which is
    started (untimed) first, as it is by the first server of a trainer's pool."""
    env = {} if warm else {WARM_START_ENV: "0"}
    if warm:
        await asyncio.to_thread(warm_template(sys.executable, {**os.environ, **env}).start)
    start = time.perf_counter()
    server = LocalServer("corral.envs.echo:EchoEnv", cwd=servers.ROOT, startup_timeout=120, env=env)
    try:
        url = await server.start()
        async with AsyncEnvClient(url, env=EchoEnv) as client:
            await client.reset()
        return time.perf_counter() - start
    finally:
        await server.stop()


# A user's first script: a fresh interpreter imports corral, starts a server with
# ``from_env`` and resets; timed from spawning the interpreter to the reset's answer.
_SCRIPT = """
import asyncio
import concurrent.futures
import multiprocessing
from corral.client import AsyncEnvClient
from corral.envs.echo import EchoEnv

async def main():
    env = await AsyncEnvClient.from_env("corral.envs.echo:EchoEnv", env=EchoEnv)
    try:
        await env.reset()
        print("first reset", flush=True)
    finally:
        await env.close()

asyncio.run(main())
"""


async def _script_startup() -> float:
    start = time.perf_counter()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _SCRIPT,
        cwd=servers.ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert child.stdout is not None
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        elapsed = time.perf_counter() - start
        rest = await asyncio.wait_for(child.stdout.read(), 60)
        if line.strip() != b"first reset" or await child.wait() != 0:
            raise RuntimeError(f"the start-up script failed: {(line + rest).decode()[-2000:]}")
        return elapsed
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def _openenv_startup() -> float:
    from benchmarks.envs import openenv_models

    client_class = openenv_models()["EchoClient"]
    start = time.perf_counter()
    child = servers.launch_openenv("echo")
    try:
        url = await child.wait(health=True)
        client = client_class(base_url=url)
        await client.connect()
        await client.reset()
        elapsed = time.perf_counter() - start
        await client.close()
        return elapsed
    finally:
        await child.stop()


async def startup(s: Settings, log: Log) -> dict[str, dict[str, float]]:
    """Seconds from launching a local server process to the first successful reset."""
    log("5. start-up")
    times: dict[str, list[float]] = {
        "corral": [],
        STARTUP_WARM: [],
        "corral, fresh script": [],
        "openenv-core": [],
    }
    for repeat in range(s.startup_repeats):
        times["corral"].append(await _corral_startup(warm=False))
        times[STARTUP_WARM].append(await _corral_startup(warm=True))
        times["corral, fresh script"].append(await _script_startup())
        if s.openenv:
            times["openenv-core"].append(await _openenv_startup())
        log(
            f"  repeat {repeat + 1}/{s.startup_repeats}: corral {times['corral'][-1]:.2f} s, "
            f"warm {times[STARTUP_WARM][-1]:.2f} s, "
            f"fresh script {times['corral, fresh script'][-1]:.2f} s"
        )
    return {
        name: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)}
        for name, v in times.items()
        if v
    }


# -- 6. PPO on 8 CartPole sessions ---------------------------------------------------------


def _ppo_fps(env: Any, steps: int) -> float:
    import torch
    from stable_baselines3 import PPO

    torch.set_num_threads(1)  # the same for both contenders, and fair to a shared machine
    n_steps = max(32, steps // (env.num_envs * 4))
    model = PPO("MlpPolicy", env, n_steps=n_steps, batch_size=256, n_epochs=4, seed=0)
    started = time.perf_counter()
    model.learn(total_timesteps=steps)
    return steps / (time.perf_counter() - started)


def _vec_step_us(env: Any, steps: int) -> float:
    """µs per ``env.step`` of a VecEnv with fixed random actions: its stepping alone,
    no policy and no training (auto-resets included, as a rollout has them)."""
    import numpy as np

    env.action_space.seed(0)
    actions = [
        np.array([env.action_space.sample() for _ in range(env.num_envs)]) for _ in range(64)
    ]
    env.reset()
    for k in range(32):
        env.step(actions[k % 64])
    started = time.perf_counter()
    for k in range(steps):
        env.step(actions[k % 64])
    return (time.perf_counter() - started) / steps * 1e6


PPO_LOCAL = "local DummyVecEnv"
PPO_REMOTE = "corral RemoteVecEnv"
PPO_BOUND = "local + one bare round trip per step (bound)"
PPO_SUBPROC = "SB3 SubprocVecEnv (8 processes)"
PPO_ASYNC = "Gymnasium AsyncVectorEnv (8 processes, as an SB3 VecEnv)"
"""The PPO contenders; the bound is :class:`benchmarks.bare_remote.BareRoundTrips`, the
Gymnasium one :class:`benchmarks.gym_vec.GymnasiumVecEnv`."""
PPO_ROUND_TRIP_BYTES = 720
"""The bound's bytes each way: about what corral's columnar reply to a step of 8
CartPole sessions weighs on the wire (its request is a little smaller)."""


def _ppo_compare(steps: int, repeats: int, log: Log) -> dict[str, dict[str, float]]:
    import gymnasium
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from benchmarks.bare_remote import BareRoundTrips
    from benchmarks.gym_vec import GymnasiumVecEnv
    from corral.adapters.sb3 import RemoteVecEnv

    def cartpole() -> Any:
        return gymnasium.make("CartPole-v1")

    def cartpoles() -> DummyVecEnv:
        return DummyVecEnv([lambda: gymnasium.make("CartPole-v1") for _ in range(8)])

    echo = asyncio.run(servers.floor_server("tcp"))
    envs: dict[str, Any] = {}
    try:
        envs[PPO_LOCAL] = cartpoles()
        envs[PPO_REMOTE] = RemoteVecEnv.from_env("gym:CartPole-v1", 8)
        envs[PPO_BOUND] = BareRoundTrips(cartpoles(), echo.url, PPO_ROUND_TRIP_BYTES)
        # Its eight workers fork from a server that imported SB3 (and torch) once, not
        # eight times (~2 s of CPU each); nothing timed here starts a worker.
        multiprocessing.get_context("forkserver").set_forkserver_preload(
            ["stable_baselines3.common.vec_env.subproc_vec_env"]
        )
        envs[PPO_SUBPROC] = SubprocVecEnv([cartpole] * 8, start_method="forkserver")
        envs[PPO_ASYNC] = GymnasiumVecEnv([cartpole] * 8)
        fps: dict[str, list[float]] = {name: [] for name in envs}
        step_us: dict[str, list[float]] = {name: [] for name in envs}
        vec_steps = max(64, steps // 8)
        for repeat in range(repeats):  # the contenders take turns, as everywhere here
            for name, env in envs.items():
                fps[name].append(_ppo_fps(env, steps))
                step_us[name].append(_vec_step_us(env, vec_steps))
            log(
                f"  repeat {repeat + 1}/{repeats}: env-steps/s local {fps[PPO_LOCAL][-1]:.0f}, "
                f"remote {fps[PPO_REMOTE][-1]:.0f}, bound {fps[PPO_BOUND][-1]:.0f}, subproc "
                f"{fps[PPO_SUBPROC][-1]:.0f}, async {fps[PPO_ASYNC][-1]:.0f}; a vec step "
                f"alone: local {step_us[PPO_LOCAL][-1]:.0f} µs, remote "
                f"{step_us[PPO_REMOTE][-1]:.0f} µs, bound {step_us[PPO_BOUND][-1]:.0f} µs"
            )
    finally:
        for env in envs.values():
            env.close()
        asyncio.run(echo.stop())
    return {
        name: {"fps": statistics.median(fps[name]), "step_us": statistics.median(step_us[name])}
        for name in envs
    }


def _ppo_child(steps: int, repeats: int) -> dict[str, dict[str, float]]:
    """:func:`_ppo_compare` in a process of its own (its progress to stderr)."""

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    return _ppo_compare(steps, repeats, log)


async def ppo(s: Settings, log: Log) -> dict[str, dict[str, float]]:
    """SB3 PPO env-steps/s on 8 CartPole environments: local, and remote sessions batched
    through corral's SB3 VecEnv (one local server).

    Both contenders train in the main thread of a fresh process, as a training script
    does: corral's blocking client runs its loop in the calling thread, and what that
    costs differs between the main thread and others (see corral.blocking)."""
    log("6. PPO (in a child process's main thread)")
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        job = pool.submit(_ppo_child, s.ppo_steps, s.ppo_repeats)
        return await asyncio.wrap_future(job)

"""``python -m benchmarks.episodes``: the cost of recording episodes, and eval throughput.

    python -m benchmarks.episodes            # a minute or two
    python -m benchmarks.episodes --smoke    # seconds (run by the tests)

1. **Recording overhead.** The same stepping loop with and without ``record=dir``
   (the client's and the pool's own recording into an episode file), in one run, the
   two variants taking turns (ABAB...) so a busy machine slows both alike; the pool
   loop reads ``batch.obs``/``batch.rewards`` as a numpy-first trainer does, and its
   recording works from the reply's columns (no typed model per step);
   for a lockstep client (one session) and for an ``EnvPool`` (batched sessions), on
   Echo (a tiny observation) and Wordle (about 1 KB). The figure is the median of the
   repeats; the ratio is recorded/plain steps per second.
2. **Eval throughput.** ``corral.evaluation.evaluate`` over Wordle's test split with the
   random and the scripted policy, episodes and steps per second (server start-up not
   counted).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from corral.client import AsyncEnvClient, EnvPool
from corral.client.local_server import LocalServer
from corral.envs.echo import EchoAction, EchoEnv
from corral.envs.wordle import WordleAction, WordleEnv
from corral.evaluation import evaluate

ENVS: dict[str, tuple[str, type[Any], Callable[[int], Any]]] = {
    "echo": ("corral.envs.echo:EchoEnv", EchoEnv, lambda i: EchoAction(message="hello")),
    "wordle": (
        "corral.envs.wordle:WordleEnv",
        WordleEnv,
        lambda i: WordleAction(guess=("crane", "slate", "qqqqq")[i % 3]),
    ),
}


async def _lockstep(
    url: str, env: type[Any], act: Callable[[int], Any], steps: int, record: Path | None
) -> float:
    """Steps per second of one session stepping (resetting when an episode ends)."""
    async with AsyncEnvClient(url, env=env, record=record) as client:
        result = await client.reset(seed=0)
        started = time.perf_counter()
        for i in range(steps):
            if result.done:
                result = await client.reset(seed=i)
                continue
            result = await client.step(act(i))
        elapsed = time.perf_counter() - started
    return steps / elapsed


async def _pool(
    url: str,
    env: type[Any],
    act: Callable[[int], Any],
    sessions: int,
    rounds: int,
    record: Path | None,
) -> float:
    """Session-steps per second of an EnvPool stepping every session each round."""
    pool = EnvPool(sessions, url, env=env, autoreset_mode="disabled", progress=False, record=record)
    async with pool:
        await pool.reset(seed=0)
        started = time.perf_counter()
        steps = 0
        for r in range(rounds):
            batch = await pool.step([act(r + i) for i in range(sessions)])
            steps += len(batch)
            _ = batch.obs, batch.rewards  # read as a numpy-first trainer does
            ended = batch.ids[batch.dones].tolist()
            if ended:
                await pool.reset(seed=r, ids=ended)
        elapsed = time.perf_counter() - started
    return steps / elapsed


async def recording_overhead(smoke: bool, log: Callable[[str], None]) -> list[list[str]]:
    """Rows: env, mode, plain steps/s, recorded steps/s, ratio, bytes per step."""
    repeats = 1 if smoke else 5
    steps = 200 if smoke else 3000
    sessions, rounds = (8, 20) if smoke else (64, 200)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (target, env, act) in ENVS.items():
            server = LocalServer(target)
            url = await server.start()
            try:
                modes: list[tuple[str, Callable[[Path | None], Any]]] = [
                    (
                        "lockstep, 1 session",
                        lambda rec, u=url, e=env, a=act: _lockstep(u, e, a, steps, rec),
                    ),
                    (
                        f"EnvPool, {sessions} sessions",
                        lambda rec, u=url, e=env, a=act: _pool(u, e, a, sessions, rounds, rec),
                    ),
                ]
                for mode, run in modes:
                    plain: list[float] = []
                    recorded: list[float] = []
                    size = 0.0
                    for k in range(repeats):
                        where = Path(tmp) / f"{name}-{mode[:4]}-{k}"
                        plain.append(await run(None))
                        recorded.append(await run(where))
                        (path,) = where.glob("*.jsonl")
                        lines = path.read_bytes().count(b'"kind":"step"')
                        size = path.stat().st_size / max(1, lines)
                    p, r = statistics.median(plain), statistics.median(recorded)
                    log(f"  {name} {mode}: {p:,.0f} vs {r:,.0f} steps/s")
                    rows.append(
                        [name, mode, f"{p:,.0f}", f"{r:,.0f}", f"{r / p:.2f}", f"{size:,.0f}"]
                    )
            finally:
                await server.stop()
    return rows


async def eval_throughput(smoke: bool, log: Callable[[str], None]) -> list[list[str]]:
    """Rows: policy, concurrency, episodes, steps, steps/s, episodes/s."""
    rows = []
    cases = (
        [("random", 8, 16), ("scripted", 8, 16)]
        if smoke
        else [("random", 8, 384), ("random", 32, 384), ("scripted", 8, 384), ("scripted", 32, 384)]
    )
    with tempfile.TemporaryDirectory() as tmp:
        for k, (policy, concurrency, episodes) in enumerate(cases):
            summary = await evaluate(
                "corral.envs.wordle:WordleEnv",
                out=Path(tmp) / f"run{k}",
                policy=policy,
                split="test",
                episodes=episodes,
                concurrency=concurrency,
                max_steps=20,
                progress=False,
            )
            log(f"  eval {policy} x{concurrency}: {summary.steps_per_s:,.0f} steps/s")
            rows.append(
                [
                    policy,
                    str(concurrency),
                    str(summary.episodes),
                    str(summary.steps),
                    f"{summary.steps_per_s:,.0f}",
                    f"{summary.episodes_per_s:,.1f}",
                ]
            )
    return rows


def _table(title: str, headers: list[str], rows: list[list[str]]) -> Table:
    table = Table(*headers, title=title, title_justify="left")
    for row in rows:
        table.add_row(*row)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.episodes")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    args = parser.parse_args(argv)
    console = Console()

    async def run() -> tuple[list[list[str]], list[list[str]]]:
        log: Callable[[str], None] = lambda text: console.print(text, style="dim")  # noqa: E731
        return await recording_overhead(args.smoke, log), await eval_throughput(args.smoke, log)

    overhead, throughput = asyncio.run(run())
    console.print(
        _table(
            "Recording overhead (steps/s, median; recorded/plain)",
            ["env", "mode", "plain", "recorded", "ratio", "bytes/step"],
            overhead,
        )
    )
    console.print(
        _table(
            "corral eval throughput (Wordle test split, max 20 steps)",
            ["policy", "concurrency", "episodes", "steps", "steps/s", "episodes/s"],
            throughput,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

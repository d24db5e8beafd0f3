"""``make demo``: the main job on the embedded default.

Starts the built-in Wordle text game in a local server process, plays several episodes
concurrently through the async client with a simple policy, and prints a table.

    python -m corral.demo [--episodes 32] [--concurrency 8] [--codec msgpack]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from corral.client import AsyncEnvClient
from corral.envs.wordle import (
    SimplePolicy,
    WordleAction,
    WordleEnv,
    WordleObservation,
    WordleState,
)

WordleClient = AsyncEnvClient[WordleAction, WordleObservation, WordleState]


@dataclass
class GameResult:
    """The outcome of one played episode."""

    seed: int
    reward: float
    steps: int
    solved: bool
    truncated: bool
    secret: str


async def play(client: WordleClient, seed: int) -> GameResult:
    """Play one seeded episode to its end with :class:`SimplePolicy`."""
    policy = SimplePolicy(seed=seed)
    result = await client.reset(seed=seed)
    total, steps = 0.0, 0
    while not result.done:
        result = await client.step(policy.act(result.observation))
        total += result.reward or 0.0
        steps += 1
    state = await client.state()
    return GameResult(
        seed=seed,
        reward=total,
        steps=steps,
        solved=state.solved,
        truncated=result.truncated,
        secret=result.observation.secret or "",
    )


async def run(
    episodes: int, concurrency: int, codec: str, console: Console
) -> tuple[list[GameResult], float]:
    """Start the server, play ``episodes`` over ``concurrency`` sessions, stop the server.

    Returns the episodes and the seconds spent playing (server start-up excluded).
    """
    started = time.perf_counter()
    first = await AsyncEnvClient.from_env(
        "corral.envs.wordle:WordleEnv", env=WordleEnv, codec=codec
    )
    assert first.server is not None and first.server.url is not None
    console.print(
        f"[bold]corral demo[/]: Wordle served by a local process at {first.server.url} "
        f"(ready in {time.perf_counter() - started:.2f} s, codec {codec})"
    )
    clients = [first] + [
        AsyncEnvClient(first.server.url, env=WordleEnv, codec=codec) for _ in range(concurrency - 1)
    ]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for seed in range(episodes):
        queue.put_nowait(seed)
    done: list[GameResult] = []

    async def worker(client: WordleClient) -> None:
        while not queue.empty():
            done.append(await play(client, queue.get_nowait()))

    playing = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in clients))
        seconds = time.perf_counter() - playing
    finally:
        for client in reversed(clients):  # the first client owns the server process
            await client.close()
    return sorted(done, key=lambda e: e.seed), seconds


def report(episodes: list[GameResult], seconds: float, concurrency: int, console: Console) -> None:
    """Print per-episode rows (the first few) and the summary table."""
    detail = Table(title="First episodes")
    for column in ("seed", "secret", "guesses", "reward", "outcome"):
        detail.add_column(column, justify="right" if column != "secret" else "left")
    for e in episodes[:8]:
        outcome = "solved" if e.solved else ("truncated" if e.truncated else "out of guesses")
        detail.add_row(str(e.seed), e.secret, str(e.steps), f"{e.reward:.2f}", outcome)
    console.print(detail)
    steps = sum(e.steps for e in episodes)
    summary = Table(title="Summary")
    for column in ("episodes", "sessions", "solved", "mean reward", "mean guesses", "steps/s"):
        summary.add_column(column, justify="right")
    summary.add_row(
        str(len(episodes)),
        str(concurrency),
        f"{sum(e.solved for e in episodes) / len(episodes):.0%}",
        f"{statistics.fmean(e.reward for e in episodes):.3f}",
        f"{statistics.fmean(e.steps for e in episodes):.2f}",
        f"{steps / seconds:,.0f}",
    )
    console.print(summary)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--codec", choices=["msgpack", "json"], default="msgpack")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.concurrency < 1:
        parser.error("--episodes and --concurrency must be at least 1")
    console = Console()
    sessions = min(args.concurrency, args.episodes)
    episodes, seconds = asyncio.run(run(args.episodes, sessions, args.codec, console))
    report(episodes, seconds, sessions, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

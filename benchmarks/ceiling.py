"""The in-process ceiling: the environments stepped directly, no server, no wire.

What no remote framework can beat on this machine: ``EchoEnv.step`` called in a loop
(the lockstep ceiling, and the batched one with one instance per session), and
Gymnasium's ``SyncVectorEnv`` of CartPole (the reference vectorised trainer loop).

And the machine's **cache cliff** (:func:`echo_touching`): the same loop over sessions,
each visit also writing one field of each of ``k`` small records of that session, as a
server's per-session bookkeeping does. It is the control for the issue-10 flatness
target: how much a round of 1,024 sessions slows against 256 when each session's working
set grows by ``k`` cache lines, with nothing of corral's in the loop.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.envs import MESSAGE
from benchmarks.measure import Log, Settings, _percentile
from corral.envs.echo import EchoAction, EchoEnv


def _timed_loop(step: Any, seconds: float) -> tuple[int, float, list[float]]:
    """Call ``step()`` for ``seconds``; (calls, elapsed, per-call µs of a sample)."""
    calls = 0
    sample: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        t0 = time.perf_counter_ns()
        step()
        if len(sample) < 20_000:
            sample.append((time.perf_counter_ns() - t0) / 1000)
        calls += 1
        if calls % 64 == 0 and time.perf_counter() > deadline:
            break
    return calls, time.perf_counter() - start, sample


def echo_lockstep(seconds: float) -> dict[str, float]:
    """One EchoEnv stepped directly."""
    env = EchoEnv()
    env.reset()
    action = EchoAction(message=MESSAGE)
    calls, elapsed, sample = _timed_loop(lambda: env.step(action), seconds)
    return {"steps_s": calls / elapsed, "p50_us": _percentile(sample, 0.5)}


def _echo_envs(n: int) -> list[EchoEnv]:
    """``n`` EchoEnv instances, each reset."""
    envs = [EchoEnv() for _ in range(n)]
    for env in envs:
        env.reset()
    return envs


def echo_batched(n: int, seconds: float) -> dict[str, float]:
    """``n`` EchoEnv instances stepped in a Python loop, one round per call."""
    envs = _echo_envs(n)
    actions = [EchoAction(message=MESSAGE)] * n

    def round_() -> None:
        for env, action in zip(envs, actions, strict=True):
            env.step(action)

    calls, elapsed, _ = _timed_loop(round_, seconds)
    return {"steps_s": calls * n / elapsed}


CLIFF_RECORDS = (16, 32)
"""Records per session the cache-cliff loop touches (beside 0: the plain loop)."""


class _Record:
    """A small per-session record: 80 bytes with its GC header, about a cache line."""

    __slots__ = ("a", "b", "c", "d", "e", "touched")

    def __init__(self) -> None:
        self.a = self.b = self.c = self.d = self.e = None
        self.touched = 0


def echo_touching(n: int, k: int, seconds: float) -> float:
    """Env-steps/s of ``n`` EchoEnv stepped in a loop, each visit also writing one field
    of ``k`` records of its own session (``k = 0``: the same loop touching none, the
    baseline measured in turns with the others)."""
    envs = _echo_envs(n)
    # One kind of record at a time for every session, as a server allocates its session,
    # lifecycle, runner... objects: a session's k records lie in k different places.
    kinds = [[_Record() for _ in range(n)] for _ in range(k)]
    visits = [(env, [kind[i] for kind in kinds]) for i, env in enumerate(envs)]
    action = EchoAction(message=MESSAGE)

    def round_() -> None:
        for env, records in visits:
            for record in records:
                record.touched ^= 1
            env.step(action)

    calls, elapsed, _ = _timed_loop(round_, seconds)
    return calls * n / elapsed


def cache_cliff(
    sizes: tuple[int, int], repeats: int, seconds: float
) -> dict[int, dict[int, float]]:
    """Median env-steps/s of :func:`echo_touching` by records per session, then by
    session count; the sizes and record counts alternate within each repeat."""
    rates: dict[int, dict[int, list[float]]] = {
        k: {n: [] for n in sizes} for k in (0, *CLIFF_RECORDS)
    }
    for _ in range(repeats):
        for k, by_size in rates.items():
            for n, values in by_size.items():
                values.append(echo_touching(n, k, seconds))
    return {k: {n: statistics.median(v) for n, v in by.items()} for k, by in rates.items()}


def cartpole(n: int, seconds: float) -> dict[str, float] | None:
    """Gymnasium's ``SyncVectorEnv`` of ``n`` CartPole-v1 (None without gymnasium)."""
    try:
        import gymnasium as gym
        import numpy as np
    except ImportError:
        return None
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    vec.reset(seed=0)
    actions = np.ones(n, dtype=np.int64)
    try:
        calls, elapsed, _ = _timed_loop(lambda: vec.step(actions), seconds)
    finally:
        vec.close()
    return {"steps_s": calls * n / elapsed}


async def ceiling(s: Settings, log: Log) -> dict[str, Any]:
    """The in-process figures (run in this process; nothing else runs meanwhile)."""
    log("0. in-process ceiling")
    sizes = sorted({1, *s.batched_sessions} - {1}) or [16]
    largest = max(sizes)
    result: dict[str, Any] = {
        "echo_lockstep": echo_lockstep(s.ceiling_seconds),
        "echo_batched": {n: echo_batched(n, s.ceiling_seconds) for n in sizes},
        "cartpole": {n: cartpole(n, s.ceiling_seconds) for n in (1, largest)},
        "cliff": cache_cliff(s.cliff_sessions, s.repeats, s.ceiling_seconds / 2),
    }
    log(
        f"  EchoEnv.step: {result['echo_lockstep']['steps_s']:,.0f}/s; "
        f"{largest} echo envs: {result['echo_batched'][largest]['steps_s']:,.0f} env-steps/s"
    )
    return result

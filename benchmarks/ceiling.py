"""The in-process ceiling: the environments stepped directly, no server, no wire.

What no remote framework can beat on this machine: ``EchoEnv.step`` called in a loop
(the lockstep ceiling, and the batched one with one instance per session), and
Gymnasium's ``SyncVectorEnv`` of CartPole (the reference vectorised trainer loop).
"""

from __future__ import annotations

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


def echo_batched(n: int, seconds: float) -> dict[str, float]:
    """``n`` EchoEnv instances stepped in a Python loop, one round per call."""
    envs = [EchoEnv() for _ in range(n)]
    for env in envs:
        env.reset()
    actions = [EchoAction(message=MESSAGE)] * n

    def round_() -> None:
        for env, action in zip(envs, actions, strict=True):
            env.step(action)

    calls, elapsed, _ = _timed_loop(round_, seconds)
    return {"steps_s": calls * n / elapsed}


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
    }
    log(
        f"  EchoEnv.step: {result['echo_lockstep']['steps_s']:,.0f}/s; "
        f"{largest} echo envs: {result['echo_batched'][largest]['steps_s']:,.0f} env-steps/s"
    )
    return result

"""Section 10: sessions that outlive their server (issue 29), measured in one run.

* **snapshot / restore** of one session (echo, Wordle, coding when its sandbox runs
  here): a client's ``snapshot()`` and ``restore()`` round trips on a real server.
* **replay restore**: the pool re-homing the sessions of one of two servers by verified
  replay of a ``S``-step episode (replay-only env), per session and for the whole step
  that waited for it; the same by snapshot (echo) for comparison.
* **fork of 64** from one state: by snapshot (echo) and by replay (replay-only env).
* **step p99 during a rolling restart** (each of two servers SIGTERMed in turn: drain,
  sessions moved by snapshot, exit, start again on its port) against the steady state,
  on the same pool.
* **lockstep overhead** of keeping every session's episode log: ``pool.step`` rate
  with recovery on and off, on the same server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.tables import Report, fmt
from corral.client import AsyncEnvClient, EnvPool
from corral.envs.echo import EchoAction, EchoEnv
from corral.errors import SnapshotUnsupported
from corral.protocol.recovery import Cause

Log = Callable[[str], None]
ROOT = Path(__file__).resolve().parents[1]
FLEET_KEY = "benchmark-fleet-key-0123456789abcdef"
REPLAY_ONLY = "benchmarks.envs:CountEnv"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One ``corral serve`` on a fixed port, restartable there (drains on SIGTERM)."""

    def __init__(self, target: str, server_id: str) -> None:
        self.target, self.id, self.port = target, server_id, _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        env = {**os.environ, "CORRAL_FLEET_KEY": FLEET_KEY, "CORRAL_DRAIN_SECONDS": "15"}
        command = [sys.executable, "-m", "corral", "serve", self.target, "--port",
                   str(self.port), "--server-id", self.id, "--log-level", "warning",
                   "--max-sessions", "4096"]  # fmt: skip
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"corral serve {self.target} exited at start")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"corral serve {self.target} not ready in 120 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.2f}"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _snapshot_restore(target: str, action: Any, runs: int) -> dict[str, Any] | None:
    server = Server(target, "bench-snap")
    try:
        await asyncio.to_thread(server.start)
    except RuntimeError:
        return None  # this env cannot be served here (the coding env's sandbox)
    try:
        async with AsyncEnvClient(server.url) as env:
            await env.reset(seed=1)
            for _ in range(3):
                await env.step(action)
            try:
                await env.snapshot()
            except SnapshotUnsupported:
                return {"unsupported": True}
            snaps, restores, size = [], [], 0
            for _ in range(runs):
                t = time.perf_counter()
                saved = await env.snapshot()
                snaps.append(time.perf_counter() - t)
                size = len(str(saved.to_wire()))
                t = time.perf_counter()
                await env.restore(saved)
                restores.append(time.perf_counter() - t)
        return {
            "snapshot_s": statistics.median(snaps),
            "restore_s": statistics.median(restores),
            "bytes": size,
        }
    finally:
        server.stop(signal.SIGKILL)


async def _moves(
    urls: list[str], env: Any, action: Any, steps: int, cause: Cause
) -> dict[str, Any]:
    """Re-home the sessions of the second server (``cause``) after ``steps`` steps."""
    async with EnvPool(64, urls, env=env, progress=False, health_interval=None) as pool:
        await pool.reset(seed=list(range(64)))
        for _ in range(steps):
            await pool.step([action] * 64)
        moving = [s for s in pool.fleet.slots if s.link and s.link.server_id == "bench-b"]
        for slot in moving:
            slot.move = cause
        t = time.perf_counter()
        await pool.step([action] * 64)
        wall = time.perf_counter() - t
        stats = pool.stats()
    kind = "snapshot" if cause is Cause.GOING_AWAY else "replay"
    times = stats["seconds"].get(kind, {"count": 0, "total_s": 0.0, "max_s": 0.0})
    return {"sessions": times["count"], "per_session_s": times["total_s"] / max(1, times["count"]),
            "step_s": wall, "steps": steps}  # fmt: skip


async def _fork(url: str, env: Any, action: Any, steps: int) -> float:
    async with EnvPool(1, url, env=env, progress=False, health_interval=None) as pool:
        await pool.reset(seed=1)
        for _ in range(steps):
            await pool.step([action])
        t = time.perf_counter()
        await pool.fork(0, 64)
        return time.perf_counter() - t


async def _rolling(servers: list[Server], steps: int) -> dict[str, Any]:
    """Step p50/p99 steady, then while both servers restart one after the other."""
    action = EchoAction(message="x")
    urls = [s.url for s in servers]
    async with EnvPool(64, urls, env=EchoEnv, progress=False) as pool:
        await pool.reset(seed=list(range(64)))
        steady = []
        for _ in range(steps):
            t = time.perf_counter()
            await pool.step([action] * 64)
            steady.append(time.perf_counter() - t)
        done = threading.Event()

        def roll() -> None:
            for server in servers:
                server.restart()
            done.set()

        rolling = []
        thread = threading.Thread(target=roll)
        thread.start()
        while not done.is_set():
            t = time.perf_counter()
            await pool.step([action] * 64)
            rolling.append(time.perf_counter() - t)
        await asyncio.to_thread(thread.join)
        stats = pool.stats()
    return {
        "steady": (_pct(steady, 0.5), _pct(steady, 0.99), max(steady), len(steady)),
        "rolling": (_pct(rolling, 0.5), _pct(rolling, 0.99), max(rolling), len(rolling)),
        "moved_snapshot": stats["restored_by_snapshot"],
        "moved_replay": stats["restored_by_replay"],
        "truncated": stats["truncated"],
    }


async def _overhead(url: str, steps: int) -> dict[str, float]:
    rates = {}
    action = EchoAction(message="x")
    for recover in (False, True, False, True):
        async with EnvPool(
            256, url, env=EchoEnv, progress=False, recover=recover, health_interval=None
        ) as pool:
            await pool.reset(seed=0)
            for _ in range(10):
                await pool.step([action] * 256)
            t = time.perf_counter()
            for _ in range(steps):
                await pool.step([action] * 256)
            rate = steps * 256 / (time.perf_counter() - t)
        rates[str(recover)] = max(rates.get(str(recover), 0.0), rate)
    return {"off": rates["False"], "on": rates["True"]}


async def fleet(settings: Any, log: Log) -> dict[str, Any]:
    """Every measurement of the section."""
    smoke = settings.smoke
    runs, steps = (3, 5) if smoke else (50, 50)
    out: dict[str, Any] = {"snapshots": {}}
    for name, target, action in (
        ("echo", "corral.envs.echo:EchoEnv", {"message": "hello"}),
        ("wordle", "corral.envs.wordle:WordleEnv", {"guess": "crane"}),
        ("coding", "corral.envs.coding:CodingEnv", {"code": "print(1)"}),
    ):
        log(f"fleet: snapshot/restore of {name}")
        out["snapshots"][name] = await _snapshot_restore(target, action, runs)
    echo = [Server("corral.envs.echo:EchoEnv", f"bench-{k}") for k in "ab"]
    counts = [Server(REPLAY_ONLY, f"bench-{k}") for k in "ab"]
    everything = echo + counts
    try:
        await asyncio.gather(*(asyncio.to_thread(s.start) for s in everything))
        from benchmarks.envs import CountAction, CountEnv

        log("fleet: lockstep overhead of the episode logs")
        out["overhead"] = await _overhead(echo[0].url, 20 if smoke else 300)
        log("fleet: re-homing by replay and by snapshot")
        out["replay"] = await _moves(
            [s.url for s in counts], CountEnv, CountAction(), steps, Cause.LOST
        )
        out["snapshot_move"] = await _moves(
            [s.url for s in echo], EchoEnv, EchoAction(message="x"), steps, Cause.GOING_AWAY
        )
        log("fleet: fork of 64")
        out["fork_snapshot_s"] = await _fork(echo[0].url, EchoEnv, EchoAction(message="x"), steps)
        out["fork_replay_s"] = await _fork(counts[0].url, CountEnv, CountAction(), steps)
        log("fleet: step latency during a rolling restart")
        out["rolling"] = await _rolling(echo, 30 if smoke else 300)
    finally:
        for server in everything:
            server.stop(signal.SIGKILL)
    return out


def section(report: Report, result: dict[str, Any]) -> dict[str, Any]:
    """Section 10's table; returns the figures its targets are checked against."""
    rows = []
    for name, r in result["snapshots"].items():
        if r is None:
            rows.append([f"snapshot / restore, {name}", "not served here", "—", "—"])
        elif r.get("unsupported"):
            rows.append([f"snapshot / restore, {name}", "declares no snapshot", "—", "—"])
        else:
            rows.append([f"snapshot / restore, {name}", _ms(r["snapshot_s"]),
                         _ms(r["restore_s"]), f"{fmt(r['bytes'])} B envelope"])  # fmt: skip
    replay, move = result["replay"], result["snapshot_move"]
    rows.append([f"re-home by replay ({replay['steps']}-step episode), per session",
                 _ms(replay["per_session_s"]), _ms(replay["step_s"]),
                 f"{replay['sessions']} sessions; per session, the step"])  # fmt: skip
    rows.append(["re-home by snapshot (going away), per session", _ms(move["per_session_s"]),
                 _ms(move["step_s"]), f"{move['sessions']} sessions"])  # fmt: skip
    rows.append(["fork of 64 from one state, by snapshot", _ms(result["fork_snapshot_s"]), "—",
                 "echo"])  # fmt: skip
    rows.append(["fork of 64 from one state, by replay", _ms(result["fork_replay_s"]), "—",
                 f"{replay['steps']}-step episode"])  # fmt: skip
    rolling = result["rolling"]
    for label, (p50, p99, worst, n) in (("steady", rolling["steady"]),
                                          ("rolling restart", rolling["rolling"])):  # fmt: skip
        rows.append([f"pool.step of 64, {label}: p50 / p99", _ms(p50), _ms(p99),
                     f"max {_ms(worst)} ms over {n} steps"])  # fmt: skip
    over = result["overhead"]
    cost = 1 - over["on"] / over["off"]
    rows.append(["pool.step of 256, episode logs on / off (steps/s)", fmt(over["on"]),
                 fmt(over["off"]), f"overhead {cost:.1%}"])  # fmt: skip
    report.add(
        "10. Sessions that outlive their server (issue 29)",
        ["measure", "ms (or value)", "ms (or value)", "notes"],
        rows,
        [
            "Real `corral serve` processes on 127.0.0.1 sharing a fleet key. Replay-only env: "
            "benchmarks.envs:CountEnv (no snapshot). Rolling restart: SIGTERM drains each "
            f"server in turn (sessions moved: {rolling['moved_snapshot']} by snapshot, "
            f"{rolling['moved_replay']} by replay, {rolling['truncated']} truncated).",
        ],
    )
    return {
        "log_overhead": cost,
        "rolling_p99_over_steady": rolling["rolling"][1] / rolling["steady"][1],
    }

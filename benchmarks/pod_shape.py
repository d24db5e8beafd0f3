"""The capacity model in the Pod's shape (issue 30.18): a server under a CPU quota and a
memory limit, as the rendered Pod runs it, measured with Docker's cgroups.

    python -m benchmarks.pod_shape --image corral-echo:0.1.0

For each environment (echo, Wordle) and each CPU limit (none, 1, 0.5, 0.25 CPU: Docker's
``--cpus``, the CFS quota a Pod's ``limits.cpu`` sets), one container runs ``corral
serve`` with the Pod's hardening (uid 10001, no capabilities, read-only root, 512 MiB
memory limit); an ``EnvPool`` on the host opens N sessions and steps them in batches.
Reported: the container's memory (cgroup v2 ``memory.current``, v1 ``total_rss``) per
session from idle to N sessions reset, the batched step's p50/p99, and the share of CFS
periods throttled (cgroup ``cpu.stat``; it read 0 on a cgroup v1 host even where the
steps slowed, see docs/scaling.md). What it cannot show: a node's kubelet and its eviction, other
Pods on the node, the image pull.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from corral.client.pool import EnvPool

ENVS = {
    "echo": ("corral.envs.echo:EchoEnv", "corral.envs.echo", "EchoEnv", "EchoAction", "message"),
    "wordle": (
        "corral.envs.wordle:WordleEnv",
        "corral.envs.wordle",
        "WordleEnv",
        "WordleAction",
        "guess",
    ),
}
VALUES = {"echo": "hi", "wordle": "crane"}


def docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


def cgroup(container: str, v2: str, v1: str) -> str:
    """A cgroup file of the container: its cgroup v2 name, else its v1 path."""
    found = subprocess.run(
        ["docker", "exec", container, "cat", f"/sys/fs/cgroup/{v2}"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if found.returncode == 0:
        return found.stdout.strip()
    return docker("exec", container, "cat", f"/sys/fs/cgroup/{v1}")


def memory(container: str) -> int:
    """Bytes charged to the container: v2 ``memory.current``; v1 anonymous memory (rss),
    as the kubelet's working set counts it without the page cache of the image."""
    text = cgroup(container, "memory.current", "memory/memory.stat")
    if text.isdigit():
        return int(text)
    stat = dict(line.split() for line in text.splitlines())
    return int(stat["total_rss"])


def throttled(container: str) -> tuple[int, int]:
    text = cgroup(container, "cpu.stat", "cpu/cpu.stat")
    stat = dict(line.split() for line in text.splitlines())
    return int(stat.get("nr_throttled", 0)), int(stat.get("nr_periods", 0))


async def measure(
    image: str, env: str, cpus: float | None, sessions: int, rounds: int
) -> dict[str, Any]:
    target, module, cls, action, field = ENVS[env]
    limit = [f"--cpus={cpus}"] if cpus else []
    container = docker(
        "run", "-d", "--rm", "--user=10001:10001", "--cap-drop=ALL", "--read-only",
        "--tmpfs=/tmp", "--memory=512m", "--security-opt=no-new-privileges",
        "-p", "127.0.0.1::8000", *limit, image,
        "python", "-m", "corral", "serve", target, "--host", "0.0.0.0", "--port", "8000",
        "--max-sessions", str(sessions + 8), "--workers", "0",
    )  # fmt: skip
    try:
        port = docker("port", container, "8000/tcp").splitlines()[0].rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(docker("logs", container))
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        idle = memory(container)
        mod = __import__(module, fromlist=[cls, action])
        env_type, action_type = getattr(mod, cls), getattr(mod, action)
        async with EnvPool(sessions, url, env=env_type, timeout=300, progress=False) as pool:
            await pool.reset(seed=0)
            await asyncio.sleep(0.5)
            opened = memory(container)
            actions = [action_type(**{field: VALUES[env]}) for _ in range(sessions)]
            await pool.step(actions)
            t0, p0 = throttled(container)
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                await pool.step(actions)
                times.append(time.perf_counter() - started)
            t1, p1 = throttled(container)
        quantiles = statistics.quantiles(times, n=100)
        return {
            "env": env,
            "cpus": cpus,
            "sessions": sessions,
            "idle_mb": idle / 2**20,
            "kb_per_session": (opened - idle) / 1024 / sessions,
            "p50_ms": quantiles[49] * 1000,
            "p99_ms": quantiles[98] * 1000,
            "throttled": (t1 - t0) / (p1 - p0) if p1 > p0 else 0.0,
        }
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pod_shape")
    parser.add_argument("--image", required=True, help="an image corral build made")
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    table = Table(title=f"Pod shape: {args.sessions} sessions, batched steps, 512 MiB limit")
    for column in ("env", "CPU limit", "idle MiB", "KiB / session", "step p50 ms",
                   "step p99 ms", "CFS periods throttled", "load (1 min)"):  # fmt: skip
        table.add_column(column)
    for env in ENVS:
        for cpus in (None, 1.0, 0.5, 0.25):
            row = asyncio.run(measure(args.image, env, cpus, args.sessions, args.rounds))
            with open("/proc/loadavg") as f:
                load = f.read().split()[0]
            table.add_row(
                env, "none" if cpus is None else f"{cpus:g}", f"{row['idle_mb']:.0f}",
                f"{row['kb_per_session']:.1f}", f"{row['p50_ms']:.1f}", f"{row['p99_ms']:.1f}",
                f"{row['throttled']:.0%}", load,
            )  # fmt: skip
    Console(width=140).print(table)


if __name__ == "__main__":
    main()

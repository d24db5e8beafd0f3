"""Capacity figures for ``docs/scaling.md``: what one core and one pod hold, and start-up times.

    python -m benchmarks.capacity                 # full sizes
    python -m benchmarks.capacity --smoke         # seconds, for a quick check
    python -m benchmarks.capacity --only envs     # or: providers
    python -m benchmarks.capacity --markdown benchmarks/CAPACITY.md

**Envs** (echo, Wordle, sandboxed coding): one local server process holds N sessions
driven by an ``EnvPool`` (batched steps, auto-reset) for a few seconds. Reported: memory
per session (the server's whole process tree, sandboxes included: resident memory from
idle to N sessions reset, / N) and env-steps per server CPU-second (steps divided by the
CPU time the server's tree used meanwhile: what one core sustains, however busy the
client and the machine are).

**Providers**: the time from nothing to N sessions ready on M servers, per provider:
local processes, Docker containers, Ray actors; cold (servers started for the pool) and
warm (taken from a filled ``WarmPool``), plus Ray's own figures (``ray.init``, actor start
to the first reset). Each figure carries the machine's load average beside it: the
machine is shared and its load moves the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from corral.client import AsyncEnvClient
from corral.client.pool import EnvPool
from corral.providers.base import Endpoint, Provider, ServerSpec
from corral.providers.local import LocalProcessProvider
from corral.providers.spares import WarmPool

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def load() -> str:
    """The 1-minute load average now."""
    return f"{os.getloadavg()[0]:.1f}"


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def tree(root: int) -> list[int]:
    """``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tree_rss_kb(root: int) -> int:
    """Resident memory of a process tree, KiB."""
    total = 0
    for pid in tree(root):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used by a process tree (its live processes, and the children they reaped)."""
    total = 0
    for pid in tree(root):
        fields = _stat(pid)
        if fields is not None:
            total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / TICK


@dataclass(frozen=True)
class EnvCase:
    """One environment to size."""

    name: str
    target: str
    sessions: int
    action: Callable[[], Any]
    env: Callable[[], type[Any]]


def _echo() -> type[Any]:
    from corral.envs.echo import EchoEnv

    return EchoEnv


def _wordle() -> type[Any]:
    from corral.envs.wordle import WordleEnv

    return WordleEnv


def _coding() -> type[Any]:
    from corral.envs.coding import CodingEnv

    return CodingEnv


def cases(smoke: bool) -> list[EnvCase]:
    from corral.envs.coding import CodeAction
    from corral.envs.echo import EchoAction
    from corral.envs.wordle import WordleAction

    scale = 0.125 if smoke else 1.0
    many, few = int(1024 * scale), max(4, int(32 * scale))
    code = "x = sum(range(100))\nprint(x)"
    echo, wordle, coding = (
        "corral.envs.echo:EchoEnv",
        "corral.envs.wordle:WordleEnv",
        "corral.envs.coding:CodingEnv",
    )
    return [
        EnvCase("echo", echo, many, lambda: EchoAction(message="hi"), _echo),
        EnvCase("wordle", wordle, many, lambda: WordleAction(guess="crane"), _wordle),
        EnvCase("coding", coding, few, lambda: CodeAction(code=code), _coding),
    ]


async def size_env(case: EnvCase, seconds: float) -> dict[str, Any]:
    """Memory per session and env-steps per server CPU-second of one environment."""
    async with LocalProcessProvider(cwd=ROOT) as provider:
        spec = ServerSpec(
            case.target, max_sessions=case.sessions + 8, server_args=("--workers", "0")
        )
        endpoint = await provider.start(spec)
        pid = int(endpoint.id)
        await asyncio.sleep(1.0)
        idle = tree_rss_kb(pid)
        before_load = load()
        async with EnvPool(case.sessions, endpoint.url, env=case.env(), timeout=300) as pool:
            await pool.reset(seed=0)
            await asyncio.sleep(0.5)
            opened = tree_rss_kb(pid)
            actions = [case.action() for _ in range(case.sessions)]
            await pool.step(actions)  # warm-up
            cpu0, t0, steps = tree_cpu_seconds(pid), time.monotonic(), 0
            while time.monotonic() - t0 < seconds:
                await pool.step(actions)
                steps += case.sessions
            wall = time.monotonic() - t0
            cpu = tree_cpu_seconds(pid) - cpu0
        return {
            "env": case.name,
            "sessions": case.sessions,
            "kb_per_session": (opened - idle) / case.sessions,
            "idle_mb": idle / 1024,
            "steps_per_cpu_s": steps / cpu if cpu > 0 else float("nan"),
            "steps_per_s": steps / wall,
            "server_cpu": cpu / wall,
            "load": f"{before_load} → {load()}",
        }


async def timed(what: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.monotonic()
    result = await what()
    return time.monotonic() - started, result


async def pool_ready(urls: Sequence[str], sessions: int) -> None:
    """Open ``sessions`` sessions over ``urls`` and reset them all (then close)."""
    from corral.envs.echo import EchoEnv

    async with EnvPool(sessions, list(urls), env=EchoEnv) as pool:
        await pool.reset(seed=0)


async def cold(provider: Provider, spec: Any, servers: int, sessions: int) -> float:
    """Seconds from starting ``servers`` servers to ``sessions`` sessions reset on them."""

    async def run() -> list[Endpoint]:
        endpoints = await asyncio.gather(*(provider.start(spec) for _ in range(servers)))
        await pool_ready([e.url for e in endpoints], sessions)
        return list(endpoints)

    seconds, endpoints = await timed(run)
    await asyncio.gather(*(provider.stop(e) for e in endpoints))
    return seconds


async def warm(provider: Provider, spec: Any, servers: int, sessions: int) -> tuple[float, float]:
    """(time to fill the warm pool, time from acquiring to the sessions ready)."""
    async with WarmPool(provider, spec, size=servers, health_interval=60) as spares:
        fill, _ = await timed(lambda: spares.wait_full(timeout=600))

        async def run() -> list[Endpoint]:
            endpoints = [await spares.acquire() for _ in range(servers)]
            await pool_ready([e.url for e in endpoints], sessions)
            return endpoints

        seconds, endpoints = await timed(run)
        for endpoint in endpoints:
            await spares.release(endpoint)
    return fill, seconds


async def providers(smoke: bool, console: Console, which: set[str]) -> list[dict[str, Any]]:
    servers, sessions = (2, 16) if smoke else (2, 256)
    rows: list[dict[str, Any]] = []

    def add(provider: str, mode: str, seconds: float, note: str = "", before: str = "") -> None:
        rows.append(
            {"provider": provider, "mode": mode, "seconds": seconds, "note": note,
             "load": f"{before} → {load()}" if before else load()}
        )  # fmt: skip
        console.print(f"  {provider} {mode}: {seconds:.3g} s {note}")

    echo = "corral.envs.echo:EchoEnv"
    if "local" in which:
        before = load()
        seconds, _ = await timed(lambda: _envpool_local(servers, sessions))
        add("local", f"cold, EnvPool(target, servers={servers})", seconds, before=before)
        async with LocalProcessProvider(cwd=ROOT) as local:
            before = load()
            add(
                "local", "cold, provider", await cold(local, echo, servers, sessions), before=before
            )
            before = load()
            fill, seconds = await warm(local, echo, servers, sessions)
            add("local", "warm", seconds, f"(filling the warm pool took {fill:.2f} s)", before)
    if "docker" in which:
        await _docker(console, servers, sessions, add)
    if "ray" in which:
        await _ray(console, servers, sessions, add)
    return rows


async def _envpool_local(servers: int, sessions: int) -> None:
    from corral.envs.echo import EchoEnv

    async with EnvPool(sessions, "corral.envs.echo:EchoEnv", env=EchoEnv, servers=servers) as pool:
        await pool.reset(seed=0)


async def _docker(console: Console, servers: int, sessions: int, add: Any) -> None:
    try:
        from corral.providers.docker import DockerProvider, build_image
    except ImportError as exc:
        console.print(f"  docker: skipped ({exc})")
        return
    import tempfile

    env = Path(tempfile.mkdtemp(prefix="corral-capacity-"))
    (env / "corral.yaml").write_text(
        "name: capacity-echo\nentry_point: corral.envs.echo:EchoEnv\n"
        "base_image: corral-base:bookworm\nresources:\n  cpu: 1\n  memory: 512Mi\n"
        "concurrency:\n  max_sessions: 1024\n"
    )
    try:
        build_seconds, built = await timed(lambda: asyncio.to_thread(build_image, env))
    except Exception as exc:
        console.print(f"  docker: skipped, the image did not build ({exc})")
        return
    console.print(f"  docker: built {built.tag} in {build_seconds:.1f} s")
    async with DockerProvider() as docker:
        before = load()
        add("docker", "cold", await cold(docker, env, servers, sessions), before=before)
        before = load()
        fill, seconds = await warm(docker, env, servers, sessions)
        add("docker", "warm", seconds, f"(filling the warm pool took {fill:.2f} s)", before)


async def _ray(console: Console, servers: int, sessions: int, add: Any) -> None:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray

        from corral.providers.ray import RayProvider
    except ImportError as exc:
        console.print(f"  ray: skipped ({exc})")
        return
    from corral.envs.echo import EchoAction

    echo = "corral.envs.echo:EchoEnv"
    before = load()
    init, _ = await timed(
        lambda: asyncio.to_thread(
            ray.init, num_cpus=4, include_dashboard=False, log_to_driver=False,
            object_store_memory=80 * 2**20, configure_logging=False,
        )
    )  # fmt: skip
    add("ray", "ray.init (local, once per driver)", init, before=before)
    try:
        async with RayProvider(host="127.0.0.1", num_cpus=0.25) as rays:
            firsts = []
            for _ in range(3):
                before = load()

                async def first_reset() -> Endpoint:
                    endpoint = await rays.start(echo)
                    async with AsyncEnvClient(endpoint.url) as env:
                        await env.reset()
                        await env.step(EchoAction(message="x"))
                    return endpoint

                seconds, endpoint = await timed(first_reset)
                firsts.append(seconds)
                await rays.stop(endpoint)
            add("ray", "actor start → first reset (median of 3)", statistics.median(firsts),
                f"(min {min(firsts):.2f}, max {max(firsts):.2f})", before)  # fmt: skip
            before = load()
            add(
                "ray",
                "cold",
                await cold(rays, "corral.envs.echo:EchoEnv", servers, sessions),
                before=before,
            )
            before = load()
            fill, seconds = await warm(rays, "corral.envs.echo:EchoEnv", servers, sessions)
            add("ray", "warm", seconds, f"(filling the warm pool took {fill:.2f} s)", before)
            async with WarmPool(rays, echo, size=2) as spares:
                await spares.wait_full(timeout=600)
                acquires = []
                for _ in range(2):
                    seconds, endpoint = await timed(spares.acquire)
                    acquires.append(seconds)
                    await spares.release(endpoint)
                add("ray", "warm acquire (one server)", statistics.median(acquires), before=load())
    finally:
        ray.shutdown()


def markdown(
    env_rows: list[dict[str, Any]], provider_rows: list[dict[str, Any]], command: str
) -> str:
    lines = [
        "# Capacity figures",
        "",
        f"- Command: `{command}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {os.cpu_count()} logical cores; Python {sys.version.split()[0]}",
        "- Load average: the 1-minute figure before → after each measurement (shared machine).",
        "",
    ]
    if env_rows:
        lines += [
            "## Sessions per core and memory per session (one server process)",
            "",
            "| env | sessions | KiB/session | idle server MiB | env-steps per server CPU-s "
            "| env-steps/s | server CPU | load |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in env_rows:
            lines.append(
                f"| {r['env']} | {r['sessions']} | {r['kb_per_session']:.1f} | {r['idle_mb']:.0f} "
                f"| {r['steps_per_cpu_s']:,.0f} | {r['steps_per_s']:,.0f} | {r['server_cpu']:.2f} "
                f"| {r['load']} |"
            )
        lines.append("")
    if provider_rows:
        lines += [
            "## From nothing to the sessions ready, per provider",
            "",
            "| provider | what | seconds | note | load |",
            "|---|---|---:|---|---|",
        ]
        for r in provider_rows:
            lines.append(
                f"| {r['provider']} | {r['mode']} | {r['seconds']:.3g} | {r['note']} "
                f"| {r['load']} |"
            )
        lines.append("")
    return "\n".join(lines)


async def run(
    args: argparse.Namespace, console: Console
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    env_rows: list[dict[str, Any]] = []
    provider_rows: list[dict[str, Any]] = []
    if args.only in (None, "envs"):
        console.print("[bold]envs[/bold]")
        for case in cases(args.smoke):
            row = await size_env(case, 2.0 if args.smoke else 10.0)
            console.print(f"  {row}")
            env_rows.append(row)
    if args.only in (None, "providers"):
        console.print("[bold]providers[/bold]")
        provider_rows = await providers(args.smoke, console, set(args.providers.split(",")))
    return env_rows, provider_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity")
    parser.add_argument("--smoke", action="store_true", help="small sizes, a few seconds each")
    parser.add_argument("--only", choices=("envs", "providers"))
    parser.add_argument("--providers", default="local,docker,ray")
    parser.add_argument("--markdown", type=Path, help="write the tables to this file")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    env_rows, provider_rows = asyncio.run(run(args, console))
    command = "python -m benchmarks.capacity " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    text = markdown(env_rows, provider_rows, command.strip())
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

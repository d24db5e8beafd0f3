"""The server's CPU per env-step of a batched step, and where it goes.

    python -m benchmarks.batch_cpu                       # 256 and 1,024 sessions
    python -m benchmarks.batch_cpu --sessions 256 --profile /tmp/prof   # + py-spy
    git archive HEAD~1 src | tar -x -C /tmp/base
    python -m benchmarks.batch_cpu --against /tmp/base/src   # + that tree, in turns

One ``corral serve`` process (native transport) for the echo env; one ``EnvPool`` on one
connection steps all its sessions in lockstep batches (numpy reads). Server CPU is read
from ``/proc/<pid>/stat`` over the measured rounds and divided by the env-steps: the
figure the lean batch path (issue 10) is about. With ``--profile DIR`` the server is
sampled by ``py-spy`` (if installed) during a second pass, and its samples are summed by
layer (:func:`benchmarks.transport.layer_of` on the innermost frame).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks import servers
from benchmarks.envs import MESSAGE
from benchmarks.transport import cpu_s
from corral.client import EnvPool
from corral.envs.echo import EchoAction, EchoEnv


async def per_item(
    url: str, pid: int, sessions: int, rounds: int, seconds: float | None = None
) -> dict[str, float]:
    """Server CPU µs per env-step and env-steps/s over ``rounds`` batched steps (or
    for ``seconds``, when given)."""
    async with EnvPool(
        sessions,
        url,
        env=EchoEnv,
        progress=False,
        health_interval=None,
        sessions_per_connection=sessions,
        gc_control=True,
    ) as pool:
        await pool.reset()
        actions = [EchoAction(message=MESSAGE)] * sessions
        for _ in range(20):
            await pool.step(actions)
        cpu = cpu_s(pid)
        start = time.perf_counter()
        deadline = start + seconds if seconds is not None else None
        done = 0
        while done < rounds if deadline is None else time.perf_counter() < deadline:
            batch = await pool.step(actions)
            batch.obs, batch.rewards  # noqa: B018 - what a vectorised trainer reads
            done += 1
        elapsed = time.perf_counter() - start
        used = cpu_s(pid) - cpu
    steps = done * sessions
    return {"server_us": used / steps * 1e6, "steps_per_s": steps / elapsed, "steps": steps}


RATE = 250
"""py-spy samples per second (``--gil``: only while the server's code holds the GIL)."""


def _profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None
    return subprocess.Popen(
        [
            *(spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", str(RATE)),
            *("-f", "raw", "-o", str(out), "--nonblocking", "--gil"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def layers(raw: Path) -> dict[str, float]:
    """Share of the GIL-holding samples by layer of the innermost frame (py-spy ``raw``
    output); scaled to the CPU time ``/proc`` reports, they give µs per env-step (the
    kernel's share of TCP outside the GIL is spread over them)."""
    from benchmarks.transport import layer_of

    counts: dict[str, int] = defaultdict(int)
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or not n.isdigit():
            continue
        name, _, where = frames[-1].partition(" (")  # "name (file:line)"
        path = where.rsplit(":", 1)[0]
        layer = layer_of(path, name)
        if "asyncio/runners.py" in path:  # uvloop's own C code: the loop, picows parsing
            layer = "event loop + picows (C code under the loop)"
        counts[layer] += int(n)
    total = sum(counts.values()) or 1
    return {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}


async def run(
    sizes: list[int], rounds: int, repeats: int, profile: Path | None, against: Path | None
) -> None:
    args = ("corral.envs.echo:EchoEnv", "--transport", "native", "--max-sessions", "4096")
    contenders = {"this tree": await servers.corral_server(*args)}
    if against is not None:
        # Another source tree (e.g. ``git archive`` of the base commit) ahead on the path.
        env = {"PYTHONPATH": str(against)}
        contenders[f"{against}"] = await servers.corral_server(*args, env=env)
    try:
        for n in sizes:
            figures: dict[str, list[dict[str, float]]] = defaultdict(list)
            loads = []
            for _ in range(repeats):  # in turns, so a busy machine weighs on all alike
                for name, server in contenders.items():
                    loads.append(os.getloadavg()[0])
                    figures[name].append(
                        await per_item(server.url, server.pid, n, max(rounds * 256 // n, 20))
                    )
            load = sum(loads) / len(loads)
            for name, runs in figures.items():
                cpu = statistics.median(r["server_us"] for r in runs)
                rate = statistics.median(r["steps_per_s"] for r in runs)
                print(
                    f"{n:>5} sessions, {name}: server {cpu:.1f} µs/env-step, "
                    f"{rate:,.0f} env-steps/s (median of {repeats}; load {load:.2f})"
                )
            if profile is not None:
                server = contenders["this tree"]
                profile.mkdir(parents=True, exist_ok=True)
                out = profile / f"server-{n}.txt"
                spy = _profile(server.pid, 8, out)
                if spy is None:
                    print("py-spy not installed: no profile")
                    continue
                await asyncio.sleep(0.3)
                run = await per_item(server.url, server.pid, n, 0, seconds=7.4)
                spy.wait(60)
                if out.exists():
                    shares = layers(out)
                    for layer, share in shares.items():
                        us = share * run["server_us"]
                        print(f"    {layer:<50} {share * 100:5.1f} %  {us:5.1f} µs")
                    print(f"    {'total (/proc)':<50} {run['server_us']:13.1f} µs")
    finally:
        for server in contenders.values():
            await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--rounds", type=int, default=300, help="rounds at 256 sessions")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR")
    parser.add_argument(
        "--against", type=Path, default=None, metavar="SRC", help="also serve this source tree"
    )
    args = parser.parse_args(argv)
    asyncio.run(run(args.sessions, args.rounds, args.repeats, args.profile, args.against))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks``: run every comparison, print the tables, write RESULTS.md.

    python -m benchmarks                 # the full suite (several minutes)
    python -m benchmarks --smoke         # tiny sizes, a few seconds (run by `make test`)
    python -m benchmarks --only lockstep,payload --output /tmp/r.md

openenv-core (``pip install openenv-core==0.3.0``) is compared when installed; without
it its rows say so and the corral figures are still measured.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.metadata
import importlib.util
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks import batched, ceiling, density, fleet, measure, sandboxed, servers, slow
from benchmarks.measure import (
    PPO_BOUND,
    PPO_LOCAL,
    PPO_REMOTE,
    PPO_ROUND_TRIP_BYTES,
    PPO_SUBPROC,
)
from benchmarks.tables import Report
from benchmarks.tables import fmt as _f
from benchmarks.tables import ratio as _ratio
from corral import runtime

SECTIONS = (
    "ceiling",
    "lockstep",
    "batched",
    "scale",
    "payload",
    "startup",
    "ppo",
    "sandbox",
    "slow",
    "density",
    "fleet",
)
QUIET_LOAD = 1.0
"""The 1-minute load average a full run waits for (up to ``--wait-quiet`` seconds)."""
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "RESULTS.md"
PACKAGES = (
    "corral",
    "openenv-core",
    "websockets",
    "uvicorn",
    "fastapi",
    "pydantic",
    "msgpack",
    "orjson",
    "numpy",
    "uvloop",
)


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    cpu = platform.processor() or "unknown"
    with_model = Path("/proc/cpuinfo")
    if with_model.exists():
        for line in with_model.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kb = int(meminfo.read_text().split()[1])
        memory = f"{kb / 1024 / 1024:.1f} GiB"
    versions = []
    for name in PACKAGES:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return {
        "cpu": f"{cpu}, {os.cpu_count()} logical cores",
        "memory": memory,
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "event loop": runtime.loop_name(),
        "packages": ", ".join(versions),
    }


def lockstep_section(report: Report, result: dict[str, dict[str, float]]) -> dict[str, Any]:
    floor = result.get("websockets floor")
    openenv = result.get("openenv-core")
    rows = []
    for name, r in result.items():
        rows.append(
            [
                name,
                _f(r["p50_us"]),
                _f(r["p99_us"]),
                _f(r["steps_s"]),
                _ratio(r["p50_us"], floor["p50_us"] if floor else None),
            ]
        )
    corral = result["corral msgpack"]
    vs_floor = corral["p50_us"] / floor["p50_us"] if floor else None
    pfloor = result.get("picows floor")
    vs_picows = corral["p50_us"] / pfloor["p50_us"] if pfloor else None
    ws_client = result.get("corral msgpack, websockets client")
    aio_client = result.get("corral msgpack, asyncio client")
    vs_openenv = corral["steps_s"] / openenv["steps_s"] if openenv else None
    twin = result.get("corral msgpack, sync twin")
    sync_vs_async = twin.get("vs_async_interleaved") if twin else None
    notes = [
        f"corral msgpack p50 / websockets floor p50 = {_f(vs_floor, 2)}x (target ≤ 1.3x); "
        f"/ picows floor p50 = {_f(vs_picows, 2)}x (stretch ≤ 2x); "
        f"corral msgpack steps/s / openenv-core steps/s = {_f(vs_openenv, 2)}x.",
        "`corral msgpack` is what `pip install corral` gives: the native client transport "
        "(picows, replies dispatched from the frame callback); `asyncio client` is corral's "
        "own transport on asyncio's Protocol API (also callback-style; what the sync twin "
        "rides), p50 "
        f"{_ratio(aio_client['p50_us'] if aio_client else None, corral['p50_us'])} the native "
        "one's; `websockets client` is the websockets library on the same server, p50 "
        f"{_ratio(ws_client['p50_us'] if ws_client else None, corral['p50_us'])}. "
        "The floors are raw echo servers and clients of each library, no framework.",
        f"sync twin p50 / async client p50 = {_f(sync_vs_async, 2)}x (target ≤ 1.2x), the two "
        "stepping in turns step by step (the blocks of the table above see different "
        "moments of the machine): the blocking twin (`.sync()`) called from a plain thread, "
        "as a script calls it.",
        "Echo is a sync environment: corral runs it on the event loop while its steps "
        "stay fast (openenv-core hops to its thread pool for each); the `async env` rows "
        "serve the same echo with `async def` methods, awaited on the event loop.",
    ]
    report.add(
        "1. Lockstep, one session (echo, ~100-byte action and observation)",
        ["contender", "p50 µs", "p99 µs", "steps/s", "p50 vs floor"],
        rows,
        notes,
    )
    return {
        "vs_floor": vs_floor,
        "vs_picows": vs_picows,
        "vs_openenv": vs_openenv,
        "sync_vs_async": sync_vs_async,
    }


def batched_section(report: Report, result: dict[str, Any]) -> dict[str, Any]:
    rows = result["rows"]
    table = []
    for r in rows:
        best = max(r[m] for m in batched.MODES)
        table.append(
            [
                str(r["sessions"]),
                *(_f(r[m]) for m in batched.MODES),
                _f(r["openenv"]),
                _ratio(best, r["openenv"]),
            ]
        )
    lockstep_best = max(r[m] for r in rows for m in ("typed", "numpy"))
    pipelined_best = max(r["pipelined"] for r in rows)
    by_size = {r["sessions"]: r for r in rows}
    flat = None
    if 256 in by_size and 1024 in by_size:
        flat = min(by_size[1024][m] / by_size[256][m] for m in ("numpy", "pipelined"))
    soak = result["soak"]
    client0, client1 = soak["client_kb"]
    server0, server1 = soak["server_kb"]
    report.add(
        "2. Batched throughput, one server (echo)",
        [
            "sessions",
            "EnvPool typed /s",
            "EnvPool numpy /s",
            "EnvPool pipelined /s",
            "openenv-core /s",
            "best corral / openenv",
        ],
        table,
        [
            "Env-steps/s. typed: one `EnvPool.step()` per round (one `step_batch` frame per "
            "connection, a columnar reply), the typed observations read; numpy: the same, "
            "reading `batch.obs`/`rewards`/`dones` (no model built); pipelined: `send`/`recv` "
            "over two halves of the pool, one half stepping while the client handles the "
            "other. openenv-core: one async client per session, all stepping concurrently "
            "(its client builds typed observations).",
            f"Best lockstep-batched figure: {_f(lockstep_best)} env-steps/s (target ≥ 50,000); "
            f"pipelined: {_f(pipelined_best)} (stretch ≥ 100,000); 1,024 vs 256 sessions: "
            f"{_f(flat, 2)}x (flat: ≥ 0.9x).",
            f"Soak: {soak['rounds']:,} rounds of {soak['sessions']:,} sessions in "
            f"{soak['seconds']:.0f} s: client RSS {client0:,} → {client1:,} KB, server RSS "
            f"{server0:,} → {server1:,} KB.",
        ],
    )
    one = by_size.get(1)
    return {
        "best": lockstep_best,
        "pipelined": pipelined_best,
        "flat": flat,
        "one_vs_openenv": (
            max(one[m] for m in batched.MODES) / one["openenv"]
            if one is not None and one["openenv"]
            else None
        ),
        "rows": rows,
        "soak": soak,
    }


def ceiling_section(report: Report, result: dict[str, Any]) -> dict[str, Any]:
    lock = result["echo_lockstep"]
    rows = [["`EchoEnv.step`, one env", _f(lock["steps_s"]), _f(lock["p50_us"], 1)]]
    for n, r in result["echo_batched"].items():
        rows.append([f"{n} `EchoEnv` in a loop", _f(r["steps_s"]), "—"])
    for n, r in result["cartpole"].items():
        rows.append(
            [f"Gymnasium `SyncVectorEnv`, {n} CartPole-v1", _f(r["steps_s"] if r else None), "—"]
        )
    cliff = result["cliff"]
    for k, by_size in cliff.items():
        for n, rate in by_size.items():
            rows.append([f"{n} `EchoEnv`, each visit touching {k} records", _f(rate), "—"])
    small, large = next(iter(cliff.values()))
    flat = {k: by_size[large] / by_size[small] for k, by_size in cliff.items()}
    report.add(
        "0. In-process ceiling (no server, no wire)",
        ["loop", "env-steps/s", "p50 µs"],
        rows,
        [
            "The environments stepped directly in one process: what no remote framework can "
            "beat here. CartPole's step is numpy arithmetic; echo's builds pydantic models.",
            "The cache cliff (the control for the flatness target): the same loop, each "
            "visit also writing one field of each of k small records of its own session "
            "(about a cache line each, allocated one kind at a time for all sessions, as a "
            "server's per-session objects are); sizes and k alternate in each repeat. "
            f"{large:,} vs {small:,} sessions: "
            + ", ".join(f"k = {k}: {_f(r, 2)}x" for k, r in flat.items())
            + ".",
        ],
    )
    return {**result, "cliff_flat": flat}


def scale_section(report: Report, result: dict[str, Any]) -> dict[str, Any]:
    def row(name: str, r: dict[str, Any] | None) -> list[str]:
        if r is None:
            return [name, "—", "—", "—", "—", "—", "—"]
        return [
            name,
            _f(r["sessions"]),
            _f(r["open_s"], 1),
            _f(r["kb_per_session"], 1),
            _f(r["p50_us"]),
            _f(r["p99_us"]),
            _f(r["all_step_ms"], 1),
        ]

    notes = [
        "RSS per session = server RSS growth from idle to all sessions open and reset, / "
        "sessions. Step p50/p99: one extra session stepping in lockstep while all are open. "
        "Last column: one step of every open session (corral: one `EnvPool.step()`; "
        "openenv-core: every client at once).",
    ]
    failed = result.get("openenv_failed")
    if failed:
        notes.append(
            f"openenv-core at {failed['sessions']:,} sessions: {failed['reason']} — its row "
            "is the largest count it sustained in this run."
        )
    report.add(
        "3. Scale: concurrent sessions on one server process",
        [
            "contender",
            "sessions",
            "open s",
            "RSS KB/session",
            "step p50 µs",
            "step p99 µs",
            "step all ms",
        ],
        [row("corral", result["corral"]), row("openenv-core", result["openenv"])],
        notes,
    )
    return result


def payload_section(report: Report, result: dict[str, dict[str, float]]) -> dict[str, Any]:
    openenv = result.get("openenv-core")
    rows = [
        [
            name,
            _f(r["steps_s"]),
            _f(r["p50_us"]),
            _f(r["p99_us"]),
            _ratio(r["steps_s"], openenv["steps_s"] if openenv else None),
        ]
        for name, r in result.items()
    ]
    report.add(
        "4. 84x84x3 uint8 observation, lockstep",
        ["contender", "steps/s", "p50 µs", "p99 µs", "vs openenv-core"],
        rows,
        [
            "corral: an `Array(dtype='uint8', shape=(84, 84, 3))` field (raw bytes on msgpack, "
            "base64 on JSON); openenv-core: the same pixels as nested lists of ints, the JSON "
            "its models carry.",
        ],
    )
    corral = result["corral msgpack"]["steps_s"]
    return {"vs_openenv": corral / openenv["steps_s"] if openenv else None}


def startup_section(
    report: Report, result: dict[str, dict[str, float]], runs: int
) -> dict[str, Any]:
    rows = [
        [name, _f(r["median_s"], 2), _f(r["min_s"], 2), _f(r["max_s"], 2)]
        for name, r in result.items()
    ]
    openenv = result.get("openenv-core")
    ratio = openenv["median_s"] / result["corral"]["median_s"] if openenv else None
    report.add(
        f"5. Start-up: launching a local server to the first reset (median of {runs})",
        ["contender", "median s", "min s", "max s"],
        rows,
        [
            "corral: a LocalServer process launched from the benchmark's own interpreter "
            "(corral already imported) as a fresh interpreter (CORRAL_WARM_START=0), then a "
            "client's handshake and reset. corral, warm start: the same, the server a fork "
            "of the interpreter's template (started before, untimed). corral, fresh "
            "script: a new interpreter runs `AsyncEnvClient.from_env(...)` and `reset()`, "
            "timed from spawning it (its own imports included) to the reset's answer.",
            f"openenv-core / corral = {_f(ratio, 2)}x (higher is better for corral).",
        ],
    )
    return {"openenv_over_corral": ratio}


def ppo_section(report: Report, result: dict[str, dict[str, float]], steps: int) -> dict[str, Any]:
    local = result[PPO_LOCAL]["fps"]
    rows = [
        [name, _f(r["fps"]), _ratio(r["fps"], local), _f(r.get("step_us"))]
        for name, r in result.items()
    ]
    notes = [
        "SB3 PPO (MlpPolicy, 4 epochs, batch 256, torch on 1 thread) on a local "
        "DummyVecEnv of 8 CartPole-v1, and on 8 sessions of one local `corral serve "
        "gym:CartPole-v1` through `corral.adapters.sb3.RemoteVecEnv` (an EnvPool: one "
        "batch message per step). Training time is included, as a user sees it. "
        "Last column: one `step` of the VecEnv alone (fixed random actions, no policy).",
    ]
    bound = result.get(PPO_BOUND)
    if bound is not None:
        notes.append(
            "The bound is the local DummyVecEnv plus one round trip per step of "
            f"{PPO_ROUND_TRIP_BYTES} bytes over a blocking TCP socket to a bare echo server (an "
            "asyncio Protocol on uvloop in its own process, no WebSocket, no decoding): "
            "what any remote environment served from Python costs at least here, so the "
            "most a framework could reach; corral's gap to it is the framework."
        )
    local_step = result[PPO_LOCAL].get("step_us")
    remote_step = result[PPO_REMOTE].get("step_us")
    if local_step is not None and remote_step is not None:
        # Everything but the stepping (policy, rollout buffer, training) is the same
        # work on both sides; what a vec step may cost for 0.8x follows from it.
        per_vec_step = 8e6 / local
        rest = per_vec_step - local_step
        budget = per_vec_step / 0.8 - rest
        text = (
            f"Per vec step locally: {_f(per_vec_step)} µs, of which stepping {_f(local_step)} "
            f"µs and the rest (policy, buffer, training) {_f(rest)} µs. For 0.8x a remote "
            f"vec step may cost at most {_f(budget)} µs; it costs "
            f"{_f(remote_step)} µs (predicted ratio "
            f"{_f(per_vec_step / (rest + remote_step), 2)}x)."
        )
        bound_step = None if bound is None else bound.get("step_us")
        if bound_step is not None:
            text += (
                f" The bound's vec step costs {_f(bound_step)} µs, leaving "
                f"{_f(budget - bound_step)} µs for a framework's own work on both sides "
                "(decoding, routing, validation, encoding of 8 items and the reply)."
            )
        notes.append(text)
    report.add(
        f"6. PPO on 8 CartPole environments ({steps:,} env-steps per run)",
        ["contender", "env-steps/s", "vs local", "vec step alone µs"],
        rows,
        notes,
    )
    remote = result[PPO_REMOTE]["fps"]
    subproc = result.get(PPO_SUBPROC)
    notes.append(
        "What users pick instead: SB3's `SubprocVecEnv` (a process per environment, a pipe "
        "round trip to each per step; forkserver start) and Gymnasium's `AsyncVectorEnv` "
        "(a process per environment, observations in shared memory), which SB3 does not "
        "take as it is: `benchmarks.gym_vec.GymnasiumVecEnv` adapts it (its `SAME_STEP` "
        "autoreset, the final observations moved to SB3's infos). corral RemoteVecEnv / "
        f"SubprocVecEnv = {_ratio(remote, subproc['fps'] if subproc else None)}; / the "
        f"bound = {_ratio(remote, bound['fps'] if bound else None)}."
    )
    return {
        "remote_over_local": remote / local,
        "bound_over_local": None if bound is None else bound["fps"] / local,
        "over_subproc": None if subproc is None else remote / subproc["fps"],
        "over_bound": None if bound is None else remote / bound["fps"],
    }


def targets(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The issue's targets against this run's figures."""
    rows = []

    def add(what: str, measured: str, met: bool | None) -> None:
        rows.append([what, measured, "—" if met is None else ("yes" if met else "no")])

    lock = summary.get("lockstep")
    if lock:
        ratio = lock["vs_floor"]
        add(
            "lockstep p50 within 1.3x of the websockets floor",
            f"{_f(ratio, 2)}x",
            None if ratio is None else ratio <= 1.3,
        )
        twin = lock.get("sync_vs_async")
        add(
            "sync twin p50 within 1.2x of the async client",
            f"{_f(twin, 2)}x",
            None if twin is None else twin <= 1.2,
        )
        picows = lock.get("vs_picows")
        add(
            "stretch: lockstep p50 within 2x of the picows floor",
            f"{_f(picows, 2)}x",
            None if picows is None else picows <= 2.0,
        )
        vs = lock["vs_openenv"]
        add(
            "lockstep ahead of openenv-core",
            f"{_f(vs, 2)}x its steps/s",
            None if vs is None else vs > 1,
        )
    batch = summary.get("batched")
    if batch:
        add("batched ≥ 50,000 env-steps/s", f"{_f(batch['best'])}", batch["best"] >= 50_000)
        add(
            "stretch: pipelined ≥ 100,000 env-steps/s",
            f"{_f(batch['pipelined'])}",
            batch["pipelined"] >= 100_000,
        )
        flat = batch["flat"]
        # The cache-cliff control: the same two sizes in a bare loop over echo envs that
        # also touches k records per session (section 0).
        cliff = {k: r for k, r in (summary.get("ceiling") or {}).get("cliff_flat", {}).items() if k}
        control = (
            f" (a bare loop touching {' / '.join(map(str, cliff))} records per session: "
            f"{' / '.join(f'{_f(r, 2)}x' for r in cliff.values())})"
            if cliff
            else ""
        )
        add(
            "flat from 256 to 1,024 sessions (≥ 0.9x)",
            f"{_f(flat, 2)}x{control}",
            None if flat is None else flat >= 0.9,
        )
        one = batch["one_vs_openenv"]
        add(
            "batched with one session ahead of openenv-core",
            f"{_f(one, 2)}x",
            None if one is None else one > 1,
        )
        soak = batch["soak"]
        growth = soak["client_kb"][1] - soak["client_kb"][0]
        add(
            "client RSS flat over the soak (< 10 MB growth)",
            f"{growth:+,} KB",
            growth < 10_240,
        )
        ahead = [
            r["openenv"] is not None and max(r[m] for m in batched.MODES) > r["openenv"]
            for r in batch["rows"]
        ]
        known = [r for r in batch["rows"] if r["openenv"] is not None]
        add(
            "batched ahead of openenv-core at every size",
            f"{sum(ahead)} of {len(known)} sizes",
            None if not known else all(ahead),
        )
    sc = summary.get("scale")
    if sc:
        c = sc["corral"]
        add("≥ 10,000 sessions on one server", f"{c['sessions']:,}", c["sessions"] >= 10_000)
        add("≤ 20 KB per session", f"{_f(c['kb_per_session'], 1)} KB", c["kb_per_session"] <= 20)
        oe = sc.get("openenv")
        if oe and oe["sessions"] < c["sessions"]:
            add(
                "more sessions than openenv-core sustains",
                f"{c['sessions']:,} vs {oe['sessions']:,}",
                True,
            )
        elif oe:
            add(
                f"at {c['sessions']:,} sessions: less memory, faster open, lower step p99 "
                "than openenv-core",
                f"{_f(c['kb_per_session'], 1)} vs {_f(oe['kb_per_session'], 1)} KB, "
                f"{_f(c['open_s'], 1)} vs {_f(oe['open_s'], 1)} s, "
                f"{_f(c['p99_us'])} vs {_f(oe['p99_us'])} µs",
                c["kb_per_session"] < oe["kb_per_session"]
                and c["open_s"] < oe["open_s"]
                and c["p99_us"] < oe["p99_us"],
            )
    pay = summary.get("payload")
    if pay:
        vs = pay["vs_openenv"]
        add(
            "84x84x3 observations ahead of openenv-core",
            f"{_f(vs, 2)}x",
            None if vs is None else vs > 1,
        )
    ppo = summary.get("ppo")
    if ppo:
        r, bound = ppo["remote_over_local"], ppo.get("bound_over_local")
        shown = f"{_f(r, 2)}x" if bound is None else f"{_f(r, 2)}x (bound {_f(bound, 2)}x)"
        add("PPO on 8 remote CartPole sessions ≥ 0.8x local", shown, r >= 0.8)
        subproc, over_bound = ppo.get("over_subproc"), ppo.get("over_bound")
        add(
            "PPO: corral RemoteVecEnv ≥ 1.6x SB3 SubprocVecEnv",
            f"{_f(subproc, 2)}x",
            None if subproc is None else subproc >= 1.6,
        )
        add(
            "PPO: corral RemoteVecEnv ≥ 0.85x the bare-round-trip bound",
            f"{_f(over_bound, 2)}x",
            None if over_bound is None else over_bound >= 0.85,
        )
    for name, section_targets in (
        ("sandbox", sandboxed.targets),
        ("slow", slow.targets),
        ("density", density.targets),
    ):
        if summary.get(name):
            for what, measured, met in section_targets(summary[name]):
                add(what, measured, met)
    up = summary.get("startup")
    if up:
        r = up["openenv_over_corral"]
        add(
            "start-up ahead of openenv-core",
            f"openenv-core takes {_f(r, 2)}x as long",
            None if r is None else r > 1,
        )
    return ["target", "measured", "met"], rows


async def run(
    settings: measure.Settings, only: list[str], console: Console, patience: float = 0.0
) -> tuple[Report, dict[str, Any]]:
    """Run the chosen sections; return the report and the summary figures.

    Sections run one after the other, except at smoke sizes: there nothing is timed
    for real, so they run concurrently to keep the smoke run short. With ``patience``,
    each section after the first also waits (up to ``patience`` seconds) for the load an
    earlier one left to settle: the sandbox section ends at a 1-minute load of ~10, and
    the slow sessions after it measured 1.28 D at N = 100,000 where they measure 1.04 D
    on a settled machine.
    """
    log: Callable[[str], None] = lambda text: console.print(f"[dim]{text}[/dim]")  # noqa: E731
    measurements = {
        "ceiling": ceiling.ceiling,
        "lockstep": measure.lockstep,
        "batched": batched.batched,
        "scale": measure.scale,
        "payload": measure.payload,
        "startup": measure.startup,
        "ppo": measure.ppo,
        "sandbox": sandboxed.sandboxed,
        "slow": slow.slow,
        "density": density.density,
        "fleet": fleet.fleet,
    }
    chosen = [name for name in SECTIONS if name in only]
    if settings.openenv:
        from benchmarks.envs import openenv_models

        openenv_models()  # a multi-second import: never inside a timed or timeout-bound call
    if settings.smoke:
        # Every section finishes (and stops its servers) even when another one fails;
        # the echo servers are one corral and one openenv-core process for them all.
        async with servers.sharing():
            values = await asyncio.gather(
                *(measurements[n](settings, log) for n in chosen), return_exceptions=True
            )
        failure = next((v for v in values if isinstance(v, BaseException)), None)
        if failure is not None:
            raise failure
        results = dict(zip(chosen, values, strict=True))
        loads = {name: None for name in chosen}
    else:
        results, loads = {}, {}
        for name in chosen:
            if name != chosen[0]:
                await asyncio.to_thread(wait_quiet, patience, console)
            before = os.getloadavg()[0]
            results[name] = await measurements[name](settings, log)
            loads[name] = (before, os.getloadavg()[0])
    report = Report()
    summary: dict[str, Any] = {}
    formatters = {
        "ceiling": ceiling_section,
        "lockstep": lockstep_section,
        "batched": batched_section,
        "scale": scale_section,
        "payload": payload_section,
        "startup": lambda r, v: startup_section(r, v, settings.startup_repeats),
        "ppo": lambda r, v: ppo_section(r, v, settings.ppo_steps),
        "sandbox": sandboxed.section,
        "slow": slow.section,
        "density": density.section,
        "fleet": fleet.section,
    }
    for name in chosen:
        summary[name] = formatters[name](report, results[name])
        load = loads[name]
        report.sections[-1][3].append(
            "Load average (1 min) during this section: "
            + ("not recorded (smoke run)" if load is None else f"{load[0]:.2f} → {load[1]:.2f}")
        )
    header, rows = targets(summary)
    report.add("Targets", header, rows, [])
    return report, summary


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections of {', '.join(SECTIONS)}",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"where to write the Markdown report (default {DEFAULT_OUTPUT}; "
        "--smoke writes none unless given)",
    )
    parser.add_argument("--no-openenv", action="store_true", help="skip openenv-core")
    parser.add_argument(
        "--slow-cases",
        default=None,
        metavar="NxD,...",
        help="section 8's cases only: sessions x delay in s, e.g. 10000x1 (default: "
        "10000x1,100000x10; the smoke run's own otherwise)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"wait up to SECONDS for the 1-minute load average to fall below {QUIET_LOAD} "
        "before timing (default: 1200 for a full run, 0 with --smoke); the load is recorded "
        "either way",
    )
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    has_openenv = importlib.util.find_spec("openenv") is not None and not args.no_openenv
    settings = measure.Settings.for_run(args.smoke, has_openenv)
    if args.slow_cases is not None:
        try:
            settings.slow_cases = [
                (int(n), float(d))
                for n, d in (case.split("x") for case in args.slow_cases.split(","))
            ]
        except ValueError:
            parser.error(f"--slow-cases takes NxD pairs (10000x1), not {args.slow_cases!r}")
    console = Console(stderr=False)
    patience = args.wait_quiet if args.wait_quiet is not None else (0 if args.smoke else 1200)
    quiet = wait_quiet(patience, console)
    load_before = os.getloadavg()
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    report, _ = runtime.run(run(settings, only, console, patience))
    elapsed = time.perf_counter() - t0
    load_after = os.getloadavg()
    report.print(console)
    output = args.output if args.output is not None else (None if args.smoke else DEFAULT_OUTPUT)
    if output is not None:
        given = argv if argv is not None else sys.argv[1:]
        command = "python -m benchmarks" + (f" {shlex.join(given)}" if given else "")
        output.write_text(
            results_markdown(
                report, command, started, elapsed, load_before, load_after, settings, quiet
            )
        )
        console.print(f"wrote {output}")
    return 0


def wait_quiet(patience: float, console: Console) -> str:
    """Wait up to ``patience`` seconds for a quiet machine; say how it went."""
    if patience <= 0:
        return ""
    start = time.monotonic()
    load = os.getloadavg()[0]
    while load >= QUIET_LOAD and time.monotonic() - start < patience:
        console.print(f"[dim]waiting for a quiet machine: 1-minute load {load:.2f}[/dim]")
        time.sleep(min(15.0, max(0.0, patience - (time.monotonic() - start))))
        load = os.getloadavg()[0]
    waited = time.monotonic() - start
    if load < QUIET_LOAD:
        return f"waited {waited:.0f} s for the 1-minute load to fall below {QUIET_LOAD:g}"
    return (
        f"waited {waited:.0f} s and the 1-minute load stayed at {load:.2f} "
        f"(≥ {QUIET_LOAD:g}): figures from a busy machine"
    )


def results_markdown(
    report: Report,
    command: str,
    started: dt.datetime,
    elapsed: float,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    settings: measure.Settings,
    quiet: str = "",
) -> str:
    """RESULTS.md: how the figures were obtained, then the tables."""
    info = machine()
    lines = [
        "# Benchmark results",
        "",
        f"- Command: `{command}` ({'smoke sizes' if settings.smoke else 'full sizes'}, "
        f"{elapsed:.0f} s)",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC",
        f"- Machine: {info['cpu']}, {info['memory']} RAM, {info['os']}",
        f"- Python: {info['python']}; event loop for every client and server: {info['event loop']}",
        f"- Packages: {info['packages']}",
        f"- Load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in load_before)}; "
        f"after: {' / '.join(f'{x:.2f}' for x in load_after)} (the machine is shared: other "
        "work ran during the measurement)" + (f"; {quiet}" if quiet else ""),
        f"- Each figure is the median of {settings.repeats} runs "
        f"({settings.lockstep_steps:,} lockstep steps or 10 s, whichever comes first, after "
        f"{settings.warmup} warm-up steps; "
        f"{settings.batched_seconds:g} s per batched point); contenders alternate within a "
        "run. Servers are separate processes on 127.0.0.1, clients run in the benchmark "
        "process.",
        "",
        report.markdown(),
    ]
    return "\n".join(lines)

"""The chaos test of issue 29: no routine fleet event loses or repeats a step.

Real parts only: Debian's nginx in front of two ``corral serve`` processes of a
snapshottable environment (``TallyEnv``), Debian's HAProxy in front of two of a
replay-only one (``CounterEnv``), every server sharing a fleet key and draining on
SIGTERM. Two pools (``[door] * 2`` each) step all their sessions while a script, in a
thread, does to the fleet what a cluster does in a day: cuts every connection through
each door, restarts every server one after another (SIGTERM: drain, exit, start again on
the same port), and SIGKILLs one server mid-step.

Every step is checked exactly: each session's count must be its previous count plus
one (or 0 on the step after an episode ended), so a lost step or one applied twice
shows at once. Truncated episodes and how sessions moved are counted (the ``figures``
fixture; ``make test-long`` writes them to fault-report.json). Bounded (N=32 per pool)
by default; ``--long`` runs N=256.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tests.faults.conftest import Scale
from tests.support.envs import CountAction, CounterEnv
from tests.support.figures import Figures
from tests.support.frontdoor import FrontDoor, ServerProcesses, require
from tests.support.snapshot_envs import TallyAction, TallyEnv

from corral.client import EnvPool

pytestmark = pytest.mark.xdist_group("chaos")


class Ledger:
    """What each session's next count must be, checked on every step."""

    def __init__(self, n: int, field: str) -> None:
        self.field = field
        self.expected = [0] * n
        self.ended = [False] * n
        self.steps = 0
        self.truncated = 0
        self.reasons: list[str] = []
        self.wrong: list[tuple[int, int, int]] = []
        """(session, expected, got): a step lost (lower) or applied twice (higher)."""

    def check(self, batch: Any) -> None:
        counts = batch.obs[self.field].tolist()
        for k, index in enumerate(batch.ids.tolist()):
            want = 0 if self.ended[index] else self.expected[index] + 1
            if batch.truncated[k]:
                self.truncated += 1
                self.reasons.append(str(batch.infos[k].get("corral")))
                self.expected[index], self.ended[index] = 0, True  # NEXT_STEP: a reset next
                continue
            if counts[k] != want:
                self.wrong.append((index, want, counts[k]))
            self.expected[index] = counts[k]
            self.ended[index] = bool(batch.terminated[k])
        self.steps += len(batch)


async def drive(pool: EnvPool, action: Any, ledger: Ledger, stop: threading.Event) -> None:
    await pool.reset(seed=list(range(pool.n)))
    actions = [action] * pool.n
    while not stop.is_set():
        ledger.check(await pool.step(actions))


def rolling(fleet: ServerProcesses, doors: list[FrontDoor], rng: random.Random) -> list[str]:
    """Restart every server of ``fleet`` in turn (SIGTERM: drain, the sessions move,
    exit; then the same port again), cutting a door now and then; what was done."""
    done = []
    for index in range(len(fleet)):
        fleet.restart(index)
        done.append(f"restart {fleet[index].id}")
        if rng.random() < 0.5:
            door = doors[rng.randrange(len(doors))]
            door.cut()
            done.append(f"cut {door.kind}")
        time.sleep(rng.uniform(0.2, 0.6))
    return done


def chaos(tally: ServerProcesses, counter: ServerProcesses, doors: list[FrontDoor]) -> list[str]:
    """The fleet's day: cuts, both fleets' rolling restarts side by side, one SIGKILL
    mid-step; what was done."""
    done: list[str] = []
    time.sleep(1.0)  # the pools are stepping
    for door in doors:
        door.cut()
        done.append(f"cut {door.kind}")
    time.sleep(0.5)
    with ThreadPoolExecutor(2) as threads:
        runs = [
            threads.submit(rolling, fleet, doors, random.Random(seed))
            for seed, fleet in enumerate((tally, counter))
        ]
        for run in runs:
            done += run.result()
    victim = counter[random.Random(29).randrange(len(counter))]
    victim.kill()  # the pools never stop stepping: mid-step
    done.append(f"SIGKILL {victim.id}")
    time.sleep(1.0)
    victim.start()
    time.sleep(0.5)
    return done


async def test_no_fleet_event_loses_or_repeats_a_step(
    tmp_path: Path, scale: Scale, figures: Figures, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("nginx")
    require("haproxy")
    n = scale.pick(32, 256)
    monkeypatch.setenv("CORRAL_DRAIN_SECONDS", "20")
    monkeypatch.setenv("CORRAL_FLEET_KEY", "chaos-test-fleet-key-0123456789abcdef")
    args = ["--max-sessions", "4096", "--log-level", "warning"]
    tally = ServerProcesses("tests.support.snapshot_envs:TallyEnv", 2, tmp_path, args)
    counter = ServerProcesses("tests.support.envs:CounterEnv", 2, tmp_path, args, "c")
    with (
        ServerProcesses.together(tally, counter),
        FrontDoor("nginx", tally.backends(), tmp_path) as nginx,
        FrontDoor("haproxy", counter.backends(), tmp_path) as haproxy,
    ):
        pools = [
            EnvPool(n, [nginx.url] * 2, env=TallyEnv, progress=False, seed=1),
            EnvPool(n, [haproxy.url] * 2, env=CounterEnv, progress=False, seed=2),
        ]
        ledgers = [Ledger(n, "count"), Ledger(n, "total")]
        stop = threading.Event()
        async with pools[0], pools[1]:
            spreads = [pool.stats()["servers"] for pool in pools]
            runs = [
                asyncio.ensure_future(drive(pools[0], TallyAction(add=1), ledgers[0], stop)),
                asyncio.ensure_future(drive(pools[1], CountAction(amount=1), ledgers[1], stop)),
            ]
            started = time.monotonic()
            try:
                done = await asyncio.to_thread(chaos, tally, counter, [nginx, haproxy])
            finally:
                stop.set()
                await asyncio.gather(*runs)
            took = time.monotonic() - started
            stats = [pool.stats() for pool in pools]
    for name, ledger, stat, spread in zip(
        ("snapshottable", "replay_only"), ledgers, stats, spreads, strict=True
    ):
        figures[f"{name}_sessions"] = n
        figures[f"{name}_steps"] = ledger.steps
        figures[f"{name}_lost_or_repeated"] = len(ledger.wrong)
        figures[f"{name}_truncated"] = ledger.truncated
        figures[f"{name}_truncated_why"] = ledger.reasons[:3]
        figures[f"{name}_restored_by_snapshot"] = stat["restored_by_snapshot"]
        figures[f"{name}_restored_by_replay"] = stat["restored_by_replay"]
        figures[f"{name}_reopened"] = stat["reopened"]
        figures[f"{name}_initial_spread"] = spread
    figures["events"] = done
    figures["seconds"] = round(took, 1)
    for ledger in ledgers:
        assert ledger.wrong == [], ledger.wrong[:10]
        assert ledger.truncated == 0
        assert ledger.steps > 0
    for spread in spreads:
        assert sorted(spread.values()) == [n // 2, n // 2], spread
    assert stats[0]["restored_by_snapshot"] > 0  # the drains moved Tally's by snapshot
    assert stats[1]["restored_by_replay"] > 0  # Counter's by replay, SIGKILL included
    assert stats[1]["restored_by_snapshot"] == 0

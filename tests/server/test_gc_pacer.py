"""The server's garbage-collection pacer: collections at ticks, freezes after waves of
resets and opens (and during long ones)."""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass
from typing import Any

import pytest

from corral.server.gc_pacer import GcPacer


@dataclass
class Counters:
    resets: int = 0
    opened: int = 0
    steps: int = 0
    frames: int = 0


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def pacer():
    stats = Counters()
    # A CPU clock that never moves: no pass costs anything, the count rules alone decide.
    pacer = GcPacer(stats, gen0=100, tick_s=3600, wave=8, long_wave=1000, cpu=lambda: 0.0)
    yield pacer
    pacer.stop()
    gc.unfreeze()
    gc.enable()


async def test_collection_runs_at_ticks_only(pacer):
    pacer.start()
    assert not gc.isenabled()
    node = Node()
    alive = weakref.ref(node)
    del node
    for _ in range(5000):  # far past any threshold: nothing collects by itself
        [object() for _ in range(3)]
    assert alive() is not None
    for _ in range(200):  # a full pass comes within 100 ticks
        _ = [Node() for _ in range(120)]
        pacer.tick()
    assert alive() is None
    assert pacer.passes[0] > 0 and pacer.passes[2] >= 1


async def test_a_reset_wave_is_frozen_once_it_ends(pacer):
    pacer.start()
    frozen = gc.get_freeze_count()
    pacer.stats.resets += 20
    pacer.tick()  # the wave is still going
    assert pacer.freezes == 0
    kept = [Node() for _ in range(50)]  # what the wave built
    pacer.tick()  # no new reset since the last tick: the wave ended
    assert pacer.freezes == 1 and gc.get_freeze_count() > frozen
    pacer.tick()
    assert pacer.freezes == 1  # nothing new to freeze
    assert kept


async def test_every_tenth_wave_unfreezes_so_closed_sessions_are_freed(pacer):
    pacer.start()
    node = Node()
    alive = weakref.ref(node)
    for wave in range(9):
        pacer.stats.resets += 10
        pacer.tick()
        pacer.tick()
        if wave == 0:
            del node  # frozen with the first wave, then dropped: a session closed
    assert pacer.freezes == 9 and alive() is not None
    pacer.stats.resets += 10
    pacer.tick()
    pacer.tick()
    assert pacer.freezes == 10 and alive() is None


async def test_stop_gives_collection_back(pacer):
    pacer.start()
    pacer.stop()
    assert gc.isenabled()


async def test_a_wave_of_opens_is_frozen_like_one_of_resets(pacer):
    pacer.start()
    pacer.stats.opened += 20
    pacer.tick()
    assert pacer.freezes == 0
    pacer.tick()
    assert pacer.freezes == 1


async def test_a_long_wave_is_frozen_while_it_goes_on(pacer):
    """A pool opening 100,000 sessions never pauses for a tick: what it built so far is
    frozen every ``long_wave`` opens, so later passes do not scan it again."""
    pacer.start()
    for _ in range(5):
        pacer.stats.opened += 300
        pacer.tick()
    assert pacer.freezes == 1  # 1,500 opens: one freeze past 1,000, none while short
    pacer.stats.opened += 300
    pacer.tick()
    assert pacer.freezes == 1


class CpuClock:
    """The loop thread's CPU clock, where a pass of generation ``g`` takes ``cost[g]`` s."""

    def __init__(self, *cost: float) -> None:
        self.now = 0.0
        self.cost = cost

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        """A wall clock for a loop thread on the CPU a tenth of the time: every tick is
        quiet, the share rule alone decides."""
        return self.now * 10

    def collected(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            self.now += self.cost[info["generation"]]


@pytest.fixture
def clock():
    clock = CpuClock(0.01, 0.2, 1.0)
    gc.callbacks.append(clock.collected)
    yield clock
    gc.callbacks.remove(clock.collected)
    gc.unfreeze()
    gc.enable()


async def test_passes_take_at_most_their_share_of_the_cpu(clock):
    """A pass that took 10 ms of CPU is not repeated before the thread spent 200 ms more:
    a heap of live objects that are no garbage is not scanned over and over."""
    pacer = GcPacer(Counters(), gen0=1, tick_s=3600, share=0.05, cpu=clock, wall=clock.wall)
    pacer.start()
    kept = []
    for _ in range(100):  # 1 s of CPU in 10 ms steps, allocating all along
        kept.append([Node() for _ in range(10)])
        pacer.tick()
        clock.now += 0.01
    pacer.stop()
    assert 4 <= pacer.passes[0] <= 5  # one every 10 + 200 ms
    assert pacer.passes[1:] == [0, 0]  # the escalation waits for its count of passes


async def test_a_due_escalation_waits_for_its_generations_share(clock):
    pacer = GcPacer(Counters(), gen0=1, tick_s=3600, share=0.05, cpu=clock, wall=clock.wall)
    pacer.start()

    def tick(after: float) -> None:
        _ = [Node() for _ in range(10)]
        pacer.tick()
        clock.now += after

    for _ in range(10):  # the tenth pass is a middle one (200 ms: the next in 4 s)
        tick(0.25)
    assert pacer.passes == [9, 1, 0]
    for _ in range(10):  # ten young passes within 2.5 s: the middle one waits
        tick(0.21)
    assert pacer.passes == [19, 1, 0]
    clock.now += 4.0
    tick(0.0)
    pacer.stop()
    assert pacer.passes == [19, 2, 0]


class Clocks:
    """A loop thread's CPU clock and the wall clock, moved by hand."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0

    def busy(self, seconds: float) -> None:
        """The loop worked ``seconds`` on end (a burst of frames, a round's replies)."""
        self.cpu += seconds
        self.wall += seconds

    def idle(self, seconds: float) -> None:
        """The loop waited ``seconds`` (its steps await their delay)."""
        self.wall += seconds

    def pacer(self, stats: Counters | None = None, **knobs: Any) -> GcPacer:
        return GcPacer(
            stats or Counters(),
            tick_s=0.05,
            cpu=lambda: self.cpu,
            wall=lambda: self.wall,
            **knobs,
        )


@pytest.fixture
def clocks():
    yield Clocks()
    gc.unfreeze()
    gc.enable()


async def test_a_due_pass_waits_for_a_quiet_tick(clocks):
    """A pass due in the middle of a burst runs once the burst is over, in the idle
    stretch after it, not inside it (where it delays the burst's last step)."""
    pacer = clocks.pacer(gen0=100)
    pacer.start()
    kept = []
    for _ in range(5):  # a burst: allocating, the thread on the CPU all along
        kept.append([Node() for _ in range(200)])
        clocks.busy(0.05)
        pacer.tick()
    assert pacer.passes == [0, 0, 0]
    clocks.busy(0.01)
    clocks.idle(0.04)  # the burst ended 10 ms into this tick
    pacer.tick()
    pacer.stop()
    assert pacer.passes == [1, 0, 0]
    assert kept


async def test_traffic_makes_a_tick_busy_whatever_the_cpu(clocks):
    """On a machine so loaded that the loop gets a fraction of a core, its CPU share
    reads low while it works: frames arriving and steps finishing say it works."""
    stats = Counters()
    pacer = clocks.pacer(stats, gen0=100)
    pacer.start()
    kept = []
    for tick in range(6):
        kept.append([Node() for _ in range(200)])
        clocks.busy(0.005)
        clocks.idle(0.045)
        if tick % 2:
            stats.frames += 10  # a lockstep round's frames arrive
        else:
            stats.steps += 10_000  # its steps finish
        pacer.tick()
    assert pacer.passes == [0, 0, 0]
    clocks.idle(0.05)
    pacer.tick()
    pacer.stop()
    assert pacer.passes == [1, 0, 0]


async def test_past_its_bound_the_young_generation_waits_for_quiet_not_its_share(clocks):
    """Past ``ceiling`` objects (or as many as the frozen heap, when more) a young pass
    no longer waits for its share of the CPU, only for a quiet tick: a burst is never
    cut into, and the pass after it scans what the burst left, not what rounds left."""
    # A young pass costs a second of CPU here: the share rule alone would wait 20 s.
    heap = 3000  # frozen objects: the bound is the larger of the two
    pacer = clocks.pacer(gen0=100, ceiling=2000, share=0.05, frozen=lambda: heap)
    pacer._due[0] = 1e9
    pacer._young = 9  # a middle pass would be next, were it not past the bound
    pacer.start()
    bound = heap
    node = Node()
    alive = weakref.ref(node)
    del node
    kept = []
    while gc.get_count()[0] < bound - 1000:  # below the bound: the share decides
        kept.append([Node() for _ in range(100)])
        clocks.idle(0.05)
        pacer.tick()
    assert pacer.passes == [0, 0, 0]
    while gc.get_count()[0] < bound + 1000:  # past it, in a burst: not yet
        kept.append([Node() for _ in range(100)])
        clocks.busy(0.001)
        pacer.tick()
    assert pacer.passes == [0, 0, 0]
    clocks.idle(0.05)
    pacer.tick()
    pacer.stop()
    assert pacer.passes == [1, 0, 0]
    assert alive() is None


async def test_the_frozen_heap_is_counted_at_freezes_not_at_ticks(clocks):
    """CPython counts frozen objects by walking them (27 ms for 3 million): the pacer
    asks once per freeze, never per tick, however long the young generation stays
    past its bound (asked every 50 ms tick, it took half of a 100,000-session server's
    CPU)."""
    asked = []

    def frozen() -> int:
        asked.append(1)
        return 10**9  # a heap larger than any young generation here: no forced pass

    pacer = clocks.pacer(gen0=100, ceiling=200, share=0.05, frozen=frozen)
    pacer._due[0] = 1e9  # the share rule holds every pass off
    pacer.start()
    kept = []
    for _ in range(50):
        kept.append([Node() for _ in range(100)])
        clocks.idle(0.05)
        pacer.tick()
    young = gc.get_count()[0]
    pacer.stop()
    assert young > 200 and pacer.passes == [0, 0, 0]
    assert len(asked) == 1 + pacer.freezes


async def test_a_loop_never_quiet_collects_after_its_patience(clocks):
    """A server that is never idle does not wait for a quiet tick past ``patience``:
    its passes, escalations included, run as they come due."""
    pacer = clocks.pacer(gen0=100, patience=0.42)
    pacer.start()
    pacer._young = 9
    kept = []
    for _ in range(8):  # 400 ms busy: still waiting
        kept.append([Node() for _ in range(200)])
        clocks.busy(0.05)
        pacer.tick()
    assert pacer.passes == [0, 0, 0]
    clocks.busy(0.05)
    pacer.tick()  # 450 ms without a quiet tick
    pacer.stop()
    assert pacer.passes == [0, 1, 0]


async def test_a_wave_is_frozen_at_a_quiet_tick_only(clocks):
    """The client that reset a wave of sessions steps them next: the wave's freeze (a
    pass over what it built) waits for that burst to end."""
    stats = Counters()
    pacer = clocks.pacer(stats, gen0=10**9, wave=8)
    pacer.start()
    stats.resets += 20
    clocks.busy(0.05)
    pacer.tick()
    clocks.busy(0.05)  # no new reset, but the loop is stepping: not yet
    stats.frames += 1
    pacer.tick()
    assert pacer.freezes == 0
    clocks.idle(0.05)
    pacer.tick()
    pacer.stop()
    assert pacer.freezes == 1

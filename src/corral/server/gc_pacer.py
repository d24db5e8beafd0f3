"""Garbage collection paced by the server: between pieces of work, never inside one.

CPython collects its young generation whenever allocations pass a threshold — in the
middle of whatever runs then, a batch of 1,024 steps included, and each pass scans every
object allocated since (issue 10 measured 28% of a batched server's samples there).
A server process instead turns automatic collection off and runs it itself from a loop
timer (:class:`GcPacer`), so a collection happens between callbacks, never within the
synchronous stretch of a frame or a batch:

* every ``tick_s`` it checks the young generation's count and collects it past
  ``gen0`` allocations, escalating to the middle generation every 10th pass and to a full
  collection every 100th (CPython's own ratios);
* each generation's passes take at most ``share`` of the loop thread's CPU: after a pass
  of generation ``g`` that took ``t`` CPU seconds, ``g`` is not collected again before
  the thread has spent ``t / share`` more (a pass due meanwhile collects a younger
  generation, or waits). A server stepping 100,000 sessions whose steps wait seconds
  holds millions of live objects that are no garbage (their tasks, timers, frames): a
  pass scans every one of them, and a full pass every 100th tick took a second of every
  few (issue 34). The bound keeps the collector's share whatever the heap, and its
  spacing grows with the heap, as CPython's own rule (a full pass only once the heap
  grew by a quarter) does;
* a due pass waits for a *quiet* tick: one since the last of which no frame arrived,
  no step, reset or open finished, and the loop thread spent at most ``quiet`` of the
  wall time on the CPU. A server answering a lockstep round of 10,000 slow steps (ten
  1,000-item frames in, ten replies out a delay later) is busy for a few hundred
  milliseconds at each end of the delay and idle in between: a pass inside either burst
  delays the round's last step, the one its caller waits for (issue 34), while the same
  pass in the idle stretch costs nobody anything. At 100,000 sessions the objects a
  round's start leaves waiting (10 to 20 a step: its task, coroutine, timer, action...)
  number over a million; young passes inside that burst scanned them on its critical
  path, one pass in the wait after it scans them off it. A loop that has not been quiet
  for ``patience`` seconds (a server that is never idle) collects as if it were. When
  the young generation holds more than ``ceiling`` objects or as many as the frozen
  heap, whichever is more, a settled tick collects it whatever the share: put off by the
  share rule alone, one young pass of a server holding 100,000 sessions scanned what
  several rounds had left (12 s at load 13);
* after a *wave* of opens and resets (at least ``wave`` of them, then a quiet tick without
  any), the objects the wave built — environments, sessions, their first observations —
  are long-lived: it freezes them (``gc.freeze()``) so no later pass scans them again. A
  wave that goes on (a pool opening 100,000 sessions) is frozen every ``long_wave`` opens
  and resets, so the passes it triggers do not scan everything it built so far again and
  again. Every 10th freeze it unfreezes, collects fully and freezes again, so objects of
  sessions closed since are freed and memory stays bounded over a long run.

``CORRAL_GC=default`` leaves CPython's collector as it is.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Callable
from typing import Protocol


class ServerCounts(Protocol):
    """What the pacer reads: the server's counts of resets, opened sessions, steps and
    frames received so far."""

    resets: int
    opened: int
    steps: int
    frames: int


class GcPacer:
    """Runs the garbage collector from the event loop (see the module docstring).

    Args:
        stats: the server's counters (what was opened, reset, stepped and received).
        gen0: young-generation allocations before a pass.
        tick_s: how often to look.
        wave: opens and resets that make a wave worth freezing.
        long_wave: opens and resets after which a wave still going on is frozen.
        share: the most of the loop thread's CPU each generation's passes may take.
        quiet: the most of a tick's wall time the loop thread may spend on the CPU for the
            tick to count as quiet (a pass due runs at the first quiet tick).
        ceiling: young-generation allocations past which a settled tick collects whatever
            the share (or the frozen objects' count, when more).
        patience: seconds without a quiet tick after which passes no longer wait for one.
        cpu: the loop thread's CPU clock (tests pass their own).
        wall: the wall clock the CPU time is measured against (tests pass their own).
        frozen: how many objects are frozen (tests pass their own). Asked after each
            freeze only: CPython counts the frozen objects by walking their list, 27 ms
            for 3 million, and a tick that asked it every 50 ms past ``ceiling`` took
            half of a 100,000-session server's CPU (issue 34).
    """

    def __init__(
        self,
        stats: ServerCounts,
        *,
        gen0: int = 10_000,
        tick_s: float = 0.05,
        wave: int = 32,
        long_wave: int = 10_000,
        share: float = 0.05,
        quiet: float = 0.25,
        ceiling: int = 200_000,
        patience: float = 5.0,
        cpu: Callable[[], float] = time.thread_time,
        wall: Callable[[], float] = time.monotonic,
        frozen: Callable[[], int] = gc.get_freeze_count,
    ) -> None:
        self.stats = stats
        self.gen0 = gen0
        self.tick_s = tick_s
        self.wave = wave
        self.long_wave = long_wave
        self.share = share
        self.quiet = quiet
        self.ceiling = ceiling
        self.patience = patience
        self._cpu = cpu
        self._wall = wall
        self._frozen = frozen
        self._looked = (wall(), cpu(), -1)
        """The wall and CPU clocks and the traffic count at the last tick (what tells a
        quiet tick)."""
        self._quiet_at = wall()
        self._due = [0.0, 0.0, 0.0]
        """By generation: the thread CPU time before which it is not collected again."""
        self.passes = [0, 0, 0]
        """Collections run, by generation."""
        self.freezes = 0
        self._young = 0
        self._middle = 0
        self._frozen_at = 0
        self._frozen_count = 0
        """Objects frozen at the last freeze (what ``frozen`` said then)."""
        self._last_resets = 0
        self._timer: asyncio.TimerHandle | None = None
        self._was_enabled = True

    @staticmethod
    def wanted() -> bool:
        """False under ``CORRAL_GC=default``."""
        return os.environ.get("CORRAL_GC", "tuned").lower() != "default"

    def start(self) -> None:
        """Freeze what start-up built and take over collection (call on the loop)."""
        self._was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        self._frozen_count = self._frozen()
        self._frozen_at = self._last_resets = self._built()
        self._schedule()

    def _built(self) -> int:
        """Sessions opened and episodes reset so far: what builds long-lived objects."""
        return self.stats.resets + self.stats.opened

    def stop(self) -> None:
        """Give collection back to CPython."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._was_enabled:
            gc.enable()

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.tick_s, self._tick)

    def _tick(self) -> None:
        self.tick()
        self._schedule()

    def tick(self) -> None:
        """One look: collect if due, freeze after a wave (or during a long one)."""
        wall, cpu, traffic = self._wall(), self._cpu(), self._traffic()
        wall0, cpu0, traffic0 = self._looked
        quiet = traffic == traffic0 and cpu - cpu0 <= self.quiet * (wall - wall0)
        if quiet:
            self._quiet_at = wall
        # Settled: quiet now, or never quiet for so long that waiting would not end.
        settled = quiet or wall - self._quiet_at >= self.patience
        built = self._built()
        new = built - self._frozen_at
        # A wave has ended at a settled tick without new opens or resets: the client that
        # reset 10,000 sessions steps them next, and the freeze's pass waits for that
        # burst to be over like any other pass.
        if (settled and built == self._last_resets and new >= self.wave) or new >= self.long_wave:
            self._freeze_wave()
        self._last_resets = built
        young = gc.get_count()[0]
        if settled and young >= self.gen0:
            if young >= self.ceiling and young >= self._frozen_count:
                self._collect(escalate=False)  # past the bound: now, whatever the share
            elif self._cpu() >= self._due[0]:
                self._collect()
        self._looked = (self._wall(), self._cpu(), traffic)  # a pass is not the loop's work

    def _traffic(self) -> int:
        """Frames in, and steps, resets and opens done, so far: the loop's work."""
        stats = self.stats
        return stats.frames + stats.steps + stats.resets + stats.opened

    def _collect(self, escalate: bool = True) -> None:
        started = self._cpu()
        generation = 0
        if escalate and self._young >= 9 and started >= self._due[1]:
            generation = 1
            if self._middle >= 9 and started >= self._due[2]:
                generation = 2
        gc.collect(generation)
        ended = self._cpu()
        self._due[generation] = ended + (ended - started) / self.share
        self.passes[generation] += 1
        if generation == 0:
            self._young += 1
        elif generation == 1:
            self._young, self._middle = 0, self._middle + 1
        else:
            self._young = self._middle = 0

    def _freeze_wave(self) -> None:
        self.freezes += 1
        self._frozen_at = self._built()
        if self.freezes % 10 == 0:
            gc.unfreeze()  # let sessions closed since be collected
            gc.collect()
            self.passes[2] += 1
        else:
            gc.collect(1)
            self.passes[1] += 1
        gc.freeze()
        self._frozen_count = self._frozen()

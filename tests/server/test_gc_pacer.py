"""The server's garbage-collection pacer: collections at ticks, freezes after waves of
resets and opens (and during long ones)."""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass

import pytest

from corral.server.gc_pacer import GcPacer


@dataclass
class Counters:
    resets: int = 0
    opened: int = 0


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def pacer():
    stats = Counters()
    pacer = GcPacer(stats, gen0=100, tick_s=3600, wave=8, long_wave=1000)
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

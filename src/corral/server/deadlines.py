"""Calls' deadlines on a few shared timers, and the context their callbacks run in.

A server holding 100,000 waiting ``async def`` steps watched each with its own
``loop.call_later``: a timer handle, uvloop's timer, a copied ``contextvars.Context``
and a bound method per step, four objects the collector scanned in every young pass for
as long as the step waited. Those passes set the step latency's tail (issue 34: a
142 ms pass every few seconds at 10,000 steps waiting 1 s each). :class:`Deadlines`
files each call instead under a *slot*: its deadline rounded up to the next multiple of
``slack``, one timer per slot. Watching a call is a dict insertion, dropping it a
deletion, and a slot whose calls all ended is dropped with its timer at once, so only
the slots of calls still waiting live (at 10,000 steps per second waiting 1 s with a
300 s timeout: about five slots, not 300,000 timers).

A deadline fires no earlier than ``timeout`` after the call started and at most
``slack`` later (``timeout / 32``, at most 0.25 s): 300 s becomes at most 300.25 s.

The same object carries the context the calls' done callbacks run in: a future copies
the current context for every callback given none, one more tracked object per call.
The callbacks of one server's calls run in one context made once, on its loop's
thread (a context cannot be entered by two threads at once, and a test process runs
several servers' loops).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from typing import Protocol

MAX_SLACK_S = 0.25
"""The most a deadline fires late."""
SLACK_FRACTION = 32
"""A deadline fires at most ``timeout / SLACK_FRACTION`` late (when under the cap)."""


class Overrunning(Protocol):
    """What a slot holds: a call told once its deadline passed."""

    def overran(self) -> None:
        """The call's deadline passed while it was still watched."""


Slot = dict[Overrunning, None]
"""The calls of one slot, in order of watching (a dict: insertion and deletion in O(1))."""


class Deadlines:
    """The deadlines of one server's calls (all on one loop), ``timeout`` after each
    starts; None: calls never overrun."""

    __slots__ = ("_loop", "_slots", "context", "slack", "timeout")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.slack = 0.0 if timeout is None else min(MAX_SLACK_S, timeout / SLACK_FRACTION)
        self._slots: dict[float, tuple[Slot, asyncio.TimerHandle]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.context: contextvars.Context | None = None
        """The context the calls' done callbacks run in (made on the loop, at the first
        :meth:`watch`)."""

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve ``loop`` from now on (a server's calls all run on one loop; an app
        served again later, on a new loop, starts afresh)."""
        self._loop, self._slots = loop, {}
        self.context = contextvars.copy_context()

    def watch(self, call: Overrunning) -> float | None:
        """File ``call`` under its deadline, ``timeout`` from now; the slot's key, to
        drop it with (:meth:`drop`), or None when calls have no deadline."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        if self.timeout is None:
            return None
        slack = self.slack
        at: float = math.ceil((loop.time() + self.timeout) / slack) * slack
        found = self._slots.get(at)
        if found is None:
            self._slots[at] = ({call: None}, loop.call_at(at, _expire, self._slots, at))
        else:
            found[0][call] = None
        return at

    def drop(self, call: Overrunning, at: float) -> None:
        """Stop watching ``call`` (it ended); a slot left empty goes, with its timer."""
        found = self._slots.get(at)
        if found is None:
            return  # its slot is expiring: the call is being told it overran
        slot, timer = found
        if slot.pop(call, _ABSENT) is _ABSENT:
            return  # a call of the loop before a rebind
        if not slot:
            timer.cancel()
            del self._slots[at]

    def __len__(self) -> int:
        """Slots alive (each one timer)."""
        return len(self._slots)


_ABSENT = object()


def _expire(slots: dict[float, tuple[Slot, asyncio.TimerHandle]], at: float) -> None:
    """A slot's timer: tell its calls (the map is the one of the slot's loop)."""
    found = slots.pop(at, None)
    if found is not None:
        for call in list(found[0]):  # popped first: overran() finds no slot to drop from
            call.overran()

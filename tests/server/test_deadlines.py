"""Calls' deadlines on shared timers: never early, at most ``slack`` late, one timer per
slot of calls still waiting, nothing left once they end."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from corral.server.deadlines import MAX_SLACK_S, Deadlines


class Call:
    """A watched call: says when (loop time) it was told it overran."""

    def __init__(self, deadlines: Deadlines) -> None:
        self.deadlines = deadlines
        self.started = asyncio.get_running_loop().time()
        self.told: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.at = deadlines.watch(self)

    def overran(self) -> None:
        self.told.set_result(asyncio.get_running_loop().time())

    def end(self) -> None:
        assert self.at is not None
        self.deadlines.drop(self, self.at)


async def test_a_deadline_fires_no_earlier_than_the_timeout_and_its_slot_within_slack():
    deadlines = Deadlines(0.2)
    assert deadlines.slack == pytest.approx(0.2 / 32)
    calls = [Call(deadlines) for _ in range(5)]
    for call in calls:
        assert call.at is not None
        assert call.started + 0.2 <= call.at <= call.started + 0.2 + deadlines.slack
    told = await asyncio.gather(*(call.told for call in calls))
    assert all(when >= call.started + 0.2 for call, when in zip(calls, told, strict=True))
    assert len(deadlines) == 0  # the fired slots are gone


async def test_a_long_timeout_is_late_by_at_most_the_cap():
    deadlines = Deadlines(300.0)
    assert deadlines.slack == MAX_SLACK_S
    call = Call(deadlines)
    assert call.at is not None and call.at - call.started <= 300.0 + MAX_SLACK_S
    call.end()


async def test_calls_that_end_leave_no_slot_and_no_timer():
    deadlines = Deadlines(60.0)
    calls = [Call(deadlines) for _ in range(1000)]
    # A thousand calls started at once share one slot (two if a slot boundary fell
    # between them): one timer, not a thousand.
    assert 1 <= len(deadlines) <= 2
    for call in calls[:-1]:
        call.end()
    assert 1 <= len(deadlines) <= 2
    calls[-1].end()
    assert len(deadlines) == 0
    assert not any(call.told.done() for call in calls)


async def test_only_the_calls_still_watched_are_told():
    deadlines = Deadlines(0.05)
    ended, waiting = Call(deadlines), Call(deadlines)
    ended.end()
    await waiting.told
    await asyncio.sleep(deadlines.slack)  # past the slot both shared
    assert not ended.told.done()


async def test_without_a_timeout_nothing_is_watched():
    deadlines = Deadlines(None)
    assert Call(deadlines).at is None and len(deadlines) == 0


def test_each_loop_gets_its_own_slots_and_context():
    """A service served again on a new loop (a test's second event loop) starts afresh:
    its deadlines fire on that loop, its callbacks' context is made there."""
    deadlines = Deadlines(0.05)
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker")

    async def one(name: str) -> tuple[float, contextvars.Context | None]:
        marker.set(name)
        call = Call(deadlines)
        return await call.told, deadlines.context

    first = asyncio.run(one("first"))
    second = asyncio.run(one("second"))
    assert first[1] is not second[1]
    assert second[1] is not None and second[1][marker] == "second"

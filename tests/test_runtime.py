"""corral.runtime's bounded event wait (the loop and GC settings are tested where used)."""

from __future__ import annotations

import asyncio

import pytest

from corral.runtime import wait_event


async def test_an_event_set_in_time_is_true_and_a_timeout_is_false() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, 30) is True
    assert await wait_event(asyncio.Event(), 0.01) is False
    event.clear()
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, None) is True


async def test_a_cancel_in_the_turn_the_event_is_set_is_kept() -> None:
    """3.11's wait_for returns the event's result here and the cancellation is lost."""
    event = asyncio.Event()
    waiting = asyncio.create_task(wait_event(event, 300))
    for _ in range(3):  # into its wait on the event
        await asyncio.sleep(0)
    event.set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

"""corral.runtime's bounded event wait and reaping of cancelled tasks (the loop and GC settings
are tested where used)."""

from __future__ import annotations

import asyncio

import pytest

from corral.runtime import reap, wait_event


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


async def test_reap_drops_the_cancelled_task_s_end_but_never_the_caller_s_cancellation() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def failing() -> None:
        raise RuntimeError("its own failure")

    child = asyncio.ensure_future(forever())
    child.cancel()
    await reap(child)  # the child's CancelledError is the caller's doing: dropped
    assert child.cancelled()
    broken = asyncio.ensure_future(failing())
    await reap(broken)  # and its own failure too
    assert isinstance(broken.exception(), RuntimeError)

    # A cancellation of the caller while it waits is not swallowed with the child's.
    slow = asyncio.ensure_future(forever())
    reaping = asyncio.ensure_future(reap(slow))
    await asyncio.sleep(0)  # the reaper now waits for the (uncancelled) child
    reaping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reaping
    assert reaping.cancelled()

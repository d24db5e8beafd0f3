"""corral.runtime's bounded waits and reaping of cancelled tasks, which never lose the caller's
cancellation (the loop and GC settings are tested where used)."""

from __future__ import annotations

import asyncio

import pytest

from corral.runtime import reap, wait_event, wait_for


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


async def test_wait_for_gives_the_result_the_failure_or_a_timeout() -> None:
    assert await wait_for(asyncio.sleep(0, "done"), 30) == "done"

    async def failing() -> None:
        raise RuntimeError("its own failure")

    with pytest.raises(RuntimeError, match="its own failure"):
        await wait_for(failing(), 30)
    slow = asyncio.ensure_future(asyncio.Event().wait())
    with pytest.raises(TimeoutError):
        await wait_for(slow, 0.01)
    assert slow.cancelled()  # cancelled and waited for, as asyncio.wait_for does


async def test_wait_for_keeps_a_cancel_in_the_turn_the_awaitable_finishes() -> None:
    """3.11's asyncio.wait_for returns 1 here: the caller's cancellation (a Ctrl-C turned
    into the main task's cancellation) is lost and the caller goes on."""
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(wait_for(future, 300))
    for _ in range(3):  # into its wait
        await asyncio.sleep(0)
    future.set_result(1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_wait_for_cancelled_cancels_what_it_waits_for() -> None:
    inner = asyncio.ensure_future(asyncio.Event().wait())
    waiting = asyncio.create_task(wait_for(inner, 300))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert inner.cancelled()


async def test_a_reap_in_the_clean_up_of_a_cancelled_task_lets_the_clean_up_finish() -> None:
    """The task unwinds its cancellation; the reap must not raise it a second time and
    cut the rest of the clean-up (a pool closing its connections and stopping its
    servers) short."""
    cleaned: list[str] = []
    waiting = asyncio.Event()

    async def owner() -> None:
        child = asyncio.ensure_future(asyncio.Event().wait())
        try:
            waiting.set()
            await asyncio.Event().wait()
        finally:
            child.cancel()
            await reap(child)
            cleaned.append("after the reap")
            assert await wait_event(asyncio.Event(), 0.01) is False  # a bounded wait too
            cleaned.append("after a wait")

    task = asyncio.create_task(owner())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["after the reap", "after a wait"]


async def test_a_cancellation_pending_when_the_reap_begins_is_raised_there() -> None:
    async def owner() -> None:
        child = asyncio.ensure_future(asyncio.Event().wait())  # (not cancelled: no end)
        current = asyncio.current_task()
        assert current is not None
        current.cancel()  # pending: delivered at the task's next wait, the reap's
        await reap(child)

    task = asyncio.create_task(owner())
    done, _ = await asyncio.wait((task,), timeout=60)
    assert done, "the reap waited for a task nobody ends"
    assert task.cancelled()

"""Runtime settings of the processes corral owns (servers, worker processes).

* The event loop: uvloop when installed (the ``fast`` extra, ``pip install corral[fast]``),
  else asyncio's; ``CORRAL_LOOP=asyncio`` forces the standard loop (to compare, to debug).
  Loops the caller owns (``asyncio.run`` in a trainer) are never replaced.
* The garbage collector (:func:`tune_gc`): a server holding thousands of sessions keeps
  hundreds of thousands of live objects, and CPython's default thresholds make it scan
  them over and over (a third of a batched step's CPU in measurements); corral's own
  processes freeze what start-up created and collect the young generation less often.
  ``CORRAL_GC=default`` keeps CPython's settings.
* In a trainer's process (a loop and a GC corral does not own) nothing is changed unless
  the trainer opts in with ``EnvPool(gc_control=True)``: then :class:`GcPause` keeps the
  collector out of each batch and :func:`freeze_survivors` moves what a start-up or reset
  wave created out of its scans. Both act on the whole process, which is why they are
  the trainer's choice, not the pool's; ``CORRAL_GC=default`` turns them off anyway.
* Waiting without losing a cancellation: :func:`wait_for` (an awaitable, bounded),
  :func:`wait_event` (an event, bounded) and :func:`reap` (a task the caller cancelled).
  Python 3.11's ``asyncio.wait_for`` returns the result of an awaitable that finishes in
  the loop turn its caller is cancelled, and the cancellation is lost (a Ctrl-C, a
  shutdown); ``with suppress(CancelledError): await task`` swallows a cancellation of the
  caller together with the task's own end. All three wait through ``asyncio.wait``, which
  never raises what it waits on and never cancels it, so the only ``CancelledError``
  that reaches them is the caller's, and that always propagates, pending or new; a
  cancellation the caller is already unwinding is not raised again, so its clean-up
  (closing connections, stopping servers) runs to its end. None needs a current task:
  the blocking twins' taskless calls (:mod:`corral.blocking`) use them too.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new event loops: uvloop's if available and not disabled."""
    if os.environ.get("CORRAL_LOOP", "auto").lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
            return factory
    return asyncio.new_event_loop


def loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: what :func:`loop_factory` builds."""
    return "asyncio" if loop_factory() is asyncio.new_event_loop else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Like ``asyncio.run`` but on the loop :func:`loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


GEN0_THRESHOLD = 10_000
"""Allocations between young-generation collections in corral's processes (default 700)."""


def tune_gc() -> None:
    """Freeze start-up objects and collect the young generation less often.

    Call once, after imports and set-up, in a process corral owns; a no-op with
    ``CORRAL_GC=default``.
    """
    if os.environ.get("CORRAL_GC", "tuned").lower() == "default":
        return
    gc.collect()
    gc.freeze()  # modules, classes and schemas live forever: never scan them again
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


def gc_control_enabled() -> bool:
    """False with ``CORRAL_GC=default`` (keep CPython's collector as it is)."""
    return os.environ.get("CORRAL_GC", "tuned").lower() != "default"


class GcPause:
    """No garbage collection while any holder is inside (``with pause:``).

    Counted, not nested: concurrent batches of several tasks overlap in any order, and
    the collector comes back (if it was on) when the last one leaves. What the batch
    allocated is collected right after, so memory stays bounded by one batch.
    """

    __slots__ = ("_depth", "_resume")

    def __init__(self) -> None:
        self._depth = 0
        self._resume = False

    def __enter__(self) -> None:
        if self._depth == 0:
            self._resume = gc.isenabled()
            gc.disable()
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._resume:
            gc.enable()


GC_PAUSE = GcPause()
"""The process's one pause (the collector is process-wide)."""


def freeze_survivors() -> None:
    """Collect, then exclude every object alive now from later collections.

    For long-lived state built in a wave (a pool's sessions and connections, the first
    observations): later young-generation passes no longer promote and rescan it. The
    objects are still freed by reference counting when released.
    """
    gc.collect()
    gc.freeze()


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    """``asyncio.wait_for`` without the lost cancellation (see the module docstring):
    the result of ``awaitable``, or ``TimeoutError`` after ``timeout`` seconds (None: no
    bound), when it is cancelled and waited for. A cancellation of the caller cancels it
    too, waits for it, and propagates.
    """
    inner = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait((inner,), timeout=timeout)
    except asyncio.CancelledError:
        inner.cancel()
        await reap(inner)
        raise
    if not done:
        inner.cancel()
        await reap(inner)
        raise TimeoutError
    return inner.result()


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set, at most ``timeout`` seconds (None: no bound); False
    when the time ran out. A cancellation is never lost (see the module docstring)."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait((waiter,), timeout=timeout)
    finally:
        waiter.cancel()  # (done: a no-op)
    return bool(done)


async def reap(task: asyncio.Future[Any]) -> None:
    """Wait for ``task``, which the caller cancelled or closed, to end; its outcome is
    dropped (its ``CancelledError``, or its own failure: the caller is done with it).

    The caller's own cancellation propagates, whether it comes while it waits or was
    pending when it began to; a cancellation the caller is unwinding already (a reap in
    its clean-up) is not raised a second time, and the clean-up goes on.
    """
    if not task.done():
        await asyncio.wait((task,))
    if not task.cancelled():
        task.exception()  # retrieved: asyncio must not log it as never retrieved

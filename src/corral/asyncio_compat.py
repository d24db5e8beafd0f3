"""The private asyncio and signal hooks corral relies on, in one place.

The blocking twins (:mod:`corral.blocking`) run corral's event loop in the caller's
thread and step a coroutine without a task; that needs a few interpreter internals
that have no public spelling:

* the running loop of this thread, read without raising (``asyncio._get_running_loop``)
  and set while a coroutine is stepped by hand (``asyncio._set_running_loop``);
* the future protocol a task follows: a coroutine that awaits a future yields it with
  ``_asyncio_future_blocking`` set, which the stepper clears as it takes the future;
* the task a loop holds as current, entered and left by hand (``asyncio.tasks._enter_task``
  and ``_leave_task``): a batch's calls start in the frame's callback, before the batch's
  task has run, with that task current as they would be at its first step;
* SIGINT's handler read and set through ``signal``'s C core (``_signal``): the Python
  wrapper turns each handler into an enum and back, which cost more (~13 µs a call) than
  the rest of a call's set-up.

Each is named once here, with what it does; the rest of corral calls these functions.
:func:`self_check` exercises every one of them without importing the rest of corral, so
``tests/test_asyncio_compat.py`` runs it on every supported Python found on the machine
(3.11 and up): an interpreter that moved one of them fails there, by name, not deep in a
blocking call.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import asyncio
import asyncio.tasks
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

SigHandler = Callable[[int, FrameType | None], Any] | int | None
"""A signal handler as ``signal`` takes it: a callable, ``SIG_DFL``/``SIG_IGN``, or None."""

_SIGINT = int(signal.SIGINT)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None (``asyncio.get_running_loop`` raises
    instead, which costs an exception on the path that finds none)."""
    loop: asyncio.AbstractEventLoop | None = asyncio._get_running_loop()
    return loop


def set_running_loop(loop: asyncio.AbstractEventLoop | None) -> None:
    """Make ``loop`` this thread's running loop (None: none) while a coroutine is stepped
    outside a task, so that what it calls finds the loop as it would inside one."""
    asyncio._set_running_loop(loop)


def take_awaited(value: Any) -> bool:
    """Whether ``value``, yielded by a coroutine stepped by hand, is a future it awaits;
    if so it is taken, as a task takes it (its ``_asyncio_future_blocking`` cleared)."""
    if getattr(value, "_asyncio_future_blocking", None) is not True:
        return False
    value._asyncio_future_blocking = False
    return True


def enter_task(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    """Make ``task`` the current task of ``loop`` (none may be current), as a task's own
    step does while it runs; :func:`leave_task` ends it."""
    asyncio.tasks._enter_task(loop, task)


def leave_task(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    """End what :func:`enter_task` began: ``loop`` has no current task again."""
    asyncio.tasks._leave_task(loop, task)


def sigint_handler() -> SigHandler:
    """SIGINT's current handler (through ``signal``'s C core)."""
    handler: SigHandler = _signal.getsignal(_SIGINT)
    return handler


def set_sigint_handler(handler: SigHandler) -> SigHandler:
    """Install ``handler`` for SIGINT (main thread only); return the previous one.

    Setting the previous handler back runs a SIGINT that arrived meanwhile, as Python
    does whenever a handler changes.
    """
    previous: SigHandler = _signal.signal(_SIGINT, handler)
    return previous


def self_check() -> list[str]:
    """Exercise every hook above on this interpreter; return what was checked.

    Raises:
        AssertionError / AttributeError: a hook is missing or behaves otherwise.
    """
    checked = []
    assert running_loop() is None
    loop = asyncio.new_event_loop()
    try:
        set_running_loop(loop)
        try:
            assert running_loop() is loop and asyncio.get_running_loop() is loop
        finally:
            set_running_loop(None)
        assert running_loop() is None
        checked.append("running loop: read and set")

        future = loop.create_future()

        async def waits() -> Any:
            return await future

        coro = waits()
        yielded = coro.send(None)
        assert yielded is future and take_awaited(yielded)
        assert not take_awaited(yielded) and not take_awaited(None)
        future.set_result(42)
        try:
            coro.send(None)
        except StopIteration as done:
            assert done.value == 42
        else:
            raise AssertionError("the coroutine did not finish once its future was done")
        checked.append("future protocol: a yielded future taken")

        async def pending() -> None:
            await asyncio.sleep(0)

        task = loop.create_task(pending())
        enter_task(loop, task)
        try:
            assert asyncio.current_task(loop) is task
        finally:
            leave_task(loop, task)
        assert asyncio.current_task(loop) is None
        loop.run_until_complete(task)
        checked.append("current task: entered and left")
    finally:
        loop.close()

    seen: list[int] = []

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    previous = set_sigint_handler(on_sigint)
    try:
        assert sigint_handler() is on_sigint
        signal.raise_signal(signal.SIGINT)
        assert seen == [_SIGINT]
    finally:
        set_sigint_handler(previous)
    assert sigint_handler() is previous
    checked.append("SIGINT handler: read, set, called, restored")
    return checked


if __name__ == "__main__":  # run by tests/test_asyncio_compat.py on other interpreters
    for line in self_check():
        print(line)

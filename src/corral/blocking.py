"""The blocking faces of corral's async objects: one private loop, one base class.

corral is async-first; every blocking class (``SyncEnvClient``, ``SyncEnvPool``,
``SyncProvider``, ``SyncWarmPool``) is a thin twin of an async one, running the async
methods on corral's own event loop (:func:`background_loop`) instead of ``asyncio.run``,
so they work from plain scripts, from several threads and from inside a running loop
such as Jupyter's, and the async objects' background tasks (keepalive, reconnects,
health checks) go on between two blocking calls.

**Who runs the loop.** A daemon thread runs it while nobody calls. A blocking call from
a thread without a loop of its own runs the loop *itself* for the duration of the call,
so a call costs what the async one costs, without two thread switches per call (which
doubled the latency of a fast environment's step). After a call the loop stays with
nobody for :data:`GRACE_S`, long enough for the next call of a stepping loop to take it
at once; past that the daemon thread takes it back for the background work. A call that
cannot run the loop (another thread runs it for a call, or the caller is inside a running
loop) hands its coroutine to the loop's runner and waits, as every call did before.

**Taskless calls.** A call that runs the loop itself may also step its coroutine itself
(``taskless=True``: no task, and two loop turns per awaited future, the reply's and the
one that stops the loop, instead of three, the task's first step, the reply's and the
wake-up), for the hot calls whose coroutines need no current task: ``EnvPool``'s step,
reset, send and recv. A call's deadline is one timer the keeper keeps armed across calls
(see ``_Keeper._ring``), not one per call.

:class:`BlockingTwin` is what the twins share: run a coroutine there and wait at most a
given time (:class:`~corral.errors.RequestTimeout` after), and the context manager.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import math
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from types import EllipsisType, FrameType, TracebackType
from typing import Any, Generic, Self, TypeVar

from corral import runtime
from corral.asyncio_compat import (
    running_loop,
    set_running_loop,
    set_sigint_handler,
    sigint_handler,
    take_awaited,
)
from corral.errors import RequestTimeout

T = TypeVar("T")
W = TypeVar("W")


GRACE_S = 0.5
"""Seconds the loop waits, after a blocking call, for the next one before the background
thread takes it back."""


class _Runner(enum.Enum):
    NOBODY = "nobody"
    BACKGROUND = "background"
    CALLER = "caller"


class _Keeper:
    """corral's loop and who runs it: the background thread, a blocking caller, nobody.

    ``changed`` (on ``mutex``) wakes the background thread when it should take the loop
    and the callers waiting for it to give the loop up.
    """

    def __init__(self) -> None:
        # The thread that makes the first blocking call is the one likely to run the
        # loop from then on. The main thread gets asyncio's own loop even with uvloop
        # installed: uvloop run in the main thread opens and closes a signal self-pipe
        # (a socketpair, set_wakeup_fd, a reader) on every run, i.e. on every call (an
        # empty call ~45 us of CPU, ~14 us on asyncio's loop); a Ctrl-C still wakes
        # asyncio's loop, as the handler _drive installs runs inside the interrupted
        # poll (PEP 475) and writes to the loop's self-pipe. Any other thread gets
        # uvloop when installed, whose C transports cost less per message there
        # (8-env RemoteVecEnv client CPU ~20% less from a worker thread).
        if threading.current_thread() is threading.main_thread():
            self.loop = asyncio.new_event_loop()
        else:
            self.loop = runtime.loop_factory()()
        self.mutex = threading.Lock()
        self.changed = threading.Condition(self.mutex)
        self.runner = _Runner.NOBODY
        self.waiting = 0
        """Callers waiting for a coroutine they handed to whoever runs the loop."""
        self.claimed = False
        """A caller asked the background thread to stop and takes the loop next."""
        self.released = 0.0
        self._call: _Call | None = None
        """The blocking call running the loop in its thread, if any."""
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_at = math.inf
        """When the alarm rings (see :meth:`_ring`)."""
        thread = threading.Thread(target=self._background, name="corral-sync-loop", daemon=True)
        thread.start()

    def _background(self) -> None:
        while True:
            with self.mutex:
                while not self._background_turn():
                    # Woken when callers wait for it; else it looks again once a grace
                    # period after the last call may have passed.
                    wait = GRACE_S
                    if self.runner is _Runner.NOBODY and not self.claimed:
                        wait -= time.monotonic() - self.released
                    self.changed.wait(max(wait, 0.001))
                self.runner = _Runner.BACKGROUND
            try:
                self.loop.run_forever()
            finally:
                with self.mutex:
                    self.runner = _Runner.NOBODY
                    self.changed.notify_all()

    def _background_turn(self) -> bool:
        if self.runner is not _Runner.NOBODY or self.claimed:
            return False
        return self.waiting > 0 or time.monotonic() - self.released >= GRACE_S

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None, taskless: bool = False) -> T:
        running = running_loop()  # None in a plain thread, without raising
        if running is self.loop:
            coro.close()
            raise RuntimeError("a blocking corral call was made from corral's own event loop")
        if running is None and self._take():
            try:
                if taskless:
                    return self._drive_taskless(coro, timeout)
                return self._drive(coro, timeout)
            finally:
                with self.mutex:
                    self.runner = _Runner.NOBODY
                    self.released = time.monotonic()
                    if self.waiting:
                        self.changed.notify_all()
        return self._hand_over(coro, timeout)

    def _take(self) -> bool:
        """Become the loop's runner (stopping the background thread if it has it)."""
        with self.mutex:
            if self.runner is _Runner.BACKGROUND and not self.waiting:
                if not self.claimed:
                    self.claimed = True
                    self.loop.call_soon_threadsafe(self.loop.stop)
                try:
                    while self.runner is _Runner.BACKGROUND:
                        self.changed.wait()
                except BaseException:  # Ctrl-C while waiting: give the claim back
                    self.claimed = False
                    self.changed.notify_all()
                    raise
            if self.runner is not _Runner.NOBODY:
                return False
            self.runner = _Runner.CALLER
            self.claimed = False
            return True

    def _drive(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run the loop in this thread until ``coro``, run as a task, is done.

        Ctrl-C (in the main thread) cancels the call instead of landing inside whatever
        task the loop runs at that moment, as ``asyncio.run`` does.
        """
        loop = self.loop
        task = loop.create_task(_stopping(loop, coro))
        call = self._begin(task.cancel, timeout)
        previous = _catch_sigint(loop, call)
        try:
            while not task.done():  # a stale stop (an abandoned call's) may end a run early
                loop.run_forever()
        finally:
            self._call = None
            _restore_sigint(previous)
        if call.interrupted:
            if not task.cancelled():
                task.exception()  # retrieved: asyncio must not log it, the Ctrl-C wins
            raise KeyboardInterrupt
        try:
            return task.result()
        except asyncio.CancelledError:
            if call.expired:
                raise _timeout(timeout) from None
            raise

    def _drive_taskless(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run ``coro`` without a task: this thread steps it, and runs the loop while it
        waits for a future (see :func:`run_blocking`'s ``taskless``)."""
        loop = self.loop
        call = self._begin(loop.stop, timeout)
        failure: BaseException | None = None
        previous = _catch_sigint(loop, call)
        try:
            result = _run_taskless(loop, coro, call)
        except BaseException as exc:  # judged below, once the handler is back
            failure = exc
            _abandon(loop, coro)
        finally:
            self._call = None
            _restore_sigint(previous)
        if call.interrupted:
            raise KeyboardInterrupt
        if failure is not None:
            if isinstance(failure, asyncio.CancelledError) and call.expired:
                raise _timeout(timeout) from None
            raise failure
        return result

    def _begin(self, stop: Callable[[], object], timeout: float | None) -> _Call:
        """The call about to run the loop in this thread; its deadline armed."""
        call = self._call = _Call(stop)
        if timeout is not None:
            loop = self.loop
            call.deadline = loop.time() + timeout
            if call.deadline < self._alarm_at:
                if self._alarm is not None:
                    self._alarm.cancel()
                self._alarm_at = call.deadline
                self._alarm = loop.call_at(call.deadline, self._ring)
        return call

    def _ring(self) -> None:
        """The alarm: end the running call if its deadline passed, else re-arm for it.

        One timer serves many calls: a call that returns leaves it armed (cancelling
        and re-arming a timer on every call costs more than the call's own loop turns),
        and a later call whose deadline is further only moves it when it rings.
        """
        rang = self._alarm_at
        self._alarm, self._alarm_at = None, math.inf
        call = self._call
        if call is None or call.deadline == math.inf:
            return
        if call.deadline <= rang:
            call.expired = True
            call.stop()
        else:
            self._alarm_at = call.deadline
            self._alarm = self.loop.call_at(call.deadline, self._ring)

    def _hand_over(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Have whoever runs the loop run ``coro``; wait for it in this thread."""
        with self.mutex:
            self.waiting += 1
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            if self.runner is _Runner.NOBODY:
                self.changed.notify_all()
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise _timeout(timeout) from None
        finally:
            with self.mutex:
                self.waiting -= 1


class _Call:
    """A blocking call running the loop in its own thread, and how it ends early."""

    __slots__ = ("deadline", "expired", "interrupted", "stop")

    def __init__(self, stop: Callable[[], object]) -> None:
        self.stop = stop
        """Makes the call end early (cancels its task, or stops the loop)."""
        self.deadline = math.inf
        """The loop's time past which the call times out."""
        self.expired = False
        self.interrupted = False

    @property
    def ending(self) -> bool:
        """Timed out or interrupted: the coroutine is to be cancelled."""
        return self.expired or self.interrupted


def _catch_sigint(loop: asyncio.AbstractEventLoop, call: _Call) -> Any:
    """Have Ctrl-C end ``call``, which runs ``loop`` (in the main thread, when Python's
    default handler is in place; a second Ctrl-C does not wait for the cancellation).
    Returns the handler to put back with :func:`_restore_sigint`, or None."""
    if not (
        threading.current_thread() is threading.main_thread()
        and sigint_handler() is signal.default_int_handler
    ):
        return None

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if call.interrupted:
            raise KeyboardInterrupt
        call.interrupted = True
        call.stop()
        # Wake the loop (the handler runs inside its interrupted poll, PEP 475) and stop
        # it: a task cancelled before its first step never runs _stopping's body, and a
        # taskless call may be waiting in the poll.
        loop.call_soon_threadsafe(loop.stop)

    return set_sigint_handler(on_sigint)  # signal's C core: see corral.asyncio_compat


def _restore_sigint(previous: Any) -> None:
    # Restoring the handler first runs a pending one: a Ctrl-C that arrived as the call
    # finished sets the call's ``interrupted`` here, and the caller raises it.
    if previous is not None:
        set_sigint_handler(previous)


def _run_taskless(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], call: _Call) -> T:
    """Step ``coro`` in this thread as a task would, running ``loop`` while it waits.

    What a task's steps and wake-ups cost (a task, its first step in a loop turn of its
    own, a wake-up turn after each future) is saved: the caller steps the coroutine with
    ``loop`` as the running loop, and each future it awaits stops the loop when done.
    Cancellation follows a task's: when ``call`` ends early the awaited future is
    cancelled (a gathering one cancels its children first), or, if it cannot be, the
    coroutine gets ``CancelledError`` at its next step.
    """
    stop = _stopper(loop)
    cancelled = False
    throw: BaseException | None = None
    while True:
        if call.ending and not cancelled:
            cancelled = True
            throw = asyncio.CancelledError()
        set_running_loop(loop)
        try:
            waited = coro.send(None) if throw is None else coro.throw(throw)
        except StopIteration as end:
            result: T = end.value
            return result
        finally:
            set_running_loop(None)
            throw = None
        if waited is None:  # a bare yield (asyncio.sleep(0)): let the loop run a turn
            loop.call_soon(loop.stop)
            loop.run_forever()
            continue
        if not take_awaited(waited):
            throw = RuntimeError(f"a blocking call's coroutine yielded {waited!r}")
            continue
        if waited.done():
            continue
        waited.add_done_callback(stop)
        while not waited.done():
            if call.ending and not cancelled:
                cancelled = True
                if not waited.cancel():  # it cannot be: the next step raises instead
                    throw = asyncio.CancelledError()
                continue
            loop.run_forever()  # until the future is done (or an early stop)


def _abandon(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> None:
    """Close a coroutine left suspended (a second Ctrl-C cut its call short): its
    ``finally`` blocks and handlers run now (a request is forgotten, not re-sent)."""
    set_running_loop(loop)
    try:
        coro.close()
    except RuntimeError:  # it awaited in a finally block: nothing more can be done
        pass
    finally:
        set_running_loop(None)


def _stopper(loop: asyncio.AbstractEventLoop) -> Callable[[Any], None]:
    def stop(_: Any) -> None:
        loop.stop()

    return stop


async def _stopping(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """``coro``, then stop ``loop`` in the same step (a done callback costs a loop turn)."""
    try:
        return await coro
    finally:
        loop.stop()


def _timeout(timeout: float | None) -> RequestTimeout:
    return RequestTimeout(f"call did not finish within {timeout} s", details={"timeout_s": timeout})


_lock = threading.Lock()
_keeper: _Keeper | None = None


def _the_keeper() -> _Keeper:
    global _keeper
    keeper = _keeper
    if keeper is not None and not keeper.loop.is_closed():
        return keeper
    with _lock:
        if _keeper is None or _keeper.loop.is_closed():
            _keeper = _Keeper()
        return _keeper


def background_loop() -> asyncio.AbstractEventLoop:
    """corral's own event loop (its thread is started on first use)."""
    return _the_keeper().loop


def moves_between_threads(loop: asyncio.AbstractEventLoop) -> bool:
    """True for corral's own loop, which blocking callers and its thread take in turns
    (a transport that must stay on one thread cannot live on it)."""
    keeper = _keeper
    return keeper is not None and loop is keeper.loop


def run_blocking(
    coro: Coroutine[Any, Any, T], timeout: float | None, *, taskless: bool = False
) -> T:
    """Run ``coro`` on corral's loop and wait at most ``timeout`` seconds.

    ``taskless``: when this thread runs the loop itself, step ``coro`` here instead of in
    a task (a task and a loop turn fewer a call). Only for coroutines that need no current
    task: ``asyncio.timeout`` and anyio's cancel scopes do (gather, wait_for, shield and
    futures do not); a call handed to another thread's loop runs as a task anyway.

    Raises:
        RuntimeError: when called from corral's loop itself (it would deadlock).
        RequestTimeout: the coroutine did not finish in time (it is cancelled).
        KeyboardInterrupt: Ctrl-C during the call (the coroutine is cancelled).
    """
    return _the_keeper().run(coro, timeout, taskless)


class BlockingTwin(ABC, Generic[W]):
    """Base of a blocking twin of the async object ``W``: same methods, same errors.

    A subclass writes one line per method, ``return self._call(self._async.method(...))``;
    :meth:`_wait` says how long a call may block (None: no limit) and :meth:`_enter`
    what ``with`` does first.
    """

    def __init__(self, wrapped: W) -> None:
        self._async = wrapped

    def _wait(self) -> float | None:
        """Seconds a call may block before :class:`RequestTimeout` (None: no limit)."""
        return None

    def _call(
        self,
        coro: Coroutine[Any, Any, T],
        wait: float | EllipsisType | None = ...,
        *,
        taskless: bool = False,
    ) -> T:
        """Run ``coro`` on the background loop; block ``wait`` s at most (or :meth:`_wait`'s);
        ``taskless`` as for :func:`run_blocking`."""
        return run_blocking(coro, self._wait() if wait is ... else wait, taskless=taskless)

    def _enter(self) -> None:
        """What ``with twin:`` does before the block (e.g. connect, start)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the async object holds (idempotent)."""

    def __enter__(self) -> Self:
        self._enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

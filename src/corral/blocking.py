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

:class:`BlockingTwin` is what the twins share: run a coroutine there and wait at most a
given time (:class:`~corral.errors.RequestTimeout` after), and the context manager.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import asyncio
import concurrent.futures
import enum
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from types import EllipsisType, FrameType, TracebackType
from typing import Any, Generic, Self, TypeVar

from corral import runtime
from corral.errors import RequestTimeout

T = TypeVar("T")
W = TypeVar("W")

_SIGINT = int(signal.SIGINT)

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

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        running = asyncio._get_running_loop()  # None in a plain thread, without raising
        if running is self.loop:
            coro.close()
            raise RuntimeError("a blocking corral call was made from corral's own event loop")
        if running is None and self._take():
            try:
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
        """Run the loop in this thread until ``coro`` is done.

        Ctrl-C (in the main thread) cancels the call instead of landing inside whatever
        task the loop runs at that moment, as ``asyncio.run`` does.
        """
        loop = self.loop
        task = loop.create_task(_stopping(loop, coro))
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = loop.call_later(timeout, expire) if timeout is not None else None
        interrupted = False

        def on_sigint(signum: int, frame: FrameType | None) -> None:
            nonlocal interrupted
            if interrupted:  # a second Ctrl-C: do not wait for the cancellation
                raise KeyboardInterrupt
            interrupted = True
            task.cancel()
            # Wake the loop and stop it: a task cancelled before its first step never
            # runs _stopping's body, so nothing else would stop the loop (the while
            # below runs it again until the cancelled task is done).
            loop.call_soon_threadsafe(loop.stop)

        # signal's C core, not signal.signal: its enum wrapping of the handlers cost
        # more (~13 us a call) than the rest of this method.
        previous = None
        if (
            threading.current_thread() is threading.main_thread()
            and _signal.getsignal(_SIGINT) is signal.default_int_handler
        ):
            previous = _signal.signal(_SIGINT, on_sigint)

        try:
            while not task.done():  # a stale stop (an abandoned call's) may end a run early
                loop.run_forever()
        finally:
            if timer is not None:
                timer.cancel()
            if previous is not None:
                # Restoring the handler first runs a pending one: a Ctrl-C that arrived
                # as the call finished sets ``interrupted`` here, and is raised below.
                _signal.signal(_SIGINT, previous)
        if interrupted:
            if not task.cancelled():
                task.exception()  # retrieved: asyncio must not log it, the Ctrl-C wins
            raise KeyboardInterrupt
        try:
            return task.result()
        except asyncio.CancelledError:
            if expired:
                raise _timeout(timeout) from None
            raise

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


def run_blocking(coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """Run ``coro`` on corral's loop and wait at most ``timeout`` seconds.

    Raises:
        RuntimeError: when called from corral's loop itself (it would deadlock).
        RequestTimeout: the coroutine did not finish in time (it is cancelled).
        KeyboardInterrupt: Ctrl-C during the call (the coroutine is cancelled).
    """
    return _the_keeper().run(coro, timeout)


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

    def _call(self, coro: Coroutine[Any, Any, T], wait: float | EllipsisType | None = ...) -> T:
        """Run ``coro`` on the background loop; block ``wait`` s at most (or :meth:`_wait`'s)."""
        return run_blocking(coro, self._wait() if wait is ... else wait)

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

"""The blocking faces of corral's async objects: one private loop, one base class.

corral is async-first; every blocking class (``SyncEnvClient``, ``SyncEnvPool``,
``SyncProvider``, ``SyncWarmPool``) is a thin twin of an async one. The twins run the
async methods on a private event loop in a daemon thread (:func:`background_loop`),
instead of ``asyncio.run``, so they work from plain scripts, from other threads and
from inside a running loop such as Jupyter's; and the async object's background tasks
(keepalive, reconnects, health checks) go on between two blocking calls.

:class:`BlockingTwin` is what the twins share: run a coroutine there and wait at most a
given time (:class:`~corral.errors.RequestTimeout` after), and the context manager.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from types import EllipsisType, TracebackType
from typing import Any, Generic, Self, TypeVar

from corral import runtime
from corral.errors import RequestTimeout

T = TypeVar("T")
W = TypeVar("W")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The shared background loop, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = runtime.loop_factory()()  # uvloop when installed: this loop is corral's
            thread = threading.Thread(target=loop.run_forever, name="corral-sync-loop", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def run_blocking(coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """Run ``coro`` on the background loop and wait at most ``timeout`` seconds.

    Raises:
        RuntimeError: when called from the background loop itself (it would deadlock).
        RequestTimeout: the coroutine did not finish in time (it is cancelled).
    """
    loop = background_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("a blocking corral call was made from corral's own event loop")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise RequestTimeout(
            f"call did not finish within {timeout} s", details={"timeout_s": timeout}
        ) from None


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

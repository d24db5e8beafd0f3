"""A private event loop in a daemon thread, for the blocking faces of async objects.

Running coroutines there (instead of ``asyncio.run``) lets blocking clients work from
plain scripts, from threads, and from inside a running loop such as Jupyter's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from corral import runtime

T = TypeVar("T")

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
        TimeoutError: the coroutine did not finish in time (it is cancelled).
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
        raise TimeoutError(f"call did not finish within {timeout} s") from None

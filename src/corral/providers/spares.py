"""Warm spares: K started servers kept ready, so that getting one is a queue pop.

    async with WarmPool(LocalProcessProvider(), "path/to/my_env", size=4) as spares:
        await spares.wait_full()                 # optional: block until 4 are ready
        endpoint = await spares.acquire()        # a ready server, no cold start
        ...                                      # use it exclusively
        await spares.release(endpoint)           # stop it; a replacement is already coming

The pool works with any :class:`~corral.providers.base.Provider`. Its servers start
concurrently: filling the pool starts every missing spare at once (their starts overlap;
on a small machine they still share its cores). Acquiring pops a ready
server (after a cheap liveness check) and immediately starts a replacement in the
background; when none is ready, the caller waits for the next one to finish starting.
A background health check (``/health`` every ``health_interval`` seconds) removes a spare
that died or stopped answering and starts another. Starts that keep failing back off
exponentially; after ``max_failures`` in a row, waiting callers get the last error
instead of waiting forever.

Acquired servers belong to the caller until :meth:`WarmPool.release`; :meth:`close`
stops the spares and the starts in flight (and, with ``stop_acquired=True``, the servers
handed out too).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from corral.blocking import BlockingTwin
from corral.errors import ServerStartError
from corral.progress import Activity
from corral.providers.base import Endpoint, Provider, ServerSpec, SpecLike
from corral.runtime import wait_event, wait_for


@dataclass(frozen=True)
class SpareStats:
    """Counters of a :class:`WarmPool`.

    Attributes:
        ready: spares ready to be acquired now.
        starting: starts in flight.
        acquired: servers handed out and not released.
        started: servers started successfully since the pool opened.
        replaced: spares found dead or unhealthy and replaced.
        failures: starts that failed.
        waiting: callers waiting for a spare.
    """

    ready: int
    starting: int
    acquired: int
    started: int
    replaced: int
    failures: int
    waiting: int


class WarmPool:
    """Keep ``size`` servers of ``spec`` started on ``provider`` (see the module docstring).

    Args:
        provider: where servers run.
        spec: what each server serves.
        size: how many ready spares to keep (K >= 1).
        health_interval: seconds between health checks of the ready spares.
        max_failures: consecutive failed starts after which waiting callers get the error.
        start_options: provider-specific keyword arguments of ``provider.start``.
        progress: show a progress bar (on stderr) while :meth:`wait_full` waits, then a
            one-line summary (default: when stderr is a terminal).
    """

    def __init__(
        self,
        provider: Provider,
        spec: SpecLike,
        *,
        size: int = 2,
        health_interval: float = 5.0,
        max_failures: int = 3,
        start_options: Mapping[str, Any] | None = None,
        progress: bool | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        if health_interval <= 0:
            raise ValueError(f"health_interval must be positive, got {health_interval}")
        if max_failures < 1:
            raise ValueError(f"max_failures must be at least 1, got {max_failures}")
        self.provider = provider
        self.spec = ServerSpec.of(spec)
        self.size = size
        self.health_interval = health_interval
        self.max_failures = max_failures
        self.start_options = dict(start_options or {})
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._ready: deque[Endpoint] = deque()
        self._waiters: deque[asyncio.Future[Endpoint]] = deque()
        self._starting: set[asyncio.Task[None]] = set()
        self._acquired: dict[str, Endpoint] = {}
        self._health: asyncio.Task[None] | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._changed = asyncio.Event()
        self._opened = False
        self._closed = False
        self._started = 0
        self._replaced = 0
        self._failures = 0
        self._consecutive_failures = 0
        self._last_error: BaseException | None = None

    # ------------------------------------------------------------------ public

    async def open(self) -> Self:
        """Start filling the pool (returns at once; see :meth:`wait_full`)."""
        if self._closed:
            raise ServerStartError("the warm pool is closed; create a new one")
        if not self._opened:
            self._opened = True
            self._fill()
            self._health = asyncio.create_task(self._health_loop(), name="corral-spares-health")
        return self

    async def wait_full(self, timeout: float | None = None) -> None:
        """Wait until ``size`` spares are ready.

        Raises:
            TimeoutError: not full within ``timeout`` seconds.
            ServerStartError: starts keep failing (the last error is the cause).
        """
        await self.open()
        if len(self._ready) >= self.size or not self.progress:
            await self._wait_full(timeout, None)
            return
        title = f"starting {self.size} spare servers of {self.spec.target}"
        with Activity(title, total=self.size) as activity:
            await self._wait_full(timeout, activity)
            activity.done(f"{self.size} spare servers ready in {activity.seconds:.1f} s")

    async def _wait_full(self, timeout: float | None, activity: Activity | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._ready) < self.size:
            if activity is not None:
                activity.update(len(self._ready))
            self._raise_if_failing()
            self._changed.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"the warm pool did not fill {self.size} spares in time")
            await wait_event(self._changed, remaining)

    async def acquire(self, timeout: float | None = None) -> Endpoint:
        """A ready server for the caller's exclusive use; a replacement starts at once.

        Raises:
            TimeoutError: none was ready within ``timeout`` seconds.
            ServerStartError: the pool is closed, or starts keep failing.
        """
        await self.open()
        while self._ready:
            endpoint = self._ready.popleft()
            self._fill()
            if await self.provider.alive(endpoint):
                self._acquired[endpoint.id] = endpoint
                return endpoint
            self._replaced += 1
            await self._discard(endpoint)
        self._raise_if_failing()
        waiter: asyncio.Future[Endpoint] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._fill()
        try:
            endpoint = await wait_for(asyncio.shield(waiter), timeout)
        except (TimeoutError, asyncio.CancelledError):
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # Handed over just as the caller gave up: keep it for the next one.
                self._offer(waiter.result())
            waiter.cancel()
            raise
        self._acquired[endpoint.id] = endpoint
        return endpoint

    async def release(self, endpoint: Endpoint) -> None:
        """Stop a server :meth:`acquire` handed out (servers are not reused)."""
        self._acquired.pop(endpoint.id, None)
        await self.provider.stop(endpoint)

    def stats(self) -> SpareStats:
        """The pool's counters now."""
        return SpareStats(
            ready=len(self._ready),
            starting=len(self._starting),
            acquired=len(self._acquired),
            started=self._started,
            replaced=self._replaced,
            failures=self._failures,
            waiting=sum(not w.done() for w in self._waiters),
        )

    @property
    def ready(self) -> list[Endpoint]:
        """The spares ready now (oldest first)."""
        return list(self._ready)

    async def close(self, *, stop_acquired: bool = False) -> None:
        """Stop the spares and the starts in flight; waiting callers get an error.

        Args:
            stop_acquired: also stop the servers handed out and not released.
        """
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        tasks = [t for t in (self._health, *self._starting) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        closed = ServerStartError("the warm pool was closed")
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(closed)
                # Retrieved here so that a waiter nobody awaits any more is not reported.
                waiter.exception()
        spares = list(self._ready)
        self._ready.clear()
        if stop_acquired:
            spares += list(self._acquired.values())
            self._acquired.clear()
        await asyncio.gather(*(self._discard(e) for e in spares), return_exceptions=True)

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def sync(self) -> SyncWarmPool:
        """A blocking twin of this pool (its tasks run on corral's background loop)."""
        return SyncWarmPool(self)

    # ------------------------------------------------------------------ internals

    def _raise_if_failing(self) -> None:
        if self._closed:
            raise ServerStartError("the warm pool is closed; create a new one")
        if self._consecutive_failures >= self.max_failures and self._last_error is not None:
            raise ServerStartError(
                f"the warm pool's last {self._consecutive_failures} starts failed: "
                f"{self._last_error}",
                details={"failures": self._consecutive_failures},
            ) from self._last_error

    def _fill(self) -> None:
        """Start as many servers as needed for ``size`` spares plus the waiting callers."""
        if self._closed or not self._opened or self._retry is not None:
            return
        waiting = sum(not w.done() for w in self._waiters)
        deficit = self.size + waiting - len(self._ready) - len(self._starting)
        for _ in range(max(0, deficit)):
            task = asyncio.create_task(self._start_one(), name="corral-spares-start")
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> None:
        try:
            endpoint = await self.provider.start(self.spec, **self.start_options)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(exc)
            return
        self._started += 1
        self._consecutive_failures = 0
        self._last_error = None
        if self._closed:
            await self._discard(endpoint)
            return
        self._offer(endpoint)

    def _offer(self, endpoint: Endpoint) -> None:
        """Give ``endpoint`` to the first waiting caller, or keep it ready."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(endpoint)
                return
        self._ready.append(endpoint)
        self._changed.set()  # wait_full() checks whether the pool is full, and shows progress

    def _failed(self, exc: BaseException) -> None:
        self._failures += 1
        self._consecutive_failures += 1
        self._last_error = exc
        if self._consecutive_failures >= self.max_failures:
            failing = ServerStartError(
                f"the warm pool's last {self._consecutive_failures} starts failed: {exc}",
                details={"failures": self._consecutive_failures},
            )
            failing.__cause__ = exc
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(failing)
            self._changed.set()  # wake wait_full() so that it raises
        if self._retry is None and not self._closed:
            delay = min(30.0, 0.25 * 2 ** (self._consecutive_failures - 1))
            self._retry = asyncio.get_running_loop().call_later(delay, self._retry_now)

    def _retry_now(self) -> None:
        self._retry = None
        self._fill()

    async def _discard(self, endpoint: Endpoint) -> None:
        with contextlib.suppress(Exception):
            await self.provider.stop(endpoint)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            for endpoint in list(self._ready):
                if await self.provider.healthy(endpoint):
                    continue
                with contextlib.suppress(ValueError):
                    self._ready.remove(endpoint)
                    self._replaced += 1
                    await self._discard(endpoint)
            self._fill()


class SyncWarmPool(BlockingTwin[WarmPool]):
    """The blocking twin of :class:`WarmPool` (same methods, same errors)."""

    @property
    def pool(self) -> WarmPool:
        """The async pool this twin drives."""
        return self._async

    def open(self) -> Self:
        """See :meth:`WarmPool.open`."""
        self._call(self._async.open())
        return self

    def wait_full(self, timeout: float | None = None) -> None:
        """See :meth:`WarmPool.wait_full`."""
        self._call(self._async.wait_full(timeout))

    def acquire(self, timeout: float | None = None) -> Endpoint:
        """See :meth:`WarmPool.acquire`."""
        return self._call(self._async.acquire(timeout))

    def release(self, endpoint: Endpoint) -> None:
        """See :meth:`WarmPool.release`."""
        self._call(self._async.release(endpoint))

    def stats(self) -> SpareStats:
        """See :meth:`WarmPool.stats`."""
        return self._async.stats()

    def close(self, *, stop_acquired: bool = False) -> None:
        """See :meth:`WarmPool.close`."""
        self._call(self._async.close(stop_acquired=stop_acquired))

    def _enter(self) -> None:
        self.open()

"""Running one environment instance's methods without blocking the event loop.

``async def`` methods are awaited on the loop, in the caller's task; plain methods run in
a thread pool (a dedicated single thread when the environment asks for thread affinity).
Every call has an optional timeout; a call that overruns is abandoned, and the instance
is closed once its thread lets go of it, so a stuck environment never wedges the server.

A thread cannot be killed, so a sync call that overran keeps its thread until it
returns; the shared pool (:class:`EnvThreads`) then retires that thread's pool and
carries on with a fresh one, so hung environments never starve the others of threads.

Whatever an environment raises stays an ordinary exception of its call: ``SystemExit``,
``KeyboardInterrupt`` and other ``BaseException`` types are turned into ``EnvError``
where they are raised, since asyncio would otherwise let them stop the whole server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, Protocol, TypeVar

from corral.contract import Environment
from corral.errors import EnvError, FactoryError, StepTimeout

T = TypeVar("T")
P = ParamSpec("P")

EnvFactory = Callable[[], Environment[Any, Any, Any]]


class EnvThreads(concurrent.futures.Executor):
    """The thread pool shared by sync environments, renewed when a call gets stuck.

    :meth:`abandon` is told about a call that overran its timeout and still runs: the
    current pool is retired (its other calls finish, its threads exit as they return)
    and new calls go to a fresh pool of the same size.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.renewed = 0
        """How many times a stuck call made the pool be replaced."""
        self._pool = self._new_pool()
        self._owner: weakref.WeakKeyDictionary[
            concurrent.futures.Future[Any], concurrent.futures.ThreadPoolExecutor
        ] = weakref.WeakKeyDictionary()

    def _new_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="corral-env")

    def submit(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` on the current pool."""
        future = self._pool.submit(fn, *args, **kwargs)
        self._owner[future] = self._pool
        return future

    def abandon(self, future: concurrent.futures.Future[Any]) -> None:
        """``future`` overran and still holds a thread: move on to a fresh pool."""
        if future.done() or self._owner.get(future) is not self._pool:
            return  # finished meanwhile, or its pool was already retired
        retired, self._pool = self._pool, self._new_pool()
        retired.shutdown(wait=False)
        self.renewed += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Shut the current pool down (retired pools are winding down already)."""
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)


class Runner(Protocol):
    """What a session runs its environment's methods through.

    :class:`EnvRunner` runs them in this process; a worker runner
    (:mod:`corral.server.workers`) runs them in a worker process.
    """

    closed: bool

    async def call(self, method: str, *args: Any, timeout: float | None, **kwargs: Any) -> Any:
        """Run ``env.<method>(*args, **kwargs)`` and return its result."""
        ...

    async def close(self) -> None:
        """Close the environment (once)."""
        ...


class EnvRunner:
    """Owns one environment instance and runs its methods."""

    def __init__(
        self,
        env: Environment[Any, Any, Any],
        executor: concurrent.futures.Executor,
        own_executor: bool,
    ) -> None:
        self.env = env
        self._executor = executor
        self._own_executor = own_executor
        self._async = {m: inspect.iscoroutinefunction(getattr(env, m)) for m in _METHODS}
        self._stuck: asyncio.Future[Any] | concurrent.futures.Future[Any] | None = None
        self.closed = False

    @classmethod
    async def create(
        cls,
        factory: EnvFactory,
        shared: concurrent.futures.Executor,
        *,
        thread_affinity: bool,
        timeout: float | None,
    ) -> EnvRunner:
        """Build an environment with ``factory`` off the loop.

        Raises:
            FactoryError: the factory raised or overran ``timeout``.
        """
        executor: concurrent.futures.Executor = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="corral-env")
            if thread_affinity
            else shared
        )
        job = executor.submit(_guarded, "factory", factory)
        try:
            env = await asyncio.wait_for(asyncio.wrap_future(job), timeout)
        except Exception as exc:
            if isinstance(executor, EnvThreads):
                executor.abandon(job)
            if thread_affinity:
                executor.shutdown(wait=False)
            kind = "timed out" if isinstance(exc, TimeoutError) else f"raised {exc!r}"
            raise FactoryError(
                f"the environment factory {kind}",
                details={"factory": getattr(factory, "__qualname__", repr(factory))},
            ) from exc
        return cls(env, executor, own_executor=thread_affinity)

    @property
    def shared(self) -> bool:
        """True when calls run on the server's shared pool (no thread affinity)."""
        return not self._own_executor

    @property
    def executor(self) -> concurrent.futures.Executor:
        """The executor this runner's sync calls run on."""
        return self._executor

    def is_async(self, method: str) -> bool:
        """True when ``env.<method>`` is ``async def`` (awaited on the loop, no thread hop)."""
        return self._async[method]

    def mark_stuck(self, future: concurrent.futures.Future[Any]) -> None:
        """A thread is still inside the env after a timeout; close once ``future`` is done."""
        self._stuck = future

    def timeout_error(self, method: str, timeout: float) -> StepTimeout:
        """The error for a call of ``method`` that overran ``timeout``."""
        return StepTimeout(
            f"{method}() did not return within {timeout:g} s; the session was closed",
            details={"method": method, "timeout_s": timeout, "session": "closed"},
        )

    async def call(self, method: str, *args: Any, timeout: float | None, **kwargs: Any) -> Any:
        """Run ``env.<method>(*args, **kwargs)``; exceptions of the env propagate.

        ``async def`` methods are awaited in the caller's task (no extra task, no thread);
        sync methods make one hop to the executor.

        Raises:
            StepTimeout: the call overran ``timeout``; this runner is then unusable.
        """
        fn = getattr(self.env, method)
        is_async = self._async.get(method)
        if is_async is None:  # a tool method, looked up on first use
            is_async = self._async[method] = inspect.iscoroutinefunction(fn)
        job: concurrent.futures.Future[Any] | None = None
        awaitable: Awaitable[Any]
        if is_async:
            awaitable = _guarded_async(method, fn(*args, **kwargs))
        else:
            job = self._executor.submit(_guarded, method, functools.partial(fn, *args, **kwargs))
            awaitable = asyncio.wrap_future(job)
        if timeout is None:
            return await awaitable
        # One timer handle per call (asyncio.timeout costs several times more on this
        # path): on expiry it cancels the waiting task, and the cancellation is ours.
        task = asyncio.current_task()
        assert task is not None
        overran = False

        def expire() -> None:
            nonlocal overran
            overran = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(timeout, expire)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if not overran or task.uncancel() > 0:
                raise  # someone else cancelled the request too
            if job is not None:
                # The stuck call is the thread's future: it is done only when the thread
                # lets go of the env, which is when the env may be closed.
                self._stuck = job
                if not job.cancel() and isinstance(self._executor, EnvThreads):
                    self._executor.abandon(job)  # it runs (a queued call was just cancelled)
            raise self.timeout_error(method, timeout) from None
        finally:
            timer.cancel()

    async def close(self) -> None:
        """Call ``env.close()`` once; after a timeout, once the stuck call has returned."""
        if self.closed:
            return
        self.closed = True
        if self._stuck is not None and not self._stuck.done():
            # The stuck thread still uses the env: close it when the thread lets go.
            self._stuck.add_done_callback(lambda _: self._close_sync())
            return
        if self._async["close"]:
            with contextlib.suppress(Exception):
                await _guarded_async("close", self.env.close())  # type: ignore[func-returns-value,arg-type]
        else:
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(self._executor.submit(_guarded, "close", self.env.close))
        if self._own_executor:
            self._executor.shutdown(wait=False)

    def _close_sync(self) -> None:
        with contextlib.suppress(Exception):
            if not self._async["close"]:
                self._executor.submit(_guarded, "close", self.env.close)
        if self._own_executor:
            self._executor.shutdown(wait=False)


_METHODS = ("reset", "step", "state", "close")


def _escaped(method: str, exc: BaseException) -> EnvError:
    return EnvError(
        f"{type(exc).__name__}: {exc}",
        details={"exception": type(exc).__name__, "op": method},
    )


def _guarded(method: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` (in a worker thread); a non-``Exception`` it raises becomes ``EnvError``."""
    try:
        return fn()
    except Exception:
        raise
    except BaseException as exc:
        raise _escaped(method, exc) from None


async def _guarded_async(method: str, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``; a non-``Exception`` it raises (cancellation aside) becomes
    ``EnvError`` inside this task, before asyncio could re-raise it out of the loop."""
    try:
        return await awaitable
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:
        raise _escaped(method, exc) from None

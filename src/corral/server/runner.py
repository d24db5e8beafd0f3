"""Running one environment instance's methods without blocking the event loop.

``async def`` methods are awaited on the loop, in the caller's task; plain methods run in
a thread pool (a dedicated single thread when the environment asks for thread affinity).
Every call has an optional timeout; a call that overruns is abandoned, and the instance
is closed once its thread lets go of it, so a stuck environment never wedges the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
from collections.abc import Callable
from typing import Any, Protocol

from corral.contract import Environment
from corral.errors import FactoryError, StepTimeout

EnvFactory = Callable[[], Environment[Any, Any, Any]]


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
        self._stuck: concurrent.futures.Future[Any] | None = None
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
        loop = asyncio.get_running_loop()
        try:
            env = await asyncio.wait_for(loop.run_in_executor(executor, factory), timeout)
        except Exception as exc:
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
        if self._async[method]:
            awaitable = fn(*args, **kwargs)
            stuck = None
        else:
            stuck = self._executor.submit(fn, *args, **kwargs)
            awaitable = asyncio.wrap_future(stuck)
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
            if stuck is not None:
                self._stuck = stuck
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
                await self.env.close()  # type: ignore[func-returns-value,misc]
        else:
            loop = asyncio.get_running_loop()
            with contextlib.suppress(Exception):
                await loop.run_in_executor(self._executor, self.env.close)
        if self._own_executor:
            self._executor.shutdown(wait=False)

    def _close_sync(self) -> None:
        with contextlib.suppress(Exception):
            if not self._async["close"]:
                self._executor.submit(self.env.close)
        if self._own_executor:
            self._executor.shutdown(wait=False)


_METHODS = ("reset", "step", "state", "close")

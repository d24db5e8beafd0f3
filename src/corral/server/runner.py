"""Running one environment instance's methods without blocking the event loop.

``async def`` methods are awaited on the loop, in the caller's task (or, through
:meth:`EnvRunner.start`, run in their own task only and answered from its callback: a
server holding 100,000 waiting steps holds one task each and no timer, their deadlines
filed by :class:`~corral.server.deadlines.Deadlines`); plain methods run in
a thread pool (a dedicated single thread when the environment asks for thread affinity),
except **fast** ones: each runner keeps a moving average (EWMA) of each sync method's
time, and while it stays under ``inline_s`` (``ServerConfig.inline_step_s``, ~100 µs)
the method runs inline on the loop, saving the thread hop (submit, wake-up, GIL
hand-off: ~125 µs of CPU, more than such a step itself). A method's first calls run in
the executor to measure it; one slow call lifts the average over the bound and moves it
back to the executor, where the step timeout holds (a call the OS merely preempted,
on the loop or in a worker thread, counts its CPU time instead, see
:class:`_Preemption`). ``blocking = True`` on the class, and thread affinity, keep
every call off the loop.
Every call has an optional timeout; a call that overruns is abandoned, and the instance
is closed once its thread lets go of it, so a stuck environment never wedges the server.

A thread cannot be killed, so a sync call that overran keeps its thread until it
returns; the shared pool (:class:`EnvThreads`) then retires that thread's pool and
carries on with a fresh one, so hung environments never starve the others of threads.
Those abandoned threads are counted (:attr:`EnvThreads.hung`, a thread-affinity
session's own thread included) until they return: past the server's bound
(``ServerConfig.max_hung_calls``) the server reports itself not ready and refuses new
sessions, since each hung call holds a thread and whatever the environment holds.

Whatever an environment raises stays an ordinary exception of its call: ``SystemExit``,
``KeyboardInterrupt`` and other ``BaseException`` types are turned into ``EnvError``
where they are raised, since asyncio would otherwise let them stop the whole server.

:func:`run_calls` runs many sessions' calls at once (a batch), grouped by where they
run: async environments concurrently on the loop, sync ones of the shared pool one after
the other in one executor call (a stuck one moves the rest to a fresh call), sessions
with thread affinity on their own threads, and worker-process sessions in one frame per
worker. The worker processes run their share with it too.

One module, over 500 lines, because it is one rule: where a call runs and how long it
may take. The single-call runner, the shared pool and the batch paths share the moving
average, the guarded calls and the timeout handling.
"""

from __future__ import annotations

import asyncio
import collections.abc
import concurrent.futures
import contextlib
import functools
import inspect
import resource
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ParamSpec, Protocol, TypeVar

from corral import runtime
from corral.contract import Environment
from corral.errors import EnvError, FactoryError, SessionLost, StepTimeout
from corral.server.deadlines import Deadlines

T = TypeVar("T")
P = ParamSpec("P")

EnvFactory = Callable[[], Environment[Any, Any, Any]]

INLINE_S = 100e-6
"""Default bound of a sync method's average time for running it inline on the loop."""
_ALPHA = 0.2
"""Weight of the newest call in the moving average: one call 50x over the bound lifts
the average past it, so a method that turns slow leaves the loop at its next call."""
MAX_INLINE_S = 1e-3
"""The most a measured thread hop raises the inline bound to (see
:attr:`EnvThreads.hop_s`): past a millisecond a call runs off the loop however dear the
hop, so that one whose wait lets go of the GIL (I/O) lets other sessions' calls run."""


class Runner(Protocol):
    """What a session runs its environment's methods through.

    :class:`EnvRunner` runs them in this process; a worker runner
    (:mod:`corral.server.workers`) runs them in a worker process.
    """

    closed: bool

    async def call(
        self,
        method: str,
        /,
        *args: Any,
        timeout: float | None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run ``env.<method>(*args, **kwargs)`` and return its result.

        The environment's keywords come as one mapping, never as this method's own
        keywords: a reset option or tool argument named ``method`` or ``timeout`` is the
        environment's, and can never be taken for the runner's (issue 30.12).
        """
        ...

    async def close(self) -> None:
        """Close the environment (once)."""
        ...


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
        self._hung: set[concurrent.futures.Future[Any]] = set()
        self._hung_lock = threading.Lock()
        self._pool = self._new_pool()
        self.hop_s = 0.0
        """Moving average of what a batch's trip through the pool costs beyond its calls'
        own time (submit, wake-ups, GIL hand-offs, the reply's way back to the loop).
        A call cheaper than that runs inline even over its runner's bound (up to
        :data:`MAX_INLINE_S`): leaving the loop would cost more than it saves, and a
        call that holds the GIL blocks the loop from a thread all the same. On a loaded
        machine a hop costs milliseconds, and a ~50 µs seeded reset measured at ~100 µs
        hopped for a third of a PPO run's steps (issue 34). 0 until a hop is measured;
        it then holds until the next one."""
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

    def observe_hop(self, seconds: float) -> None:
        """Fold one measured hop's overhead into :attr:`hop_s`."""
        self.hop_s += _ALPHA * (seconds - self.hop_s)

    def abandon(self, future: concurrent.futures.Future[Any]) -> None:
        """``future`` overran and still holds a thread: move on to a fresh pool."""
        if future.done() or self._owner.get(future) is not self._pool:
            return  # finished meanwhile, or its pool was already retired
        retired, self._pool = self._pool, self._new_pool()
        retired.shutdown(wait=False)
        self.renewed += 1

    def hang(self, future: concurrent.futures.Future[Any]) -> None:
        """``future``'s call overran its timeout and still holds a thread: count it as
        hung until it returns (whichever executor runs it)."""
        with self._hung_lock:
            if future.done():
                return
            self._hung.add(future)
        future.add_done_callback(self._returned)  # runs at once if it returned meanwhile

    def _returned(self, future: concurrent.futures.Future[Any]) -> None:
        with self._hung_lock:  # called from the thread that ran it
            self._hung.discard(future)

    @property
    def hung(self) -> int:
        """Calls abandoned after a timeout whose threads have not returned yet."""
        return len(self._hung)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Shut the current pool down (retired pools are winding down already)."""
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)


class EnvRunner:
    """Owns one environment instance and runs its methods.

    One per session, so it is kept small (a server holds 100,000 of them): slotted, the
    table of which methods are ``async def`` shared by every runner of an environment
    class, and the moving averages made on the first measured call.
    """

    __slots__ = (
        "_async",
        "_executor",
        "_own_executor",
        "_stuck",
        "_threads",
        "closed",
        "env",
        "ewma",
        "inline_s",
    )

    def __init__(
        self,
        env: Environment[Any, Any, Any],
        executor: concurrent.futures.Executor,
        own_executor: bool,
        threads: EnvThreads | None = None,
        inline_s: float = INLINE_S,
    ) -> None:
        self.env = env
        self._executor = executor
        self._own_executor = own_executor
        self._threads = threads if threads is not None else _as_threads(executor)
        self.inline_s = 0.0 if own_executor or getattr(env, "blocking", False) else inline_s
        """Sync methods averaging under this run inline on the loop (0: never)."""
        self.ewma: dict[str, float] = _UNMEASURED
        """Moving average of each sync method's time (seconds), once measured."""
        self._async = _async_methods(type(env))
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
        inline_s: float = INLINE_S,
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
        job = executor.submit(guarded, "factory", factory)
        try:
            env = await runtime.wait_for(asyncio.wrap_future(job), timeout)
        except Exception as exc:
            threads = _as_threads(shared)
            if threads is not None and isinstance(exc, TimeoutError):
                threads.hang(job)
            if isinstance(executor, EnvThreads):
                executor.abandon(job)
            if thread_affinity:
                executor.shutdown(wait=False)
            raise factory_error(factory, exc) from exc
        return cls(
            env,
            executor,
            own_executor=thread_affinity,
            threads=_as_threads(shared),
            inline_s=inline_s,
        )

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
        is_async = self._async.get(method)
        if is_async is None:  # a tool method, looked up on first use (for the whole class)
            is_async = self._async[method] = inspect.iscoroutinefunction(getattr(self.env, method))
        return is_async

    def inline(self, method: str) -> bool:
        """True when sync ``env.<method>`` measures fast enough to run on the loop: under
        ``inline_s``, or under what a hop through the shared pool costs now (at most
        :data:`MAX_INLINE_S`; see :attr:`EnvThreads.hop_s`)."""
        ewma = self.ewma.get(method)
        if ewma is None or self.inline_s <= 0:
            return False
        if ewma < self.inline_s:
            return True
        threads = self._threads
        return threads is not None and ewma < min(threads.hop_s, MAX_INLINE_S)

    def observe(self, method: str, seconds: float) -> None:
        """Fold one call's time into ``method``'s moving average."""
        ewma = self.ewma
        if ewma is _UNMEASURED:
            ewma = self.ewma = {}
        old = ewma.get(method)
        ewma[method] = seconds if old is None else old + _ALPHA * (seconds - old)

    def mark_stuck(self, job: concurrent.futures.Future[Any]) -> None:
        """A thread is still inside the env after a timeout: close the env once ``job`` is
        done, and let the shared pool move on to fresh threads."""
        self._stuck = job
        if job.cancel():
            return  # it never started: no thread is held
        if self._threads is not None:
            self._threads.hang(job)
        if isinstance(self._executor, EnvThreads):
            self._executor.abandon(job)

    def abandon(self, call: asyncio.Future[Any]) -> None:
        """An async call overran its timeout: close the env once it lets go of it."""
        self._stuck = call

    def timeout_error(self, method: str, timeout: float) -> StepTimeout:
        """The error for a call of ``method`` that overran ``timeout``."""
        return StepTimeout(
            f"{method}() did not return within {timeout:g} s; the session was closed",
            details={"method": method, "timeout_s": timeout, "session": "closed"},
        )

    async def call(
        self,
        method: str,
        /,
        *args: Any,
        timeout: float | None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run ``env.<method>(*args, **kwargs)``; exceptions of the env propagate.

        The environment's keywords are ``kwargs``, a mapping (see :meth:`Runner.call`).

        An ``async def`` method starts in the caller's task: if it finishes without
        suspending (no I/O to wait for) it costs no task and no timer at all; if it
        suspends, it finishes in a task of its own, so that the timeout answers on time
        even if the method ignores its cancellation. A sync method measured fast runs
        inline (see the module docstring); any other makes one hop to the executor.

        Raises:
            StepTimeout: the call overran ``timeout``; this runner is then unusable.
        """
        fn = getattr(self.env, method)
        if kwargs is None:
            kwargs = _NO_KWARGS
        job: concurrent.futures.Future[Any] | None = None
        if self.is_async(method):
            future: asyncio.Future[Any] = eager_start(fn(*args, **kwargs), method)
            if future.done():
                return future.result()
        elif self.inline(method):
            started = time.perf_counter()
            try:
                return guarded(method, fn, *args, **kwargs)  # no partial per step
            finally:
                self.observe(method, time.perf_counter() - started)
        else:
            call = functools.partial(fn, *args, **kwargs)
            own = [0.0]  # the call's own time, measured in the thread
            submitted = time.perf_counter()
            job = self._executor.submit(_timed, self, method, call, own)
            future = asyncio.wrap_future(job)
        if timeout is None:
            value = await future
        elif await within(future, timeout):
            value = future.result()
        else:
            # For a thread, the stuck call is the thread's future: it is done only when
            # the thread lets go of the env, which is when the env may be closed.
            future.cancel()
            if job is not None:
                self.mark_stuck(job)
            else:
                self._stuck = future
            raise self.timeout_error(method, timeout)
        if job is not None:
            _hopped(self._executor, submitted, own[0])
        return value

    def start(
        self,
        method: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        deadlines: Deadlines,
        then: Callable[[Any, Any, BaseException | None], None],
        token: Any,
    ) -> Running | None:
        """Start ``async def env.<method>(*args, **kwargs)`` with no coroutine of ours
        around it.

        ``then(token, value, error)`` is called exactly once: with the method's value,
        with what it raised, with :class:`~corral.errors.StepTimeout` at the deadline
        ``deadlines`` sets (the call is then abandoned, as :meth:`call` does), or with
        ``CancelledError`` at once when the returned handle is cancelled (its session
        closed), whether the method heeds its cancellation or not. Returns that handle,
        or None when the method completed without waiting (``then`` was called already).

        What :meth:`call` gives a waiting call, for a server that holds 100,000 of them
        (issue 34): one task (the environment's own) and one handle, no timer, no
        waiter, no second task, no coroutine of the caller's and no copied context;
        ``then`` is shared by every call and ``token`` says which call it is.
        """
        fn = getattr(self.env, method)
        try:
            coro = fn(*args, **kwargs) if kwargs else fn(*args)  # no ``**{}`` dict per step
            future = eager_start(coro, method)
        except Exception as exc:  # the call itself raised (a wrong signature)
            then(token, None, exc)
            return None
        if future.done():
            _settle(future, then, token)
            return None
        return Running(self, method, future, deadlines, then, token)

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
                await asyncio.wrap_future(self._executor.submit(guarded, "close", self.env.close))
        if self._own_executor:
            self._executor.shutdown(wait=False)

    def _close_sync(self) -> None:
        with contextlib.suppress(Exception):
            if not self._async["close"]:
                self._executor.submit(guarded, "close", self.env.close)
        if self._own_executor:
            self._executor.shutdown(wait=False)


class Running:
    """An ``async def`` environment call in its task, watched by its server's
    :class:`~corral.server.deadlines.Deadlines` (see :meth:`EnvRunner.start`); ``done``
    and ``cancel`` as the task's, for the session that holds it. It is the task's done
    callback itself (no bound method per call)."""

    __slots__ = ("answered", "at", "deadlines", "future", "method", "runner", "then", "token")

    def __init__(
        self,
        runner: EnvRunner,
        method: str,
        future: asyncio.Future[Any],
        deadlines: Deadlines,
        then: Callable[[Any, Any, BaseException | None], None],
        token: Any,
    ) -> None:
        self.runner, self.method, self.future, self.deadlines = runner, method, future, deadlines
        self.then: Callable[[Any, Any, BaseException | None], None] | None = then
        self.token = token
        self.answered: asyncio.Future[None] | None = None
        """Made by :meth:`wait` only: what a waiter for the answer waits on."""
        self.at = deadlines.watch(self)
        future.add_done_callback(self, context=deadlines.context)

    def done(self) -> bool:
        """True once answered (or the call finished and its answer is on its way)."""
        return self.then is None or self.future.done()

    def cancel(self) -> bool:
        """The session closed under the call: cancel it and answer ``CancelledError`` now."""
        then = self._take()
        if then is None:
            return False
        self.future.cancel()
        then(self.token, None, asyncio.CancelledError())
        return True

    async def wait(self) -> None:
        """Wait until the call is answered (a stubborn call stops counting at its
        timeout or its cancellation, as its caller's answer does)."""
        if self.then is None:
            return
        if self.answered is None:
            self.answered = self.future.get_loop().create_future()
        await asyncio.shield(self.answered)

    def _take(self) -> Callable[[Any, Any, BaseException | None], None] | None:
        """The answer callback, once: later outcomes find None."""
        then, self.then = self.then, None
        if self.at is not None:
            self.deadlines.drop(self, self.at)
            self.at = None
        if self.answered is not None and not self.answered.done():
            self.answered.set_result(None)  # its waiter resumes after the answer, given now
        return then

    def __call__(self, future: asyncio.Future[Any]) -> None:
        """The task ended: answer with its outcome (unless answered already)."""
        then = self._take()
        if then is not None:
            _settle(future, then, self.token)

    def overran(self) -> None:
        """The deadline passed (:class:`~corral.server.deadlines.Deadlines`)."""
        self.at = None  # its slot is gone
        if self.future.done():
            return  # its done callback is on its way
        then = self._take()
        timeout = self.deadlines.timeout
        assert then is not None and timeout is not None
        self.future.cancel()
        self.runner.abandon(self.future)
        then(self.token, None, self.runner.timeout_error(self.method, timeout))


def _settle(
    future: asyncio.Future[Any],
    then: Callable[[Any, Any, BaseException | None], None],
    token: Any,
) -> None:
    """Hand a finished call's outcome to ``then``."""
    if future.cancelled():
        then(token, None, asyncio.CancelledError())
        return
    error = future.exception()
    then(token, None if error is not None else future.result(), error)


_METHODS = ("reset", "step", "state", "close")
_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})
"""The keywords of a call that has none (read-only: shared by every such call)."""
_UNMEASURED: dict[str, float] = {}
"""Every runner's averages until its first measured call (never written to)."""


_ASYNC_METHODS: dict[type[Any], dict[str, bool]] = {}


def _async_methods(env_type: type[Any]) -> dict[str, bool]:
    """Which of an environment class's methods are ``async def`` (shared by its runners)."""
    found = _ASYNC_METHODS.get(env_type)
    if found is None:
        found = {m: inspect.iscoroutinefunction(getattr(env_type, m)) for m in _METHODS}
        _ASYNC_METHODS[env_type] = found
    return found


def factory_error(factory: EnvFactory, exc: BaseException) -> FactoryError:
    """The error for an environment factory that raised ``exc`` (or timed out)."""
    kind = "timed out" if isinstance(exc, TimeoutError) else f"raised {exc!r}"
    return FactoryError(
        f"the environment factory {kind}",
        details={"factory": getattr(factory, "__qualname__", repr(factory))},
    )


def _as_threads(executor: concurrent.futures.Executor) -> EnvThreads | None:
    return executor if isinstance(executor, EnvThreads) else None


def _escaped(method: str, exc: BaseException) -> EnvError:
    return EnvError(
        f"{type(exc).__name__}: {exc}",
        details={"exception": type(exc).__name__, "op": method},
    )


def _timed(runner: EnvRunner, method: str, fn: Callable[[], T], own: list[float]) -> T:
    """:func:`guarded`, measured for the runner's moving average (in the worker thread:
    the hop is not counted, only the method's own time, also left in ``own[0]``; a call
    the OS preempted counts its CPU time, as on the loop: see :func:`_observe`)."""
    preemption = _Preemption() if runner.inline_s > 0 else None
    started = time.perf_counter()
    try:
        return guarded(method, fn)
    finally:
        own[0] = time.perf_counter() - started
        _observe(runner, method, own[0], preemption)


def _observe(
    runner: EnvRunner, method: str, seconds: float, preemption: _Preemption | None
) -> None:
    """Fold a call's time into ``runner``'s moving average, a call over the inline bound
    that the OS merely preempted counting its CPU time (:class:`_Preemption`).

    The same rule wherever the call ran: once a method is off the loop, its calls are
    measured in a worker thread, and on a busy machine a preempted one reads as
    milliseconds; counted as such, one spike kept a ~50 µs reset off the loop for ~15
    calls (a thread hop each, two wake-ups on a loaded machine: issue 34), so that it
    came back to the loop only between spikes. ``preemption`` is None for a runner that
    never runs inline (nothing to decide)."""
    if preemption is not None and runner.inline_s > 0:
        if seconds >= runner.inline_s:
            seconds = preemption.cost(seconds)
        else:
            preemption.before += seconds
    runner.observe(method, seconds)


def guarded(method: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` (in a worker thread, or inline on the loop); a
    non-``Exception`` it raises becomes ``EnvError``."""
    try:
        return fn(*args, **kwargs)
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


class _Started(collections.abc.Coroutine[Any, Any, Any]):
    """A coroutine that already ran up to its first suspension, for a task to finish.

    The task's first step gets what the coroutine waits on, the later ones go straight
    to the coroutine: one small object per started call, where a wrapping coroutine and
    a generator cost two more tracked objects and a frame per resumption (a server
    holding 100,000 waiting steps holds one of these each, issue 34). Given a
    ``method``, it is also :func:`_guarded_async` without a coroutine of its own: a
    non-``Exception`` the environment's method raises (cancellation aside) becomes
    ``EnvError`` in the task's step.
    """

    __slots__ = ("coro", "method", "suspended")

    def __init__(self, coro: Coroutine[Any, Any, Any], suspended: Any, method: str | None) -> None:
        self.coro = coro
        self.suspended: Any = suspended
        self.method = method

    def send(self, value: Any) -> Any:
        """The task's step: the first hands over the wait, the rest resume the coroutine."""
        suspended = self.suspended
        if suspended is not _RESUMED:
            self.suspended = _RESUMED
            return suspended
        return self._resume(self.coro.send, value)

    def throw(self, *exc: Any) -> Any:
        """Throw into the coroutine (cancellation, mostly), where it waits."""
        self.suspended = _RESUMED
        return self._resume(self.coro.throw, *exc)

    def _resume(self, resume: Callable[..., Any], *args: Any) -> Any:
        """``resume(*args)``, guarded when the coroutine is an environment method's."""
        if self.method is None:
            return resume(*args)
        try:
            return resume(*args)
        except (Exception, asyncio.CancelledError):
            raise
        except BaseException as exc:
            raise _escaped(self.method, exc) from None

    def close(self) -> None:
        """Close the coroutine."""
        self.coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        raise TypeError("a started coroutine is finished by a task, not awaited")


_RESUMED: Any = object()
"""What :class:`_Started` holds once its task took the first suspension."""


async def within(future: asyncio.Future[Any], timeout: float) -> bool:
    """Wait until ``future`` is done or ``timeout`` seconds passed; True if it is done.

    ``asyncio.wait({future}, timeout=...)`` without its cost: one waiter, one done
    callback and one timer handle, no sets, no task, however the future ends (a call that
    ignores its cancellation still lets its caller go at the deadline). Cancelling the
    caller leaves ``future`` running, as ``asyncio.wait`` does.
    """
    if future.done():
        return True
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: Any = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    timer = waiter.get_loop().call_later(timeout, wake)
    try:
        await waiter
    finally:
        timer.cancel()
        future.remove_done_callback(wake)
    return future.done()


def eager_start(coro: Coroutine[Any, Any, T], method: str | None = None) -> asyncio.Future[T]:
    """Run ``coro`` now, up to its first suspension, and return the future of its result.

    A coroutine that finishes without suspending (an environment with nothing to wait
    for) costs no task: its future is already done. One that suspends finishes in a task
    of its own. (Python 3.12's eager tasks do the same; this works on 3.11 too.) Given
    the environment ``method`` it runs, what it raises is guarded as
    :func:`_guarded_async` does, start and task alike.
    """
    try:
        suspended = coro.send(None)
    except StopIteration as done:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future.set_result(done.value)
        return future
    except Exception as exc:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(exc)
        return future
    except BaseException as exc:
        if method is None or isinstance(exc, asyncio.CancelledError):
            raise
        future = asyncio.get_running_loop().create_future()
        future.set_exception(_escaped(method, exc))
        return future
    return asyncio.get_running_loop().create_task(_Started(coro, suspended, method))


# -- many calls at once (batches) -------------------------------------------------


@dataclass(slots=True, eq=False)
class EnvCall:
    """One environment method call of a batch, and its outcome once run.

    ``value`` holds the method's return value when ``error`` is None; ``seconds`` how
    long the call took (for the latency histogram).
    """

    runner: Any
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    value: Any = None
    error: BaseException | None = None
    seconds: float = 0.0


C = TypeVar("C", bound=EnvCall)


class BatchExecutor(Protocol):
    """Runs a group of calls on their own (worker processes implement this)."""

    async def run_calls(self, calls: Sequence[EnvCall], timeout: float | None) -> None:
        """Run ``calls``, filling in each outcome; never raise for one call's failure."""
        ...


_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)
"""Linux: the calling thread's own resource usage (context switches by kind)."""


class _Preemption:
    """Tells a call the OS preempted from a slow one, for the moving average.

    A call measured over the bound lifts the average and moves the env off the loop.
    On a busy machine the OS also preempts the loop's thread in the middle of a fast
    call, which then reads as milliseconds: one such spike in a batch of 1,024 sent that
    session to the executor for ~15 calls. When the thread made *involuntary* context
    switches but no voluntary ones since the last look, the call neither slept nor
    waited on I/O or a lock: the thread's CPU time since then, less the time of the
    fast calls measured since (:attr:`before`), is its cost. A call that blocked counts
    its wall time. Read once a batch and for calls over the bound, so fast calls pay
    nothing.

    Without ``before`` a call late in a batch was charged the CPU time of every call
    ahead of it: a same-step reset after eight CartPole steps read as ~300 µs, over the
    bound, and went to the executor (a thread hop) for the following ~15 resets
    (issue 34). A fast call's wall time is its CPU time (it was not preempted, or it
    would not be fast), so subtracting it leaves this call's own CPU time, plus the
    little the batch's loop spent between the calls.
    """

    __slots__ = ("before", "cpu", "switches")

    def __init__(self) -> None:
        self.switches = self._switches()
        self.cpu = time.thread_time()
        self.before = 0.0
        """Seconds taken by the fast calls measured since the last look."""

    @staticmethod
    def _switches() -> tuple[int, int]:
        if _RUSAGE_THREAD is None:
            return (0, 0)
        usage = resource.getrusage(_RUSAGE_THREAD)
        return usage.ru_nvcsw, usage.ru_nivcsw

    def cost(self, seconds: float) -> float:
        """What a call that took ``seconds`` of wall time costs the loop."""
        (voluntary, involuntary), cpu = self._switches(), time.thread_time()
        preempted = voluntary == self.switches[0] and involuntary > self.switches[1]
        spent = cpu - self.cpu - self.before
        self.switches, self.cpu, self.before = (voluntary, involuntary), cpu, 0.0
        return min(seconds, max(spent, 0.0)) if preempted else seconds


def run_inline(calls: Sequence[C]) -> list[C]:
    """Run now, one after the other on the loop, every call whose sync method measures
    fast enough to run inline (:meth:`EnvRunner.inline`); return the others, not run.

    The batch fast path: no coroutine, future or task per call, one clock read per
    call, and the runner's moving average kept as :meth:`EnvRunner.call` keeps it (a
    call the OS preempted counts its CPU time, see :class:`_Preemption`). A failure is
    stored on its call (``error``), as :func:`run_calls` does.
    """
    rest: list[C] = []
    clock = time.perf_counter
    preemption = _Preemption()  # two system calls a batch, from its start
    started = clock()
    for call in calls:
        runner, method = call.runner, call.method
        # Only an in-process runner measures inline; a sync method measured fast (the
        # average is only kept for sync methods, and is never under a 0 bound).
        if type(runner) is not EnvRunner or not runner.inline(method):
            rest.append(call)
            continue
        kwargs = call.kwargs
        try:
            # A step has no keywords: ``**{}`` would still build a dict each call.
            fn = getattr(runner.env, method)
            call.value = fn(*call.args, **kwargs) if kwargs else fn(*call.args)
        except Exception as exc:
            call.error = exc
        except BaseException as exc:  # SystemExit and the like must not stop the server
            call.error = _escaped(method, exc)
        ended = clock()
        call.seconds = ended - started
        _observe(runner, method, call.seconds, preemption)
        started = ended
    return rest


async def run_calls(
    calls: Sequence[EnvCall], executor: concurrent.futures.Executor, timeout: float | None
) -> None:
    """Run ``calls`` together, filling in every outcome (see the module docstring).

    A call's failure is stored on the call (``error``), never raised, so one failing
    environment cannot fail its neighbours.
    """
    await finish_calls(start_calls(calls, executor, timeout))


async def finish_calls(awaiting: list[Awaitable[None]]) -> None:
    """Wait for the calls :func:`start_calls` started."""
    if len(awaiting) == 1:
        await awaiting[0]
    elif awaiting:
        await asyncio.gather(*awaiting)


def start_calls(
    calls: Sequence[EnvCall], executor: concurrent.futures.Executor, timeout: float | None
) -> list[Awaitable[None]]:
    """The first, synchronous part of :func:`run_calls`: start what can start now (an
    async env's call up to its first wait, a measured-fast call to its end); return what
    :func:`finish_calls` must await for the rest, which starts when awaited."""
    awaiting: list[Awaitable[None]] = []
    shared: list[EnvCall] = []
    suspended: _Suspended | None = None
    remote: dict[BatchExecutor, list[EnvCall]] = defaultdict(list)
    for call in calls:
        owner = getattr(call.runner, "batch_executor", None)
        if owner is not None:
            remote[owner].append(call)
        elif type(call.runner) is EnvRunner and call.runner.is_async(call.method):
            # Started now, with no coroutine of ours around it: an async env with nothing
            # to wait for is done without a task; one that waits gets one task, and the
            # batch's one deadline (below) instead of a timer and a wait of its own.
            if suspended is None:
                suspended = _Suspended()
            suspended.start(call)
        elif not call.runner.shared or call.runner.inline(call.method):
            started = eager_start(_one(call, timeout))
            if not started.done():
                awaiting.append(started)
        else:
            shared.append(call)
    if suspended is not None and suspended.left:
        awaiting.append(suspended.wait(timeout))
    if len(shared) == 1:
        awaiting.append(_one(shared[0], timeout))  # one call: the plain runner path
    elif shared:
        awaiting.append(_run_in_one_thread(shared, executor, timeout))
    awaiting.extend(owner.run_calls(group, timeout) for owner, group in remote.items())
    return awaiting


class _Suspended:
    """The async calls of one batch that are waiting, and the one future the batch
    awaits until the last of them is done.

    Each waiting call runs in a task of its own whose coroutine is a :class:`_BatchStep`
    around the environment's: the step that finishes the call puts its outcome on the
    call and counts it here, inside the task's own step. No done callback, no second
    hop through the loop and no wrapping coroutine per call (a batch of 1,000 slow
    steps holds 1,000 of these calls for the whole wait, and finishes them all at the
    end of it, on a round's critical path: issue 34).

    The tasks are made in one callback soon after the calls started, not one by one as
    they start: a lockstep round's frames are read and started back to back, and what
    its last frame's waits start behind is every earlier frame's start-up; a task is
    only needed once its call is done waiting (its first step hands over the wait).
    """

    __slots__ = ("all_done", "left", "pending", "steps")

    def __init__(self) -> None:
        self.steps: list[tuple[asyncio.Future[Any], _BatchStep]] = []
        self.pending: list[_BatchStep] = []
        """Started calls whose tasks are not made yet (see :meth:`spawn`)."""
        self.left = 0
        self.all_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def start(self, call: EnvCall) -> None:
        """Start an async env's call up to its first wait; its outcome is on ``call``
        now if it finished at once, else once its task is done."""
        started = time.perf_counter()
        try:
            fn = getattr(call.runner.env, call.method)
            coro = fn(*call.args, **call.kwargs) if call.kwargs else fn(*call.args)
        except Exception as exc:
            call.error = exc
            return
        step = _BatchStep(coro, call, started)
        try:
            waiting = step.send(None)
        except StopIteration:
            return  # finished without waiting: its outcome is on the call already
        except asyncio.CancelledError:
            return  # as a task that ends cancelled: nothing to put on the call
        step.batch, step.suspended = self, waiting
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.spawn)
        self.pending.append(step)
        self.left += 1

    def spawn(self) -> None:
        """Make the tasks of the started calls that have none yet."""
        pending, self.pending = self.pending, []
        create = asyncio.get_running_loop().create_task
        self.steps += [(create(step), step) for step in pending]

    def count(self) -> None:
        """One waiting call is done (called from its task's last step)."""
        self.left -= 1
        if self.left == 0:
            self._wake()

    def _wake(self) -> None:
        """Wake the batch's waiter: its last call is done, or its deadline came."""
        if not self.all_done.done():
            self.all_done.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        """Wait for every call under one deadline; the calls still running at it fail
        with ``STEP_TIMEOUT`` (their runners are then closed by the batch, once the call
        lets go of the env).

        Then the batch lets go of its tasks: each task holds its step, which holds this
        batch, and a batch still holding its tasks made all of them garbage only the
        collector could free (a young pass found 1.3 million such objects after a
        lockstep round of 100,000 steps, and took 1.5 s over them, issue 34).
        """
        try:
            await self._wait(timeout)
        finally:
            self.steps = []

    async def _wait(self, timeout: float | None) -> None:
        if self.left == 0:
            return
        if timeout is None:
            await self.all_done
            return
        # The deadline wakes the same future the last call does: one hop either way.
        timer = asyncio.get_running_loop().call_later(timeout, self._wake)
        try:
            await self.all_done
        finally:
            timer.cancel()
        if self.left == 0:
            return
        self.spawn()  # (made already, short of a deadline that is due at once)
        for task, step in self.steps:
            if not task.done():
                call = step.call
                step.expired = True  # what it does after its cancellation is not its answer
                call.seconds = timeout
                task.cancel()
                call.runner.abandon(task)
                call.error = call.runner.timeout_error(call.method, timeout)


class _BatchStep(collections.abc.Coroutine[Any, Any, None]):
    """The coroutine a waiting batch call's task runs: the environment's own, driven
    through, its outcome put on its :class:`EnvCall` when it ends.

    What :func:`_guarded_async` and a done callback did per call, in the task's step: a
    non-``Exception`` the environment raises (cancellation aside) becomes ``EnvError``
    before asyncio could re-raise it out of the loop, and the task itself ends with
    None (an environment's exception is the call's, never an unretrieved task's). The
    task's first step hands over what the eager start stopped at (see
    :class:`_Started`).
    """

    __slots__ = ("batch", "call", "coro", "expired", "started", "suspended")

    def __init__(self, coro: Coroutine[Any, Any, Any], call: EnvCall, started: float) -> None:
        self.coro = coro
        self.call = call
        self.started = started
        self.suspended: Any = _RESUMED
        self.batch: _Suspended | None = None
        """Set once the call waits (it is then counted there)."""
        self.expired = False
        """The batch gave up on the call (its timeout): later outcomes are ignored."""

    def send(self, value: Any) -> Any:
        """The task's step: the first hands over the wait, the rest resume the call."""
        suspended = self.suspended
        if suspended is not _RESUMED:
            self.suspended = _RESUMED
            return suspended
        return self._resume(self.coro.send, value)

    def throw(self, *exc: Any) -> Any:
        """Throw into the call (cancellation, mostly), where it waits."""
        self.suspended = _RESUMED
        return self._resume(self.coro.throw, *exc)

    def _resume(self, resume: Callable[..., Any], *args: Any) -> Any:
        """Resume the environment's coroutine; when it ends, put its outcome on the call
        and end this task's step (StopIteration), as a coroutine's end does."""
        try:
            return resume(*args)
        except StopIteration as stop:
            self._end(stop.value, None)
        except asyncio.CancelledError:
            self._cancelled()
            raise
        except BaseException as exc:
            self._end(None, exc)
        raise StopIteration

    def close(self) -> None:
        """Close the environment's coroutine."""
        self.coro.close()

    def __await__(self) -> Generator[Any, Any, None]:
        raise TypeError("a batch step is run by a task, not awaited")

    def _end(self, value: Any, error: BaseException | None) -> None:
        call = self.call
        if not self.expired:
            call.seconds = time.perf_counter() - self.started
            if error is None:
                call.value = value
            elif isinstance(error, Exception):
                call.error = error
            else:  # SystemExit and the like must not stop the server
                call.error = _escaped(call.method, error)
        if self.batch is not None:
            self.batch.count()

    def _cancelled(self) -> None:
        # Cancelled: a timeout, whose error the batch put on the call already.
        if self.batch is not None:
            self.batch.count()


async def _one(call: EnvCall, timeout: float | None) -> None:
    started = time.perf_counter()
    try:
        call.value = await call.runner.call(
            call.method, *call.args, timeout=timeout, kwargs=call.kwargs
        )
    except Exception as exc:
        call.error = exc
    call.seconds = time.perf_counter() - started


class _ThreadJob:
    """Calls run one after the other in one executor thread, with progress for timeouts."""

    def __init__(self, calls: list[EnvCall]) -> None:
        self.calls = calls
        self.current = -1
        self.started = time.monotonic()
        self.stop_at = len(calls)
        self.lock = threading.Lock()

    def own_seconds(self) -> float:
        """What the calls themselves took (their trip through the pool aside)."""
        return sum(call.seconds for call in self.calls)

    def run(self) -> None:
        preemption = _Preemption()  # in the worker thread: its own switches and CPU time
        for index, call in enumerate(self.calls):
            with self.lock:
                if index >= self.stop_at:
                    return  # the loop side gave up on an earlier call and re-queued the rest
                self.current = index
                self.started = time.monotonic()
            if call.runner.closed:
                call.error = SessionLost("the session was closed while its batch was queued")
                continue
            try:
                call.value = getattr(call.runner.env, call.method)(*call.args, **call.kwargs)
            except Exception as exc:
                call.error = exc
            except BaseException as exc:  # SystemExit and the like must not stop the server
                call.error = _escaped(call.method, exc)
            call.seconds = time.monotonic() - self.started
            _observe(call.runner, call.method, call.seconds, preemption)

    def overdue(self, timeout: float) -> int | None:
        """If the running call overran ``timeout``, stop after it and return its index."""
        with self.lock:
            if self.current >= 0 and time.monotonic() - self.started >= timeout:
                self.stop_at = self.current + 1
                return self.current
        return None

    def next_deadline(self, timeout: float) -> float:
        """Seconds until the running call would overrun ``timeout``.

        Before the job has started (the executor is busy), the wait is a full timeout:
        the clock of a call only runs once the call does.
        """
        with self.lock:
            if self.current < 0:
                return timeout
            return max(0.0, self.started + timeout - time.monotonic())


def _hopped(executor: concurrent.futures.Executor, submitted: float, own: float) -> None:
    """Tell the shared pool what a trip through it cost beyond the calls' ``own`` seconds
    (see :attr:`EnvThreads.hop_s`); ``submitted``: when the work was handed to it."""
    if isinstance(executor, EnvThreads):
        executor.observe_hop(max(time.perf_counter() - submitted - own, 0.0))


async def _run_in_one_thread(
    calls: list[EnvCall], executor: concurrent.futures.Executor, timeout: float | None
) -> None:
    pending = calls
    while pending:
        job = _ThreadJob(pending)
        submitted = time.perf_counter()
        future = executor.submit(job.run)
        waiter = asyncio.wrap_future(future)
        if timeout is None:
            await waiter
            _hopped(executor, submitted, job.own_seconds())
            return
        while True:
            done, _ = await asyncio.wait({waiter}, timeout=job.next_deadline(timeout))
            if done:
                waiter.result()
                _hopped(executor, submitted, job.own_seconds())
                return
            index = job.overdue(timeout)
            if index is not None:
                break
        stuck = pending[index]
        stuck.error = stuck.runner.timeout_error(stuck.method, timeout)
        stuck.runner.mark_stuck(future)
        pending = pending[index + 1 :]

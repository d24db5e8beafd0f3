"""Batched resets and steps on the server: many sessions, one message, one reply.

A ``reset_batch`` / ``step_batch`` is admitted item by item (session lookup, lifecycle
rules, action validation), so a bad item is an error for its session only. The admitted
calls then run together (:func:`run_calls`):

* ``async def`` environments are awaited concurrently on the loop (no thread hop);
* sync environments without thread affinity run one after the other inside **one**
  executor call for the whole batch, instead of one thread hop per session;
* sync environments with thread affinity run on their own threads, concurrently;
* sessions living in worker processes (``corral serve --workers``) are sent to their
  worker in one frame per worker, which runs them the same way.

The step timeout applies to every item on its own: an item that overruns is answered
with ``STEP_TIMEOUT`` and its session closed; items queued behind it in the same executor
call are moved to a fresh one, so one stuck environment delays the others by at most the
timeout and never fails them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from corral.errors import (
    CorralError,
    EnvError,
    InternalError,
    SessionBusy,
    SessionLost,
    StepTimeout,
)
from corral.protocol import batch as b
from corral.protocol.server import Peer, RunBatch
from corral.protocol.session import Op
from corral.server.runner import _escaped as escaped
from corral.server.runner import eager_start

if TYPE_CHECKING:
    from corral.server.service import EnvService
    from corral.server.sessions import Session

log = logging.getLogger("corral.server")


@dataclass(slots=True, eq=False)
class Call:
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


class BatchExecutor(Protocol):
    """Runs a group of calls on their own (worker processes implement this)."""

    async def run_calls(self, calls: list[Call], timeout: float | None) -> None:
        """Run ``calls``, filling in each outcome; never raise for one call's failure."""
        ...


async def run_calls(
    calls: list[Call], executor: concurrent.futures.Executor, timeout: float | None
) -> None:
    """Run ``calls`` as a batch (see module docstring), filling in every outcome.

    A call's failure is stored on the call (``error``), never raised, so one failing
    environment cannot fail its neighbours.
    """
    awaiting: list[Awaitable[None]] = []
    shared: list[Call] = []
    remote: dict[BatchExecutor, list[Call]] = defaultdict(list)
    for call in calls:
        owner = getattr(call.runner, "batch_executor", None)
        if owner is not None:
            remote[owner].append(call)
        elif call.runner.is_async(call.method) or not call.runner.shared:
            # Started now: an async env with nothing to wait for is done without a task.
            started = eager_start(_one(call, timeout))
            if not started.done():
                awaiting.append(started)
        else:
            shared.append(call)
    if len(shared) == 1:
        awaiting.append(_one(shared[0], timeout))  # one call: the plain runner path
    elif shared:
        awaiting.append(_run_in_one_thread(shared, executor, timeout))
    awaiting.extend(owner.run_calls(group, timeout) for owner, group in remote.items())
    if len(awaiting) == 1:
        await awaiting[0]
    elif awaiting:
        await asyncio.gather(*awaiting)


async def _one(call: Call, timeout: float | None) -> None:
    started = time.perf_counter()
    try:
        call.value = await call.runner.call(call.method, *call.args, timeout=timeout, **call.kwargs)
    except Exception as exc:
        call.error = exc
    call.seconds = time.perf_counter() - started


class _ThreadJob:
    """Calls run one after the other in one executor thread, with progress for timeouts."""

    def __init__(self, calls: list[Call]) -> None:
        self.calls = calls
        self.current = -1
        self.started = time.monotonic()
        self.stop_at = len(calls)
        self.lock = threading.Lock()

    def run(self) -> None:
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
                call.error = escaped(call.method, exc)
            call.seconds = time.monotonic() - self.started

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


async def _run_in_one_thread(
    calls: list[Call], executor: concurrent.futures.Executor, timeout: float | None
) -> None:
    pending = calls
    while pending:
        job = _ThreadJob(pending)
        future = executor.submit(job.run)
        waiter = asyncio.wrap_future(future)
        if timeout is None:
            await waiter
            return
        while True:
            done, _ = await asyncio.wait({waiter}, timeout=job.next_deadline(timeout))
            if done:
                waiter.result()
                return
            index = job.overdue(timeout)
            if index is not None:
                break
        stuck = pending[index]
        stuck.error = stuck.runner.timeout_error(stuck.method, timeout)
        stuck.runner.mark_stuck(future)
        pending = pending[index + 1 :]


@dataclass(slots=True, eq=False, kw_only=True)
class _Admitted(Call):
    """A call of a batch item that passed admission, with where its result goes."""

    index: int
    session: Session
    op: Op


class BatchHandler:
    """Serves ``reset_batch`` and ``step_batch`` for one :class:`EnvService`."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        """The batch task running each (session, request id) item, for re-sent batches."""

    def submit(self, peer: Peer, batch: RunBatch[Session]) -> None:
        """Run an admitted batch in the background; its reply goes to ``peer``."""
        request = batch.request
        results = batch.results
        admitted = self._prepare(peer, batch)
        waits: list[tuple[int, Session, asyncio.Future[None]]] = []
        for index, session in batch.joins:
            original = self._running.get((session.id, request.id))
            if original is None:  # running, but not as this batch: not the same request
                error = SessionBusy(
                    f"request {request.id} of this session is still running; "
                    "wait for its reply before sending another",
                    details={"running": request.id},
                )
                results[index] = self._error(session.id, error)
            else:
                # The same batch re-sent after a reconnect while it still runs: this
                # item's answer is the original's, once it is there (at most once).
                waits.append((index, session, original))
        if not admitted and not waits:
            peer.send(b.BatchReply(request.id, _complete(results)))
            return
        task = asyncio.create_task(self._run(peer, request.id, admitted, results, waits))
        self._tasks.add(task)
        keys = [(call.session.id, request.id) for call in admitted]
        for key in keys:
            self._running[key] = task

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            for key in keys:
                if self._running.get(key) is finished:
                    del self._running[key]

        task.add_done_callback(done)

    def _prepare(self, peer: Peer, batch: RunBatch[Session]) -> list[_Admitted]:
        service = self.service
        admitted: list[_Admitted] = []
        for call in batch.calls:
            item, session, op = call.item, call.session, call.op
            try:
                if op is Op.STEP:
                    assert isinstance(item, b.StepItem)
                    action = service._load_action(peer, item.action)
                    admitted.append(
                        _Admitted(
                            session.runner,
                            "step",
                            (action,),
                            index=call.index,
                            session=session,
                            op=op,
                        )
                    )
                else:  # a reset, or a step that auto-resets an ended episode
                    seed, options = (
                        (item.seed, item.options) if isinstance(item, b.ResetItem) else (None, {})
                    )
                    service._check_options(options)
                    admitted.append(
                        _Admitted(
                            session.runner,
                            "reset",
                            (seed,),
                            options,
                            index=call.index,
                            session=session,
                            op=op,
                        )
                    )
            except CorralError as exc:
                session.machine.abort()
                batch.results[call.index] = self._error(session.id, exc)
        return admitted

    async def _run(
        self,
        peer: Peer,
        request_id: int,
        admitted: list[_Admitted],
        results: list[b.BatchItemReply | None],
        waits: list[tuple[int, Session, asyncio.Future[None]]],
    ) -> None:
        service = self.service
        timeout = service.config.step_timeout_s
        calls: list[Call] = list(admitted)
        try:
            if calls:
                await run_calls(calls, service.manager.executor, timeout)
        except Exception as exc:  # a bug in corral: answer every item rather than hang them
            log.exception("batch %s failed", request_id)
            for call in admitted:
                if call.error is None and call.value is None:
                    call.error = InternalError(f"internal server error: {exc!r}")
        steps = resets = 0
        stats = service.manager.stats
        for call in admitted:
            session = call.session
            item = self._finish(peer, call)
            if isinstance(item, b.ItemResult):
                stats.observe(str(call.op), call.seconds)
                if call.op is Op.STEP:
                    steps += 1
                else:
                    resets += 1
            results[call.index] = item
            session.remember(request_id, item)
            if isinstance(call.error, StepTimeout):
                await service.manager.close(session, "a call overran the step timeout")
        stats.steps += steps
        stats.resets += resets
        for index, session, original in waits:
            with contextlib.suppress(Exception):
                await asyncio.shield(original)
            cached = session.cache.get(request_id)
            results[index] = (
                cached
                if isinstance(cached, b.BatchItemReply)
                else self._error(session.id, SessionLost("the session closed while it ran"))
            )
        peer.send(b.BatchReply(request_id, _complete(results)))

    def _finish(self, peer: Peer, call: _Admitted) -> b.BatchItemReply:
        service = self.service
        session = call.session
        error = call.error
        if error is None:
            try:
                obs = service._check_observation(call.value, call.op)
                payload = service._dump(peer, obs, service.contract.observation, "observation")
            except CorralError as exc:
                error = exc
            else:
                session.machine.finish(call.op, done=obs.done)
                return b.ItemResult(session.id, payload)
        session.machine.abort()
        if not isinstance(error, CorralError):
            error = EnvError(
                f"{type(error).__name__}: {error}",
                details={"exception": type(error).__name__, "op": str(call.op)},
            )
        return self._error(session.id, error)

    def _error(self, session: str | None, error: CorralError) -> b.ItemError:
        self.service.manager.stats.error(str(error.code))
        return b.ItemError.of(session, error)

    async def shutdown(self) -> None:
        """Cancel batches still running (server shutdown)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _complete(results: list[b.BatchItemReply | None]) -> list[b.BatchItemReply]:
    done = [r for r in results if r is not None]
    assert len(done) == len(results), "every batch item gets a result"
    return done

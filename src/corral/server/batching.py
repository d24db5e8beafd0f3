"""Batched resets and steps on the server: many sessions, one message, one reply.

A ``reset_batch`` / ``step_batch`` arrives admitted item by item by the connection
object (session lookup, lifecycle rules: :func:`corral.protocol.server.admit_batch`);
each admitted item's payload then goes through the same :class:`Admission` as a single
request (action validation, reset options), so a bad item is an error for its session
only. The admitted calls run together (:func:`~corral.server.runner.run_calls`):

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
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

from corral.asyncio_compat import enter_task, leave_task
from corral.errors import CorralError, InternalError, SessionBusy, SessionLost, StepTimeout
from corral.protocol import batch as b
from corral.protocol.server import Peer, RunBatch
from corral.protocol.session import Op, ending
from corral.server.admission import Admission
from corral.server.runner import EnvCall, finish_calls, run_inline, start_calls
from corral.server.sessions import Session, SessionManager

log = logging.getLogger("corral.server")


class _ItemCall(EnvCall):
    """The environment call of one admitted batch item, with where its result goes.

    ``final``: for the same-step reset of an ended episode, the ended step's result,
    which the reset's outcome is attached to.
    """

    __slots__ = ("final", "index", "op", "session")

    # One per batch item: a plain positional __init__ setting every slot costs half of
    # what a keyword-only dataclass one does.
    def __init__(
        self,
        runner: Any,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        index: int,
        session: Session,
        op: Op,
        final: b.ItemResult | None = None,
    ) -> None:
        self.runner, self.method, self.args, self.kwargs = runner, method, args, kwargs
        self.value = self.error = None
        self.seconds = 0.0
        self.index, self.session, self.op, self.final = index, session, op, final


class _Started:
    """What :meth:`BatchHandler.submit` started of a batch's calls before its task ran:
    what is left to await, or the bug that stopped it."""

    __slots__ = ("awaiting", "error")

    def __init__(self) -> None:
        self.awaiting: list[Awaitable[None]] | None = None
        self.error: Exception | None = None


class BatchHandler:
    """Runs the ``reset_batch`` and ``step_batch`` messages of one server.

    Args:
        manager: the server's sessions (their runners, the shared executor, the stats).
        admission: the payload and result rules of the environment.
        step_timeout_s: the per-call timeout (None: none).
    """

    def __init__(
        self, manager: SessionManager, admission: Admission, step_timeout_s: float | None
    ) -> None:
        self.manager = manager
        self.admission = admission
        self.step_timeout_s = step_timeout_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        """The batch task running each (session, request id) item, for re-sent batches."""

    def submit(self, peer: Peer, batch: RunBatch[Session]) -> None:
        """Run an admitted batch; its reply goes to ``peer``.

        Items whose environment runs inline (a fast sync env, see
        :func:`~corral.server.runner.run_inline`) run and are answered right here, in
        the frame's callback; the reply is sent at once when nothing else is left, and
        the rest (async, executor, worker-process items, re-sent items still running)
        go on in a background task, started here as far as they start without waiting
        (an async env's call up to its first wait), unless the frame came in from
        inside another task (the in-process transport): then the task starts them.
        """
        request = batch.request
        results = batch.results
        calls = self._calls(peer, batch)
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
        if calls:
            calls = self._run_inline(peer, request, calls, results)
        if not calls and not waits:
            peer.send(b.BatchReply(request.id, _complete(results), columnar=request.columns))
            return
        started = _Started()
        task = asyncio.create_task(self._run(peer, request, calls, results, waits, started))
        if calls and asyncio.current_task() is None:
            # Start the calls now, as the batch task would at its first step: an async
            # env's waits (a slow step's timer) begin here instead of after every frame
            # that arrived with this one was read, and the round's first replies are
            # not held behind its last starts (issue 34). As in the task, the batch
            # task is the current one while they start.
            loop = asyncio.get_running_loop()
            enter_task(loop, task)
            try:
                started.awaiting = start_calls(calls, self.manager.executor, self.step_timeout_s)
            except Exception as exc:  # a bug in corral: the task answers every item
                started.error = exc
            finally:
                leave_task(loop, task)
        self._tasks.add(task)
        keys = [(call.session.id, request.id) for call in calls]
        for key in keys:
            self._running[key] = task

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            for key in keys:
                if self._running.get(key) is finished:
                    del self._running[key]

        task.add_done_callback(done)

    def _run_inline(
        self,
        peer: Peer,
        request: b.BatchRequest,
        calls: list[_ItemCall],
        results: list[b.BatchItemReply | None],
    ) -> list[_ItemCall]:
        """Run and answer the calls that run inline, and the same-step resets they call
        for that run inline too; return the others."""
        rest: list[_ItemCall] = []
        while calls:
            pending = self._inline(request.id, calls)
            if len(pending) == len(calls):
                return rest + pending
            if pending:
                waiting = {id(call) for call in pending}
                ran = [call for call in calls if id(call) not in waiting]
            else:  # all ran (the common case): no need to sort them out
                ran = calls
            rest += pending
            # Whatever happens (a bug), none of these sessions stays running the batch;
            # the others are still to run, released by the task that runs them.
            with ending([call.session for call in ran], request.id):
                ended = self._settle(peer, request, ran, results)
            calls = self._resets(request, ended, results)
        return rest

    @staticmethod
    def _inline(request_id: int, calls: list[_ItemCall]) -> list[_ItemCall]:
        """:func:`run_inline` on ``calls``; a bug in corral answers every call instead."""
        try:
            return run_inline(calls)
        except Exception as exc:  # a bug in corral: answer every item rather than hang them
            log.exception("batch %s failed", request_id)
            for call in calls:
                if call.error is None and call.value is None:
                    call.error = InternalError(f"internal server error: {exc!r}")
            return []

    def _resets(
        self,
        request: b.BatchRequest,
        ended: list[tuple[_ItemCall, b.ItemResult]],
        results: list[b.BatchItemReply | None],
    ) -> list[_ItemCall]:
        """The same-step resets of the items whose step ended their episode (seeded with
        the item's ``reset_seed``), admitted by the lifecycle table; an item it refuses
        (its session closed) is answered now."""
        calls: list[_ItemCall] = []
        request_id = request.id
        for step, final in ended:
            session = step.session
            try:
                op = session.machine.begin("autoreset", request_id)
            except CorralError as exc:
                final.reset = self._error(session.id, exc)
                results[step.index] = final
                session.remember(request_id, final)
                continue
            item = request.items[step.index]
            assert isinstance(item, b.StepItem)  # only a step ends an episode
            method, args, kwargs = self.admission.auto_reset(item.reset_seed)
            calls.append(
                _ItemCall(session.runner, method, args, kwargs, step.index, session, op, final)
            )
        return calls

    def _calls(self, peer: Peer, batch: RunBatch[Session]) -> list[_ItemCall]:
        calls: list[_ItemCall] = []
        results = batch.results
        request_id = batch.request.id
        admitted = batch.calls
        work = self.admission.calls(peer, [(a.op, a.item) for a in admitted])
        for item, call in zip(admitted, work, strict=True):
            session, op = item.session, item.op
            if isinstance(call, CorralError):
                session.end(request_id)
                results[item.index] = self._error(session.id, call)
                continue
            method, args, kwargs = call
            calls.append(_ItemCall(session.runner, method, args, kwargs, item.index, session, op))
        return calls

    async def _run(
        self,
        peer: Peer,
        request: b.BatchRequest,
        calls: list[_ItemCall],
        results: list[b.BatchItemReply | None],
        waits: list[tuple[int, Session, asyncio.Future[None]]],
        started: _Started,
    ) -> None:
        request_id = request.id
        overran: list[Session] = []
        while calls:
            # Whatever happens (a bug, cancellation), no session stays running the batch.
            with ending([call.session for call in calls], request_id):
                try:
                    awaiting, error = started.awaiting, started.error
                    started.awaiting = started.error = None  # the first round's only
                    if error is not None:
                        raise error
                    if awaiting is None:  # not started by submit, or a round of resets
                        awaiting = start_calls(calls, self.manager.executor, self.step_timeout_s)
                    await finish_calls(awaiting)
                except Exception as exc:  # a bug in corral: answer every item, never hang
                    log.exception("batch %s failed", request_id)
                    for call in calls:
                        if call.error is None and call.value is None:
                            call.error = InternalError(f"internal server error: {exc!r}")
                ended = self._settle(peer, request, calls, results)
            overran += [call.session for call in calls if isinstance(call.error, StepTimeout)]
            # The same-step resets are admitted with nothing awaited since their steps
            # finished (a re-sent batch never finds an item half-answered), and run in
            # the next round, inside its ``ending``.
            calls = self._resets(request, ended, results)
        for session in overran:
            await self.manager.close(session, "a call overran the step timeout")
        for index, session, original in waits:
            with contextlib.suppress(Exception):
                await asyncio.shield(original)
            cached = session.cache.get(request_id)
            results[index] = (
                cached
                if isinstance(cached, b.BatchItemReply)
                else self._error(session.id, SessionLost("the session closed while it ran"))
            )
        peer.send(b.BatchReply(request_id, _complete(results), columnar=request.columns))

    def _settle(
        self,
        peer: Peer,
        request: b.BatchRequest,
        calls: list[_ItemCall],
        results: list[b.BatchItemReply | None],
    ) -> list[tuple[_ItemCall, b.ItemResult]]:
        """Answer run ``calls``: results checked and dumped (together, see
        :meth:`Admission.results`), sessions finished, replies remembered, and the
        statistics updated once per operation for the batch.

        Returns the steps that ended their episode in a batch that asks for same-step
        resets, with their results: they are answered once their reset ran.
        """
        request_id = request.id
        autoreset = type(request) is b.StepBatch and request.autoreset
        ended: list[tuple[_ItemCall, b.ItemResult]] = []
        ran = [call for call in calls if call.error is None]
        outcomes = self.admission.results(peer, [c.value for c in ran], [c.op for c in ran])
        seconds: dict[Op, list[float]] = {}
        failed = len(ran) < len(calls)
        # One pass over the calls that returned (a round's end phase runs it for every
        # item, issue 34), then one over the failed ones, if any.
        for call, outcome in zip(ran, outcomes, strict=True):
            if isinstance(outcome, CorralError):
                call.error = outcome
                failed = True
                continue
            session, op = call.session, call.op
            payload, done = outcome
            session.machine.finish(op, done)
            result = b.ItemResult(session.id, payload)
            times = seconds.get(op)
            if times is None:
                times = seconds[op] = []
            times.append(call.seconds)
            if done and autoreset and op is Op.STEP:
                ended.append((call, result))
                continue
            final = call.final
            item: b.BatchItemReply = result
            if final is not None:  # a same-step reset: the ended step's result carries it
                final.reset, item = item, final
            results[call.index] = item
            session.remember(request_id, item)
        if failed:
            for call in calls:
                if call.error is None:
                    continue
                session = call.session
                session.machine.abort()
                item = self._error(session.id, self.admission.failure(call.error, call.op, session))
                final = call.final
                if final is not None:
                    final.reset, item = item, final
                results[call.index] = item
                session.remember(request_id, item)
        stats = self.manager.stats
        for op, times in seconds.items():
            stats.observe_many(op, times)
        return ended

    def _error(self, session: str | None, error: CorralError) -> b.ItemError:
        self.manager.stats.error(str(error.code))
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

"""Worker processes: one server's sessions spread over N processes (``--workers N``).

Python runs one thread of Python code at a time, so a server whose environments burn CPU
in Python is limited to one core however many sessions it holds. With workers, the
server process (the *front*) keeps everything it does well — sockets, the protocol, the
lifecycle rules, batching, capacity — and each session's environment instance lives in
one of N worker processes, pinned there for the session's life (a new session goes to
the worker with the fewest sessions).

The front talks to each worker over a Unix socket pair with length-prefixed msgpack
frames (the binary codec, arrays included): ``open`` builds an environment, ``call``
runs one method, ``batch`` runs a batch's calls (the worker groups them exactly like the
server does: one executor call for its sync environments, async ones concurrently),
``close`` ends a session. Actions (and the snapshots a ``restore`` call takes) cross as
the front validated them and are validated again by the worker's models (the process
boundary is a trust boundary too); a ``snapshot`` call's model comes back like a state.

Inside a worker, calls run on an :class:`~corral.server.runner.EnvRunner` with the step
timeout, so a stuck environment closes its session and leaves its worker responsive.
Each reply tells the front how many of the worker's calls hung past the timeout and
still hold their threads; a worker reaching ``max_hung_calls`` is replaced (its
sessions end with ``SESSION_LOST``), which frees those threads for good.
If a worker does not answer well past that timeout (its event loop itself is wedged), or
if it dies, the front kills it, closes its sessions with ``SESSION_LOST`` and starts a
replacement; the other workers' sessions never notice. A replacement that fails to start
(it dies while starting, or the environment no longer imports) is retried with back-off
(:func:`backoff_s`: 0.5 s doubling to 30 s) for as long as the server runs, never given
up on. Meanwhile the server says the truth: a slot without a live worker is *down*
(:meth:`WorkerPool.report`, in ``/health``, ``/ready``, ``/status`` and ``/metrics``), the
server's capacity shrinks with its live workers (``max_sessions`` x alive / configured:
``/ready`` answers 503 and new sessions get ``NOT_READY`` past it), and with none alive
it is not ready at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from corral import runtime
from corral.contract.schema import Contract
from corral.errors import (
    BadObservation,
    CorralError,
    FactoryError,
    InternalError,
    SessionLost,
    StepTimeout,
    error_from_wire,
    validation_message,
)
from corral.protocol.codecs import MsgpackCodec
from corral.server.env_failures import WorkerEnvError, format_traceback
from corral.server.runner import EnvCall

log = logging.getLogger("corral.server")

_HEADER = struct.Struct(">I")
_MAX_FRAME = 1 << 30
_GRACE_S = 10.0
"""How long past the step timeout the front waits for a worker before replacing it."""
PATH_ENV = "CORRAL_WORKER_SYS_PATH"
_QUICK_DEATH_S = 10.0
"""A worker that dies this soon after it started counts as failing to start."""
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


def backoff_s(failures: int) -> float:
    """Seconds to wait before starting a slot's worker again after ``failures`` failed
    starts (or quick deaths) in a row: 0 for none, then 0.5 s doubling to 30 s."""
    if failures <= 0:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** min(failures - 1, 16))


def env_reference(target: Any) -> str:
    """The ``module:qualname`` a worker process imports ``target`` (class or factory) by.

    Raises:
        ValueError: ``target`` cannot be imported by name (defined in ``__main__``, inside
            a function, or a lambda).
    """
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        raise ValueError(
            f"--workers needs an environment importable by name, got {target!r}: define "
            "the class (or factory) at module level in an importable module and serve it "
            "as 'package.module:Name'"
        )
    return f"{module}:{qualname}"


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


async def read_frame(reader: asyncio.StreamReader, codec: MsgpackCodec) -> dict[str, Any] | None:
    """The next frame, or None at end of stream."""
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > _MAX_FRAME:
            raise ValueError(f"worker frame of {size} bytes")
        return codec.decode(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def write_frame(writer: asyncio.StreamWriter, codec: MsgpackCodec, message: dict[str, Any]) -> None:
    payload = codec.encode(message)
    writer.write(_HEADER.pack(len(payload)) + payload)


def wire_error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, CorralError):
        return {"corral": True, **exc.to_wire()}
    return {
        "corral": False,
        "exception": type(exc).__name__,
        "message": str(exc),
        "traceback": format_traceback(exc),
    }


def _raisewire_error(error: dict[str, Any], method: str) -> BaseException:
    if error.get("corral"):
        return error_from_wire(error)
    name = str(error.get("exception", "Exception"))
    return WorkerEnvError(
        f"{name}: {error.get('message', '')}",
        details={"exception": name, "op": method, "worker": True},
        remote_traceback=str(error.get("traceback", "")),
    )


# -- the front's side ----------------------------------------------------------------


class WorkerRunner:
    """A session whose environment instance lives in a worker process.

    It has the interface of :class:`~corral.server.runner.EnvRunner` that the service
    uses (``call``, ``close``, ``closed``); batches of worker sessions go to
    :attr:`batch_executor` (their worker) in one frame.
    """

    def __init__(self, worker: Worker, key: int) -> None:
        self.worker = worker
        self.key = key
        self.closed = False

    @property
    def batch_executor(self) -> Worker:
        """The worker that runs this session's calls, batched."""
        return self.worker

    async def call(
        self,
        method: str,
        /,
        *args: Any,
        timeout: float | None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run ``env.<method>(*args, **kwargs)`` in the worker and return the typed result
        (the environment's keywords as one mapping, see :class:`~corral.server.runner.Runner`).

        Raises:
            StepTimeout: the worker's runner timed the call out.
            SessionLost: the worker died or was replaced.
            EnvError: the environment raised (its exception type is kept in the message).
        """
        call = EnvCall(self, method, args, dict(kwargs or {}))
        await self.worker.run_calls([call], timeout)
        if call.error is not None:
            raise call.error
        return call.value

    async def close(self) -> None:
        """Close the environment in the worker (once)."""
        if self.closed:
            return
        self.closed = True
        await self.worker.close_session(self.key)


class Worker:
    """One worker process and the socket to it."""

    def __init__(self, index: int, pool: WorkerPool) -> None:
        self.index = index
        self.pool = pool
        self.process: subprocess.Popen[bytes] | None = None
        self.sessions = 0
        self.alive = False
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._keys = itertools.count(1)
        self._codec = MsgpackCodec()
        self._death_reason = ""
        self.started_at = 0.0
        self._answering = 0
        """Requests sent whose caller has not had their outcome yet."""
        self._answered = asyncio.Event()

    async def start(self, timeout: float) -> None:
        """Spawn the process and wait until it has imported the environment.

        Raises:
            RuntimeError: the worker exited or did not report ready within ``timeout``.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**os.environ, PATH_ENV: os.pathsep.join(sys.path)}
        config = self.pool.config
        argv = [
            sys.executable,
            "-m",
            "corral.server.worker_main",
            "--fd",
            str(theirs.fileno()),
            "--target",
            self.pool.reference,
            "--threads",
            str(config.executor_threads),
            "--inline-step-s",
            repr(float(config.inline_step_s)),
            *(["--thread-affinity"] if self.pool.thread_affinity else []),
        ]
        self.process = subprocess.Popen(
            argv,
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=ours, limit=2**24)
        try:
            hello = await runtime.wait_for(read_frame(reader, self._codec), timeout)
        except TimeoutError:
            hello = None
        if hello is None or hello.get("op") != "ready":
            self.kill()
            code = self.process.poll()
            if hello is not None:
                detail = hello.get("error")
            elif code is not None:
                detail = f"it exited with code {code} while starting"
            else:
                detail = f"no answer within {timeout:g} s"
            raise RuntimeError(
                f"worker {self.index} for {self.pool.reference!r} did not start: {detail}"
            )
        self.alive = True
        self.started_at = time.monotonic()
        self._reader_task = asyncio.create_task(
            self._read(reader), name=f"corral-worker-{self.index}"
        )

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            message = await read_frame(reader, self._codec)
            if message is None:
                break
            future = self._pending.pop(message.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(message)
            hung = message.get("hung")
            if isinstance(hung, int) and hung >= self.pool.config.max_hung_calls:
                self._death_reason = (
                    f"{hung} of its calls hung past the step timeout (the bound is "
                    f"{self.pool.config.max_hung_calls}); it was replaced"
                )
                self.kill()
                break
        code = self.process.poll() if self.process is not None else None
        exited = "closed its socket" if code is None else f"exited with code {code}"
        self._lost(self._death_reason or f"its worker process {exited}")

    def _lost(self, reason: str) -> None:
        if not self.alive:
            return
        self.alive = False
        self._death_reason = reason
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(SessionLost(f"the session is gone: {reason}"))
        self.pool.worker_died(self, reason)

    async def request(self, message: dict[str, Any], wait: float | None) -> dict[str, Any]:
        """Send ``message`` and return the worker's reply.

        Raises:
            SessionLost: the worker is dead, or did not answer within ``wait`` seconds
                (it is then killed and replaced).
        """
        if not self.alive or self._writer is None:
            raise SessionLost(f"the session is gone: {self._death_reason or 'worker stopped'}")
        request_id = next(self._ids)
        message["id"] = request_id
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        write_frame(self._writer, self._codec, message)
        self._answering += 1
        self._answered.clear()
        try:
            await self._writer.drain()
            return await runtime.wait_for(future, wait)
        except TimeoutError:
            self._pending.pop(request_id, None)
            self._death_reason = f"worker {self.index} stopped answering and was replaced"
            self.kill()
            self._lost(self._death_reason)
            raise StepTimeout(
                f"no answer within {wait:g} s; {self._death_reason}",
                details={"timeout_s": wait, "session": "closed", "worker": "replaced"},
            ) from None
        except ConnectionError:
            self._lost(self._death_reason or "the worker's socket closed")
            raise SessionLost(f"the session is gone: {self._death_reason}") from None
        finally:
            self._answering -= 1
            if not self._answering:
                self._answered.set()

    async def answered(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until every request sent has returned to its
        caller. A reply the worker sent before it died (the one that reported its last
        hung call) then reaches its session before the death closes the session: that
        step's answer is its own (``STEP_TIMEOUT``), not the worker's."""
        if self._answering:
            await runtime.wait_event(self._answered, timeout)

    async def open_session(self, timeout: float | None) -> WorkerRunner:
        """Build an environment instance in this worker.

        Raises:
            FactoryError: the factory raised in the worker.
        """
        key = next(self._keys)
        reply = await self.request({"op": "open", "key": key, "timeout": timeout}, _wait(timeout))
        if "error" in reply:
            raise _raisewire_error(reply["error"], "open")
        self.sessions += 1
        return WorkerRunner(self, key)

    async def close_session(self, key: int) -> None:
        """Close a session's environment (best effort: a dead worker has none left)."""
        self.sessions = max(0, self.sessions - 1)
        with contextlib.suppress(CorralError):
            await self.request({"op": "close", "key": key}, _GRACE_S)

    async def run_calls(self, calls: Sequence[EnvCall], timeout: float | None) -> None:
        """Run ``calls`` (of sessions on this worker) in one frame; fill their outcomes."""
        items = [
            {
                "key": c.runner.key,
                "method": c.method,
                "args": [_dump(a) for a in c.args],
                "kwargs": c.kwargs,
            }
            for c in calls
        ]
        wait = None if timeout is None else timeout * len(calls) + _GRACE_S
        started = time.perf_counter()
        try:
            reply = await self.request({"op": "batch", "items": items, "timeout": timeout}, wait)
        except CorralError as exc:
            for call in calls:
                call.error = exc
            return
        results = reply.get("results")
        if not isinstance(results, list) or len(results) != len(calls):
            for call in calls:
                call.error = InternalError("a worker sent a malformed batch reply")
            return
        contract = self.pool.contract
        models = {"state": contract.state, "snapshot": contract.snapshot}
        elapsed = time.perf_counter() - started
        for call, result in zip(calls, results, strict=True):
            call.seconds = elapsed  # what the front saw: the worker's whole batch
            if "error" in result:
                call.error = _raisewire_error(result["error"], call.method)
                continue
            model = models.get(call.method) or contract.observation
            try:
                call.value = model.model_validate(result.get("value"))
            except ValidationError as exc:
                call.error = BadObservation(
                    validation_message(
                        f"the worker's {call.method}() result is not a {model.__name__}", exc
                    ),
                    details={"model": model.__name__},
                )

    def kill(self) -> None:
        """Kill the process now (SIGKILL) and close the socket."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        if self._writer is not None:
            self._writer.close()

    async def stop(self) -> None:
        """Ask the worker to exit, then make sure it has."""
        self._death_reason = "server shutting down"
        if self.alive and self._writer is not None:
            with contextlib.suppress(Exception):
                write_frame(self._writer, self._codec, {"op": "exit", "id": 0})
                await self._writer.drain()
        self.alive = False
        if self.process is not None:
            loop = asyncio.get_running_loop()
            with contextlib.suppress(Exception):
                await runtime.wait_for(loop.run_in_executor(None, self.process.wait), 5)
        self.kill()
        if self._reader_task is not None:
            self._reader_task.cancel()
            await runtime.reap(self._reader_task)


def _dump(value: Any) -> Any:
    return value.model_dump(mode="python") if isinstance(value, BaseModel) else value


def _wait(timeout: float | None) -> float | None:
    return None if timeout is None else timeout + _GRACE_S


class WorkerPool:
    """N worker processes for one server; builds :class:`WorkerRunner` sessions.

    Args:
        reference: ``module:Name`` of the environment class or factory.
        count: number of worker processes.
        config: the server's config (executor threads, step timeout).
        contract: the environment's contract (models to read results with).
        thread_affinity: run each session's calls on a dedicated thread in its worker.
    """

    def __init__(
        self,
        reference: str,
        count: int,
        config: Any,
        contract: Contract,
        *,
        thread_affinity: bool = False,
    ) -> None:
        if count < 1:
            raise ValueError(f"workers must be >= 1, got {count}")
        self.reference = reference
        self.thread_affinity = thread_affinity
        self.config = config
        self.contract = contract
        self.workers = [Worker(i, self) for i in range(count)]
        self._streak = [0] * count
        """Failed starts (and quick deaths) in a row, per slot: its back-off."""
        self.down: dict[int, str] = {}
        """Slots without a live worker (being restarted), with why."""
        self.restarts = 0
        """Replacement workers that started."""
        self.start_failures = 0
        """Replacement workers that failed to start (each one retried)."""
        self.on_death: Callable[[Worker, str], Awaitable[None]] | None = None
        """Called when a worker died: the service closes that worker's sessions."""
        self.startup_timeout = 60.0
        self._respawns: set[asyncio.Task[None]] = set()
        self._stopping = False

    async def start(self) -> None:
        """Start every worker.

        Raises:
            RuntimeError: a worker could not start (the environment fails to import).
        """
        results = await asyncio.gather(
            *(w.start(self.startup_timeout) for w in self.workers), return_exceptions=True
        )
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await self.shutdown()
            raise failure

    @property
    def alive(self) -> int:
        """Worker processes running now."""
        return sum(1 for w in self.workers if w.alive)

    def capacity(self) -> int:
        """The sessions the live workers hold: ``max_sessions`` shrunk in proportion to the
        slots that are down (each worker carries its share)."""
        return int(self.config.max_sessions) * self.alive // len(self.workers)

    def unavailable(self, active: int = 0) -> str | None:
        """Why no session can be opened now, with ``active`` sessions held, or None: no
        worker alive, or the live ones hold their share of the capacity."""
        alive, count = self.alive, len(self.workers)
        if alive == 0:
            return f"no worker process is running: all {count} are being restarted"
        if alive < count and active >= self.capacity():
            return (
                f"{count - alive} of {count} worker processes are being restarted: the "
                f"{alive} alive hold {self.capacity()} sessions until they are back"
            )
        return None

    def report(self) -> dict[str, Any]:
        """The workers' state for ``/health``, ``/ready`` and ``/status``."""
        return {
            "configured": len(self.workers),
            "alive": self.alive,
            "down": {str(index): why for index, why in sorted(self.down.items())},
            "capacity": self.capacity(),
            "restarts": self.restarts,
            "start_failures": self.start_failures,
        }

    async def create_runner(self) -> WorkerRunner:
        """A new session on the least loaded live worker.

        Raises:
            FactoryError: no worker is alive, or the environment factory raised.
        """
        alive = [w for w in self.workers if w.alive]
        if not alive:
            raise FactoryError("no worker process is running (they are being restarted)")
        worker = min(alive, key=lambda w: w.sessions)
        return await worker.open_session(self.config.step_timeout_s)

    def worker_died(self, worker: Worker, reason: str) -> None:
        """Close the dead worker's sessions and start a replacement in its place."""
        if self._stopping:
            return
        log.warning("worker %d died (%s); restarting it", worker.index, reason)
        self.down[worker.index] = f"died ({reason}); restarting"
        task = asyncio.get_running_loop().create_task(self._replace(worker, reason))
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    async def _replace(self, worker: Worker, reason: str) -> None:
        index = worker.index
        worker.kill()
        await worker.answered(1.0)
        if self.on_death is not None:
            await self.on_death(worker, reason)
        # A worker that keeps dying right after it starts, or whose replacement does not
        # start, is tried less and less often (0.5 s, 1 s, 2 s ... 30 s) instead of
        # burning the machine on restarts; but always tried again.
        if time.monotonic() - worker.started_at < _QUICK_DEATH_S:
            self._streak[index] += 1
        else:
            self._streak[index] = 0
        while not self._stopping:
            await asyncio.sleep(backoff_s(self._streak[index]))
            fresh = Worker(index, self)
            try:
                await fresh.start(self.startup_timeout)
            except asyncio.CancelledError:
                fresh.kill()  # shutting down mid-start: no orphan process
                raise
            except Exception as exc:
                self.start_failures += 1
                self._streak[index] += 1
                wait = backoff_s(self._streak[index])
                self.down[index] = f"its replacement failed to start ({exc}); retrying"
                log.warning(
                    "worker %d: its replacement failed to start (%s); retrying in %.1f s",
                    index,
                    exc,
                    wait,
                )
                continue
            self.workers[index] = fresh
            self.down.pop(index, None)
            self.restarts += 1
            log.info("worker %d restarted (pid %s)", index, fresh.process and fresh.process.pid)
            return

    async def shutdown(self) -> None:
        """Stop every worker."""
        self._stopping = True
        for task in list(self._respawns):
            task.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers), return_exceptions=True)

"""``python -m corral.server.worker_main``: a worker process of ``corral serve --workers``.

The worker's side of :mod:`corral.server.workers`: it imports the environment by name,
holds the environment instances of the sessions the front pinned here (by key), and runs
their calls as the front asks, batches included, through the same
:func:`~corral.server.runner.run_calls` as the server itself, under the step timeout.
Actions, and the snapshots ``restore`` takes, arrive as the front validated them and are
validated again here (the process boundary is a trust boundary too).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from corral.contract import Environment
from corral.errors import BadObservation, InternalError, SessionLost
from corral.protocol.codecs import MsgpackCodec
from corral.server.runner import INLINE_S, EnvCall, EnvRunner, EnvThreads, run_calls
from corral.server.workers import PATH_ENV, read_frame, wire_error, write_frame

_ARGUMENT_MODELS = {"step": "action_type", "restore": "snapshot_type"}
"""The environment class's model each method's argument is validated into."""


class _WorkerServer:
    """The worker's side: environment instances by key, calls run through EnvRunner."""

    def __init__(
        self,
        factory: Callable[[], Environment[Any, Any, Any]],
        threads: int,
        thread_affinity: bool,
        inline_s: float = INLINE_S,
    ) -> None:
        self.inline_s = inline_s
        self.factory = factory
        self.thread_affinity = thread_affinity
        self.executor = EnvThreads(threads)
        self.runners: dict[int, EnvRunner] = {}
        self.codec = MsgpackCodec()
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        write_frame(writer, self.codec, {"op": "ready", "pid": os.getpid()})
        await writer.drain()
        while True:
            message = await read_frame(reader, self.codec)
            if message is None or message.get("op") == "exit":
                break
            task = asyncio.create_task(self._handle(message, writer))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        for runner in list(self.runners.values()):
            await runner.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _handle(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        reply: dict[str, Any] = {"id": message.get("id")}
        try:
            op = message.get("op")
            if op == "open":
                await self._open(int(message["key"]), message.get("timeout"))
            elif op == "close":
                runner = self.runners.pop(int(message["key"]), None)
                if runner is not None:
                    await runner.close()
            elif op == "batch":
                reply["results"] = await self._batch(message["items"], message.get("timeout"))
            else:
                raise InternalError(f"unknown worker op {op!r}")
        except Exception as exc:
            reply["error"] = wire_error(exc)
        # The front replaces a worker whose abandoned (timed-out) calls reach its bound.
        reply["hung"] = self.executor.hung
        write_frame(writer, self.codec, reply)
        await writer.drain()

    async def _open(self, key: int, timeout: float | None) -> None:
        self.runners[key] = await EnvRunner.create(
            self.factory,
            self.executor,
            thread_affinity=self.thread_affinity,
            timeout=timeout,
            inline_s=self.inline_s,
        )

    async def _batch(
        self, items: list[dict[str, Any]], timeout: float | None
    ) -> list[dict[str, Any]]:
        calls: list[EnvCall | None] = []
        results: list[dict[str, Any]] = [{} for _ in items]
        for index, item in enumerate(items):
            runner = self.runners.get(int(item["key"]))
            if runner is None:
                results[index] = {
                    "error": wire_error(SessionLost("no such session in this worker"))
                }
                calls.append(None)
                continue
            args = list(item.get("args") or [])
            model = _ARGUMENT_MODELS.get(str(item["method"]))
            if model is not None:
                try:
                    args[0] = getattr(type(runner.env), model).model_validate(args[0])
                except ValidationError as exc:
                    results[index] = {"error": wire_error(exc)}
                    calls.append(None)
                    continue
            calls.append(
                EnvCall(runner, str(item["method"]), tuple(args), dict(item.get("kwargs") or {}))
            )
        await run_calls([c for c in calls if c is not None], self.executor, timeout)
        for index, call in enumerate(calls):
            if call is None:
                continue
            if call.error is not None:
                results[index] = {"error": wire_error(call.error)}
            elif isinstance(call.value, BaseModel):
                results[index] = {"value": call.value.model_dump(mode="python")}
            else:
                name = type(call.value).__name__
                results[index] = {
                    "error": wire_error(
                        BadObservation(
                            f"{type(call.runner.env).__name__}.{call.method}() returned {name}",
                            details={"returned": name},
                        )
                    )
                }
        return results


def _factory(reference: str) -> Callable[[], Environment[Any, Any, Any]]:
    from corral.server.target import load_target

    target = load_target(reference)
    if not callable(target):
        raise TypeError(f"{reference!r} is not an environment class or factory")
    factory: Callable[[], Environment[Any, Any, Any]] = target
    return factory


async def _worker_main(
    fd: int, reference: str, threads: int, thread_affinity: bool, inline_s: float
) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=2**24)
    try:
        factory = _factory(reference)
    except Exception as exc:
        write_frame(
            writer, MsgpackCodec(), {"op": "failed", "error": f"{type(exc).__name__}: {exc}"}
        )
        await writer.drain()
        return
    await _WorkerServer(factory, threads, thread_affinity, inline_s).serve(reader, writer)


def main(argv: list[str] | None = None) -> None:
    """Entry point of a worker process (started by :class:`WorkerPool`, not by hand)."""
    parser = argparse.ArgumentParser(prog="corral-worker", description=main.__doc__)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--inline-step-s", type=float, default=INLINE_S)
    parser.add_argument("--thread-affinity", action="store_true")
    args = parser.parse_args(argv)
    for entry in reversed(os.environ.get(PATH_ENV, "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    # The front decides when workers stop (and they die with it): a Ctrl-C or SIGTERM to
    # the process group must reach only the front, which then stops them in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from corral import runtime

    runtime.tune_gc()
    runtime.run(
        _worker_main(args.fd, args.target, args.threads, args.thread_affinity, args.inline_step_s)
    )


if __name__ == "__main__":
    main()

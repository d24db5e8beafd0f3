"""What the server does when a call fails: log the environment's exception, then answer.

Every exception an environment raises (in this process or in a worker process) is
logged on the ``corral.server`` logger with its traceback, the session id, the episode
number and the step within the episode, so the server's log always tells what failed
and where. The client gets ``ENV_ERROR`` with the exception's type and message; the
formatted traceback goes in its ``details["traceback"]`` only when the server runs with
``ServerConfig.debug`` (``corral serve --debug``): a traceback shows the server's paths
and code, which a public server must not hand to every client. It goes as a list of
lines, the form an error reply bounds (each line clipped, at most
:data:`~corral.protocol.fields.ECHO_ITEMS` of them), cut here to its last
:data:`TRACEBACK_LINES` lines: the innermost frames, where the raise is. The traceback
starts at the environment's own frame: the frames of corral's server that called it
(the service, the runner, the executor) come first in Python's order and tell a reader
nothing, so they are left out (:func:`format_traceback`).

An exception that became an answer is plain data from then on (:func:`as_data`): its
traceback and the exceptions it was raised while handling are dropped. Those tracebacks
hold the frames of the call, whose locals hold the request's payload and, in the handler's
frame, the exception itself: a reference cycle that only the garbage collector frees,
and a server's collector runs by object count (:mod:`~corral.server.gc_pacer`), which a
few large refused actions never reach. Every refused 16 MiB action then stayed in memory
until some later collection (issue 30.1).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import traceback
from pathlib import Path
from types import CodeType
from typing import Any, TypeVar

from corral.errors import CorralError, EnvError
from corral.protocol import fields as protocol_fields
from corral.protocol.fields import ECHO_ITEMS
from corral.protocol.session import Op, SessionState

log = logging.getLogger("corral.server")

TRACEBACK_LINES = ECHO_ITEMS - 1
"""Lines of a traceback sent to a client (its tail), with one saying how many were cut."""


class WorkerEnvError(EnvError):
    """An environment's exception raised in a worker process, with its traceback text."""

    def __init__(
        self, message: str, *, remote_traceback: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, details=details)
        self.remote_traceback = remote_traceback


_CALLERS = tuple(
    str(Path(path).parent) + os.sep
    for path in (asyncio.__file__, concurrent.futures.__file__, protocol_fields.__file__, __file__)
    if path is not None
)
"""Where the frames that call an environment live: corral's server and protocol
packages, asyncio, the executor's threads."""


def format_traceback(exc: BaseException) -> str:
    """The exception's traceback as Python prints it, from the environment's frame on:
    the leading frames of the code that called it (:data:`_CALLERS`) are left out, and
    a line says how many."""
    tb = exc.__traceback__
    skipped = 0
    while tb is not None and tb.tb_next is not None and _calls_envs(tb.tb_frame.f_code):
        tb, skipped = tb.tb_next, skipped + 1
    lines = traceback.format_exception(type(exc), exc, tb)
    if skipped:
        lines.insert(1, f"  ({skipped} frames of corral's server before the environment's)\n")
    return "".join(lines)


def _calls_envs(code: CodeType) -> bool:
    return code.co_filename.startswith(_CALLERS)


E = TypeVar("E", bound=BaseException)


def as_data(error: E) -> E:
    """``error`` with its traceback and chained exceptions dropped (see the module
    docstring): call once it was logged and answered, or stored as an outcome."""
    error.__traceback__ = None
    error.__context__ = None
    error.__cause__ = None
    return error


def bounded_traceback(text: str) -> list[str]:
    """``text`` as lines, cut to its last :data:`TRACEBACK_LINES`."""
    lines = text.rstrip().splitlines()
    if len(lines) <= TRACEBACK_LINES:
        return lines
    return [f"… {len(lines) - TRACEBACK_LINES + 1} lines cut …", *lines[-TRACEBACK_LINES + 1 :]]


def env_failure(exc: BaseException, op: Op, session: SessionState, *, debug: bool) -> CorralError:
    """The error answering a call of ``session`` that raised ``exc``, logged if it is the
    environment's own exception (corral's errors are answered as they are); ``exc`` and
    the answer are plain data afterwards (:func:`as_data`)."""
    try:
        return _answer(exc, op, session, debug=debug)
    finally:
        as_data(exc)


def _answer(exc: BaseException, op: Op, session: SessionState, *, debug: bool) -> CorralError:
    if isinstance(exc, WorkerEnvError):
        error: CorralError = exc
        text = exc.remote_traceback
    elif isinstance(exc, CorralError):
        return exc
    else:
        error = EnvError(
            f"{type(exc).__name__}: {exc}",
            details={"exception": type(exc).__name__, "op": str(op)},
        )
        text = format_traceback(exc)
    machine = session.machine
    if op is Op.RESET:  # the episode it would have started
        episode, step = machine.episodes + 1, 0
    else:  # a step counts itself; a state call reports the step the episode is at
        done = machine.steps - machine.episode_start
        episode, step = machine.episodes, done + 1 if op is Op.STEP else done
    log.error(
        "environment raised in %s: session %s, episode %d, step %d\n%s",
        op,
        session.id,
        episode,
        step,
        text.rstrip(),
        extra={"session": session.id, "episode": episode, "step": step},
    )
    if debug:
        error.details["traceback"] = bounded_traceback(text)
    return error


__all__ = [
    "TRACEBACK_LINES",
    "WorkerEnvError",
    "as_data",
    "bounded_traceback",
    "env_failure",
    "format_traceback",
]

"""What the server does when an environment's own code raises: log it, then answer.

Every exception an environment raises (in this process or in a worker process) is
logged on the ``corral.server`` logger with its traceback, the session id, the episode
number and the step within the episode, so the server's log always tells what failed
and where. The client gets ``ENV_ERROR`` with the exception's type and message; the
formatted traceback goes in its ``details["traceback"]`` only when the server runs with
``ServerConfig.debug`` (``corral serve --debug``): a traceback shows the server's paths
and code, which a public server must not hand to every client. It goes as a list of
lines, the form an error reply bounds (each line clipped, at most
:data:`~corral.protocol.fields.ECHO_ITEMS` of them), cut here to its last
:data:`TRACEBACK_LINES` lines: the innermost frames, where the raise is.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from corral.errors import CorralError, EnvError
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


def format_traceback(exc: BaseException) -> str:
    """The exception's traceback as Python prints it."""
    return "".join(traceback.format_exception(exc))


def bounded_traceback(text: str) -> list[str]:
    """``text`` as lines, cut to its last :data:`TRACEBACK_LINES`."""
    lines = text.rstrip().splitlines()
    if len(lines) <= TRACEBACK_LINES:
        return lines
    return [f"… {len(lines) - TRACEBACK_LINES + 1} lines cut …", *lines[-TRACEBACK_LINES + 1 :]]


def env_failure(exc: BaseException, op: Op, session: SessionState, *, debug: bool) -> CorralError:
    """The error answering a call of ``session`` that raised ``exc``, logged if it is the
    environment's own exception (corral's errors are answered as they are)."""
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
    "bounded_traceback",
    "env_failure",
    "format_traceback",
]

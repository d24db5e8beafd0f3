"""The drain's I/O face: tell the clients, wait, close what is left at the deadline.

Every decision is :class:`~corral.protocol.drain.Drain`'s (what a draining server
admits, who gets a ``going_away`` notice and with how long, when the drain is over);
:class:`Drainer` only does what needs an event loop:

1. begin: the drain refuses new sessions from now on (``NOT_READY``, ``/ready`` 503);
2. send ``going_away`` to every connection whose ``hello`` asked for notices (the ones
   connecting later are told at their ``hello``);
3. wait, woken by every session that closes, until none is left or the deadline passes;
4. at the deadline, close what is left (their requests get ``SESSION_LOST`` with the
   reason ``"drained"``) and close the OpenEnv sockets normally (1000), since OpenEnv
   clients know no notice.

``corral serve`` runs it on SIGTERM (then stops the process); tests and embedders call
:meth:`corral.server.service.EnvService.drain`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from corral import runtime
from corral.protocol.drain import DRAINED, Drain, DrainFigures
from corral.protocol.server import ServerConnection
from corral.server.sessions import Session, SessionManager

log = logging.getLogger("corral.server")

Closer = Callable[[], Awaitable[None]]
"""Closes one OpenEnv socket normally at the drain's end."""


class Drainer:
    """Runs one server's drain (see the module docstring).

    Args:
        drain: the server's drain state (the connections ask it too).
        manager: the server's sessions.
        connections: the server's open ``corral/1`` connections (read at the drain's
            start, to notify them).
    """

    def __init__(
        self,
        drain: Drain,
        manager: SessionManager,
        connections: Iterable[ServerConnection[Session]],
    ) -> None:
        self.drain = drain
        self.manager = manager
        self.connections = connections
        self.closers: set[Closer] = set()
        """What closes each open OpenEnv socket (registered while it is open)."""
        self._changed = asyncio.Event()
        self._run: asyncio.Task[DrainFigures] | None = None

    def session_closed(self) -> None:
        """A session closed: a drain waiting for none to be left looks again."""
        if self.drain.draining:
            self._changed.set()

    async def run(self, deadline_s: float, reason: str = "draining") -> DrainFigures:
        """Drain: return once no session is left or at the deadline, with the figures.

        A second call while a drain runs waits for the first (its deadline stands).
        """
        if self._run is None:
            self._run = asyncio.ensure_future(self._drain(deadline_s, reason))
        return await asyncio.shield(self._run)

    async def _drain(self, deadline_s: float, reason: str) -> DrainFigures:
        drain, manager = self.drain, self.manager
        started = now = time.monotonic()
        drain.begin(now, deadline_s, manager.active, reason)
        told = 0
        for conn in list(self.connections):
            if conn.going_away(now) is not None:
                told += 1
        log.warning(
            "draining (%s): %d sessions open, %d connections told; stopping when none is "
            "left or in %g s",
            reason,
            manager.active,
            told,
            deadline_s,
        )
        while not drain.finished(time.monotonic(), manager.active):
            self._changed.clear()
            left = drain.remaining(time.monotonic())
            # Woken by each session that closes. A slot reserved before the drain whose
            # session never came to be (a failed open) closes nothing, so the count is
            # looked at once a second too, and at the deadline.
            await runtime.wait_event(self._changed, min(max(left, 0.001), 1.0))
        held = list(manager.sessions.values())
        drain.closing(manager.active)
        # Every session is lost at once (its requests answered SESSION_LOST), then the
        # environments close together: a slow close (a sandbox) delays no one's answer.
        closing = [session for session in held if manager.retire(session, DRAINED)]
        await asyncio.gather(
            *(session.runner.close() for session in closing), return_exceptions=True
        )
        for closer in list(self.closers):
            with contextlib.suppress(Exception):
                await closer()
        figures = drain.figures(manager.active)
        log.warning(
            "drained in %.1f s: %d sessions at the start, %d moved away, %d lost at the deadline",
            time.monotonic() - started,
            figures.at_start,
            figures.moved_away,
            figures.lost,
        )
        return figures


__all__ = ["Closer", "Drainer"]

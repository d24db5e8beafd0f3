"""A server's drain, sans I/O: what it admits while it drains, and when it stops.

    SERVING --begin(deadline)--> DRAINING --(no session left, or the deadline)--> DONE

A draining server (SIGTERM on a rollout or scale-down, or ``EnvService.drain``) stops
admitting new sessions but keeps serving the ones it holds, so that their clients can
move them (``snapshot`` here, ``restore`` on another server, ``close`` here) before the
deadline. :data:`DRAIN_RULES` is the one place that says which requests a drain refuses:
every path asks :meth:`Drain.admit` (each ``corral/1`` request, the registry's
reservation of a slot that OpenEnv's routes go through too, and ``/ready``). The
connections that asked for notices in their ``hello`` are told once, by a ``going_away``
notice (:meth:`Drain.notice`), the ones there when the drain began and the ones that
arrive during it. At the deadline what is left is closed (:data:`DRAINED`, the reason
those sessions' ``SESSION_LOST`` carries).

Everything here is pure: the caller passes the clock (``time.monotonic()``) and the
number of sessions it holds; the I/O side (``corral.server.draining``) sends, waits and
closes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from corral.errors import NotReady
from corral.protocol.messages import GoingAway


class DrainPhase(StrEnum):
    """Where a server is in its drain."""

    SERVING = "serving"
    DRAINING = "draining"
    """Refusing new sessions, serving the ones it holds until the deadline."""
    DONE = "done"
    """No session left, or the deadline passed: the server stops."""


OPENING = frozenset({"open", "restore"})
"""Requests that would make a new session here."""

DRAIN_RULES: Mapping[DrainPhase, frozenset[str]] = MappingProxyType(
    {
        DrainPhase.SERVING: frozenset(),
        # Everything a held session needs goes on: steps, resets, state, snapshot (to
        # move it), attach (its client reconnecting), close (once moved), batches.
        DrainPhase.DRAINING: OPENING,
        DrainPhase.DONE: OPENING,
    }
)
"""The request kinds each phase refuses with ``NOT_READY``; any other passes on to the
session's own rules (a session closed at the deadline is ``SESSION_LOST`` there)."""

DRAINED = "drained"
"""The reason of a session closed at the drain's deadline (``SESSION_LOST``)."""


@dataclass(frozen=True, slots=True)
class DrainFigures:
    """What a drain did: sessions held when it began, gone before the deadline (moved
    away by their clients, or ended), and closed at the deadline."""

    at_start: int = 0
    moved_away: int = 0
    lost: int = 0


class Drain:
    """One server's drain state (see the module docstring).

    Args:
        server: the server's id (the ``going_away`` notice names it).
    """

    def __init__(self, server: str) -> None:
        self.server = server
        self.phase = DrainPhase.SERVING
        self.reason = ""
        self.ends_at: float | None = None
        """When the deadline passes (the caller's monotonic clock), once draining."""
        self._refused: frozenset[str] = DRAIN_RULES[self.phase]
        self._at_start = 0
        self._lost = 0
        self._closing = False

    # -- the table --------------------------------------------------------------------

    def admits(self, kind: str) -> bool:
        """Whether a request of ``kind`` (``"open"``, ``"step"``...) goes on now."""
        return kind not in self._refused

    def admit(self, kind: str) -> None:
        """Refuse a request of ``kind`` the drain's phase does not admit.

        Raises:
            NotReady: the server drains (``details["draining"]`` is True).
        """
        if kind in self._refused:
            raise NotReady(
                f"this server is draining ({self.reason}) and opens no new session; "
                "open it on another server",
                details={"reason": self.reason, "draining": True, "server": self.server},
            )

    def unavailable(self) -> str | None:
        """Why no new session can be served now (``/ready``'s reason), or None."""
        return None if self.admits("open") else f"draining: {self.reason}"

    # -- moving through the phases ------------------------------------------------------

    def _enter(self, phase: DrainPhase) -> None:
        self.phase = phase
        self._refused = DRAIN_RULES[phase]

    @property
    def draining(self) -> bool:
        """True from :meth:`begin` on (the server no longer admits)."""
        return self.phase is not DrainPhase.SERVING

    def begin(self, now: float, deadline_s: float, held: int, reason: str = "draining") -> bool:
        """Start draining with ``held`` sessions; False when it drains already (the
        first deadline stands)."""
        if self.draining:
            return False
        if deadline_s < 0:
            raise ValueError(f"a drain's deadline must be >= 0 seconds, not {deadline_s:g}")
        self.reason = reason
        self.ends_at = now + deadline_s
        self._at_start = held
        self._enter(DrainPhase.DRAINING)
        return True

    def remaining(self, now: float) -> float:
        """Seconds until the deadline (0 once past, or when not draining)."""
        if self.ends_at is None:
            return 0.0
        return max(0.0, self.ends_at - now)

    def finished(self, now: float, held: int) -> bool:
        """Whether the drain is over now: no session left, or the deadline passed.

        Once over it stays over (``DONE``); the sessions still ``held`` then are the
        ones to close at the deadline (:meth:`closing`).
        """
        if self.phase is DrainPhase.SERVING:
            return False
        if self.phase is DrainPhase.DRAINING and (held == 0 or self.remaining(now) <= 0):
            self._enter(DrainPhase.DONE)
        return self.phase is DrainPhase.DONE

    def closing(self, held: int) -> None:
        """The drain closes the ``held`` sessions left at its end (counted as lost)."""
        if not self._closing:
            self._closing = True
            self._lost = held

    def notice(self, now: float, wants_notices: bool) -> GoingAway | None:
        """The ``going_away`` notice a connection gets now: only while draining and
        only if its ``hello`` asked for notices (an older client would take the notice
        for a broken reply)."""
        if not wants_notices or self.phase is not DrainPhase.DRAINING:
            return None
        return GoingAway(round(self.remaining(now), 3), self.reason, self.server)

    def figures(self, held: int) -> DrainFigures:
        """The drain's figures now, with ``held`` sessions still held."""
        if not self.draining:
            return DrainFigures()
        gone = self._at_start - (self._lost if self._closing else held)
        return DrainFigures(self._at_start, max(0, gone), self._lost)


__all__ = ["DRAINED", "DRAIN_RULES", "OPENING", "Drain", "DrainFigures", "DrainPhase"]

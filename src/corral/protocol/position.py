"""Where a session is in its lifecycle: its phase, and the counts a snapshot carries.

The lifecycle table (:mod:`corral.protocol.session`) moves a session between phases; the
snapshot envelope (:mod:`corral.protocol.snapshot`) carries a :class:`Position` so that a
restored session continues exactly where the snapshotted one was. Both read it from here,
below them both, so that neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Phase(StrEnum):
    """Where a session is in its lifecycle."""

    NEW = "new"
    READY = "ready"
    ENDED = "ended"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Position:
    """Where a session is in its lifecycle, as a snapshot carries it: what a restored
    session's machine needs to continue exactly where the snapshotted one was.

    Attributes:
        phase: new, ready or ended (a closed session has no snapshot).
        episodes: episodes begun so far (resets, auto-resets included).
        steps: steps taken in the session, all episodes.
        episode_steps: steps taken in the current episode.
    """

    phase: Phase
    episodes: int
    steps: int
    episode_steps: int

    def problem(self) -> str | None:
        """Why this position cannot be a live session's, or None when it can."""
        if self.phase is Phase.CLOSED:
            return "a closed session has no position to restore"
        if min(self.episodes, self.steps, self.episode_steps) < 0:
            return "counts must not be negative"
        if self.episode_steps > self.steps:
            return "the episode has more steps than the session"
        if (self.phase is Phase.NEW) != (self.episodes == 0):
            return "a session is new exactly when it has begun no episode"
        if self.phase is Phase.NEW and self.steps:
            return "a new session has taken no step"
        return None


__all__ = ["Phase", "Position"]

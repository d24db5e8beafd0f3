"""What becomes of a session its server can no longer carry, decided without I/O.

A fleet event — a cut connection that comes back to another server, a drain, a crash, a
server taken out of the fleet — must not lose a trainer's episode. This module holds the
two things the client needs to decide and to act, with no socket and no clock:

* :class:`EpisodeLog`: per session, what it takes to replay the current episode on
  another server — the reset (seed, options, task), then each step's action with a
  digest of the observation it produced. A replay is *verified*: every observation the
  new session returns must have the recorded digest, or the replay is abandoned.
* :data:`REMEDIES` and :func:`remedy`: for why a session must be re-homed
  (:class:`Cause`) and what is possible (:class:`Means`), the remedy to apply, in the
  order the issue fixes: re-attach where the session lives; else move it by
  **snapshot** (its server still answers and the env declares one); else **replay** the
  log; else, for a session whose server still answers, **stay** until its episode ends
  (truncated at the server's deadline); else **truncate** — the episode ends visibly,
  ``truncated`` with the reason, and the session is re-opened fresh.

A session with no episode (never reset) or whose episode already ended has nothing to
restore: it is simply **re-opened** elsewhere.

Digests are Python's ``hash`` of the observation's msgpack encoding (the codec's, so
arrays count by their bytes): 64 bits, computed in the client process that also
compares them (a log never leaves the process), at well under a microsecond for a small
observation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any

from corral.protocol.codecs import MsgpackCodec

_CODEC = MsgpackCodec()

MAX_REPLAY_STEPS = 10_000
"""Steps a log records before its episode stops being replayable (the default bound)."""

MAX_REPLAY_BYTES = 64 * 1024 * 1024
"""Encoded action bytes a log holds before its episode stops being replayable."""


def digest(observation: Any) -> int:
    """The digest of an observation's wire object (see the module docstring)."""
    return hash(_CODEC.encode({"o": observation}))


def digest_values(values: Sequence[Any]) -> int:
    """The digest of an observation given as its field values in a fixed order (a
    batch reply's columns: no map is built for it). Comparable only with digests made
    the same way, from the same columns."""
    return hash(_CODEC.encode({"v": values}))


class EpisodeLog:
    """The current episode of one session, as far as a verified replay needs it.

    ``replayable`` turns False for good (until the next reset) when the log could not
    keep up: the reset was not seeded (an unseeded reset cannot be repeated), an
    action could not be encoded, or the bounds were passed; ``why_not`` says which.
    """

    __slots__ = (
        "actions",
        "digests",
        "max_bytes",
        "max_steps",
        "options",
        "reset_digest",
        "seed",
        "size",
        "started",
        "task",
        "why_not",
    )

    def __init__(
        self, max_steps: int = MAX_REPLAY_STEPS, max_bytes: int = MAX_REPLAY_BYTES
    ) -> None:
        self.max_steps = max_steps
        self.max_bytes = max_bytes
        self.started = False
        self.seed: int | None = None
        self.options: dict[str, Any] = {}
        self.task: Any = None
        self.reset_digest = 0
        self.actions: list[Any] = []
        self.digests: list[int] = []
        self.size = 0
        self.why_not: str | None = "no episode has started"

    @property
    def replayable(self) -> bool:
        """The episode can be replayed from its seed (see the class docstring)."""
        return self.why_not is None

    @property
    def steps(self) -> int:
        """Steps recorded in this episode."""
        return len(self.actions)

    def reset(
        self,
        seed: int | None,
        options: Mapping[str, Any] | None,
        task: Any,
        observation: Any,
    ) -> None:
        """A reset answered with ``observation``: a new episode starts."""
        self.started = True
        self.seed = seed
        self.options = dict(options or {})
        self.task = task
        self.actions = []
        self.digests = []
        self.size = 0
        self.why_not = None if seed is not None else "the episode was reset without a seed"
        # Only a replay reads the digests: an unseeded episode (a reset with no seed,
        # which no replay can repeat) never pays for one.
        self.reset_digest = digest(observation) if seed is not None else 0

    def step(self, action: Any, observation: Any) -> None:
        """A step with ``action`` (its wire object) answered with ``observation``."""
        if self.why_not is not None:
            return
        self.step_digested(action, digest(observation))

    def step_digested(self, action: Any, observed: int) -> None:
        """:meth:`step`, the observation's digest made by the caller."""
        if self.why_not is not None:
            return
        try:
            size = len(_CODEC.encode({"a": action}))
        except Exception as exc:
            self._give_up(f"an action could not be encoded for replay ({exc})")
            return
        if len(self.actions) >= self.max_steps:
            self._give_up(f"the episode is longer than {self.max_steps} steps")
            return
        if self.size + size > self.max_bytes:
            self._give_up(f"the episode's actions exceed {self.max_bytes} bytes")
            return
        self.size += size
        self.actions.append(action)
        self.digests.append(observed)

    def copy(self) -> EpisodeLog:
        """An independent log of the same episode (a fork's: it goes on its own way)."""
        twin = EpisodeLog(self.max_steps, self.max_bytes)
        for name in self.__slots__:
            value = getattr(self, name)
            setattr(twin, name, list(value) if isinstance(value, list) else value)
        twin.options = dict(self.options)
        return twin

    def _give_up(self, why: str) -> None:
        self.why_not = why
        self.actions = []
        self.digests = []
        self.size = 0

    def clear(self, why: str = "no episode has started") -> None:
        """Forget the episode (the session was re-opened fresh, or a replay of it
        diverged: ``why``); it is not replayable until the next reset."""
        self.started = False
        self.seed = None
        self.options = {}
        self.task = None
        self.reset_digest = 0
        self._give_up(why)

    def check_reset(self, observation: Any) -> str | None:
        """None when a replayed reset matches the record, else what differs."""
        if digest(observation) != self.reset_digest:
            return "the replayed reset's observation differs from the recorded one"
        return None

    def check_step(self, index: int, observation: Any) -> str | None:
        """None when replayed step ``index`` (from 0) matches the record, else what differs."""
        return self.check_step_digest(index, digest(observation))

    def check_step_digest(self, index: int, observed: int) -> str | None:
        """:meth:`check_step`, the replayed observation's digest made by the caller."""
        if observed != self.digests[index]:
            return f"the replayed step {index + 1}'s observation differs from the recorded one"
        return None


class Cause(Enum):
    """Why a session must leave the server that holds (or held) it."""

    LOST = "lost"
    """Its server says it is gone, or does not know it (restarted, reaped)."""
    UNREACHABLE = "unreachable"
    """Its server cannot be reached (dead, or not found behind the front door)."""
    GOING_AWAY = "going_away"
    """Its server drains: it still answers until its deadline."""
    LEAVING = "leaving"
    """Its server left the fleet's membership but still answers."""


class Remedy(Enum):
    """What the client does with the session."""

    REOPEN = "reopen"
    """Nothing to restore (no episode, or it ended): open a fresh session elsewhere."""
    SNAPSHOT = "snapshot"
    """Snapshot it where it is, restore it elsewhere, close the old session."""
    REPLAY = "replay"
    """Open elsewhere, replay the log, verifying every observation."""
    STAY = "stay"
    """Keep it where it is until its episode ends (its server still answers)."""
    TRUNCATE = "truncate"
    """End the episode visibly (``truncated``, with the reason); re-open fresh."""


@dataclass(frozen=True)
class Means:
    """What is possible for one session right now.

    Attributes:
        episode: an episode is under way (reset, not ended).
        snapshot: the environment declares a snapshot.
        source_answers: the server holding it still answers requests.
        replayable: its :class:`EpisodeLog` can replay the episode.
    """

    episode: bool
    snapshot: bool
    source_answers: bool
    replayable: bool


REMEDIES: Mapping[Cause, tuple[Remedy, ...]] = MappingProxyType(
    {
        Cause.LOST: (Remedy.REPLAY, Remedy.TRUNCATE),
        Cause.UNREACHABLE: (Remedy.REPLAY, Remedy.TRUNCATE),
        Cause.GOING_AWAY: (Remedy.SNAPSHOT, Remedy.REPLAY, Remedy.STAY, Remedy.TRUNCATE),
        Cause.LEAVING: (Remedy.SNAPSHOT, Remedy.REPLAY, Remedy.STAY, Remedy.TRUNCATE),
    }
)
"""Cause → the remedies to try, in order; the first one :class:`Means` allows is taken
(``TRUNCATE`` is always allowed). A lost or unreachable session has no server to take a
snapshot from."""


def allows(remedy: Remedy, means: Means) -> bool:
    """Whether ``means`` make ``remedy`` possible."""
    if remedy is Remedy.SNAPSHOT:
        return means.snapshot and means.source_answers
    if remedy is Remedy.REPLAY:
        return means.replayable
    if remedy is Remedy.STAY:
        return means.source_answers
    return True


def remedy(cause: Cause, means: Means) -> Remedy:
    """The remedy for a session that must leave its server for ``cause``.

    A remedy that fails when applied (a restore refused, a replay that diverges) is not
    retried: the caller asks again with that means taken away (``snapshot=False``, or the
    log cleared with the reason), and gets the next one.
    """
    if not means.episode:
        return Remedy.REOPEN
    return next(r for r in REMEDIES[cause] if allows(r, means))


__all__ = [
    "MAX_REPLAY_BYTES",
    "MAX_REPLAY_STEPS",
    "REMEDIES",
    "Cause",
    "EpisodeLog",
    "Means",
    "Remedy",
    "allows",
    "digest",
    "digest_values",
    "remedy",
]

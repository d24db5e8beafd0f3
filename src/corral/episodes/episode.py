"""``Episode``: the lines of one episode put back together, and its running totals."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from corral.contract.tasks import TaskRef
from corral.episodes.format import EpisodeEnd, ErrorInfo, Header, Outcome, StepRecord
from corral.errors import UsageError


class EpisodeFormatError(UsageError, ValueError):
    """An episode file (or a line of one) does not follow the format.

    Attributes:
        line: the 1-based line number, when the problem is on one line.
    """

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


@dataclass
class Tally:
    """Running totals of one episode, fed its step lines in order.

    The recorder writes an episode's end line from it; a reader computes the same
    summary for an episode whose end line is missing.
    """

    length: int = 0
    total_reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    success: bool | None = None
    started: float | None = None
    finished: float | None = None
    error: ErrorInfo | None = None

    def add(self, record: StepRecord) -> None:
        """Account for one step line."""
        self.count(
            record.op,
            record.t,
            record.latency_s,
            record.error,
            record.reward,
            record.reward_components,
            record.terminated,
            record.truncated,
            record.observation,
        )

    def count(
        self,
        op: str,
        t: float,
        latency_s: float | None,
        error: ErrorInfo | None,
        reward: float | None,
        components: dict[str, float | None],
        terminated: bool,
        truncated: bool,
        observation: dict[str, Any] | None,
    ) -> None:
        """Account for one step line given by its fields (the recorder's fast path)."""
        if self.started is None:
            self.started = t
        self.finished = t + (latency_s or 0.0)
        if op == "step":
            self.length += 1
        if error is not None:
            self.error = error
            return
        self.error = None
        if op == "step" and reward is not None:
            self.total_reward += reward
        for name, value in components.items():
            self.components[name] = self.components.get(name, 0.0) + (
                math.nan if value is None else value
            )
        self.terminated, self.truncated = terminated, truncated
        done = terminated or truncated
        self.success = success_of(observation, terminated, truncated, reward) if done else None

    @property
    def done(self) -> bool:
        """True once a line ended the episode."""
        return self.terminated or self.truncated

    def end(
        self,
        episode: str,
        session: str | None,
        seed: int | None,
        task: TaskRef | None,
        outcome: Outcome | None = None,
        error: ErrorInfo | None = None,
    ) -> EpisodeEnd:
        """The end line of ``episode``.

        ``outcome`` defaults to how the last line ended it (``terminated``/``truncated``).
        """
        if outcome is None:
            outcome = "truncated" if self.truncated else "terminated"
        duration = None
        if self.started is not None and self.finished is not None:
            duration = max(0.0, self.finished - self.started)
        return EpisodeEnd(
            episode=episode,
            session=session,
            seed=seed,
            task=task,
            outcome=outcome,
            length=self.length,
            total_reward=self.total_reward if math.isfinite(self.total_reward) else None,
            reward_components={
                k: v if math.isfinite(v) else None for k, v in self.components.items()
            },
            success=self.success if outcome in ("terminated", "truncated") else None,
            duration_s=duration,
            error=error,
        )


def success_of(
    observation: dict[str, Any] | None, terminated: bool, truncated: bool, reward: float | None
) -> bool:
    """Whether an episode ended by this observation was a success (see
    :class:`EpisodeEnd`): its ``metadata["success"]``, else terminated with a positive
    reward."""
    metadata = (observation or {}).get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("success"), bool):
        return bool(metadata["success"])
    return terminated and not truncated and (reward or 0.0) > 0.0


@dataclass
class Episode:
    """One episode read back: its header, its step lines in order, its end line.

    Attributes:
        id: the episode's id.
        header: the header of the segment it was recorded in.
        records: its step lines; ``records[0]`` is the reset (unless the recording
            started mid-episode).
        end: its end line, None when the file has none (the writer was stopped).
        line: the number of its first line in the file (0 when not read from one).
    """

    id: str
    header: Header
    records: list[StepRecord] = field(default_factory=list)
    end: EpisodeEnd | None = None
    line: int = 0

    @property
    def complete(self) -> bool:
        """True when the file holds the episode's end line."""
        return self.end is not None

    @property
    def first(self) -> StepRecord | None:
        """The first line (normally the reset)."""
        return self.records[0] if self.records else None

    @property
    def session(self) -> str | None:
        """The session that ran it."""
        return self.first.session if self.first else None

    @property
    def seed(self) -> int | None:
        """The seed of its reset."""
        return self.first.seed if self.first else None

    @property
    def task(self) -> TaskRef | None:
        """The task it was reset with."""
        return self.first.task if self.first else None

    @property
    def options(self) -> dict[str, Any]:
        """The reset options (besides the seed and the task)."""
        first = self.first
        return dict(first.options or {}) if first is not None and first.op == "reset" else {}

    @property
    def steps(self) -> list[StepRecord]:
        """The ``step`` lines (the reset left out)."""
        return [r for r in self.records if r.op == "step"]

    @property
    def actions(self) -> list[dict[str, Any]]:
        """The actions, in order (failed steps included)."""
        return [r.action for r in self.records if r.op == "step" and r.action is not None]

    @property
    def observations(self) -> list[dict[str, Any] | None]:
        """Every line's observation, the reset's first; None where a request failed."""
        return [r.observation for r in self.records]

    @property
    def rewards(self) -> list[float | None]:
        """Each step's reward."""
        return [r.reward for r in self.records if r.op == "step"]

    @property
    def summary(self) -> EpisodeEnd:
        """The end line, or the one computed from the lines (outcome ``incomplete``)."""
        if self.end is not None:
            return self.end
        tally = self.tally()
        first = self.first
        if first is None:
            return EpisodeEnd(episode=self.id, outcome="incomplete")
        outcome: Outcome | None = None if tally.done else "incomplete"
        return tally.end(first.episode, first.session, first.seed, first.task, outcome, tally.error)

    def outline(self) -> Episode:
        """This episode as a report over many episodes keeps it, so as not to hold the
        whole file: its id, header, end line and first line (the reset: seed, task and
        options), that line without its observation and state (an image env's first
        observation alone can be large). The other step lines are gone."""
        first = self.records[:1]
        if first:
            first = [first[0].model_copy(update={"observation": {}, "state": None})]
        return Episode(self.id, self.header, first, self.end, self.line)

    def tally(self) -> Tally:
        """The running totals over all its lines."""
        tally = Tally()
        for record in self.records:
            tally.add(record)
        return tally


def collect(
    lines: Iterable[Header | StepRecord | EpisodeEnd], header: Header | None = None
) -> list[Episode]:
    """The episodes of lines held in memory (e.g. a recorder's list sink), in the order
    they started; ``header`` stands in when the lines do not begin with one.

    Raises:
        EpisodeFormatError: the lines break the format (see :func:`assemble`).
    """
    numbered = list(enumerate(lines, 1))
    if header is not None and not (numbered and isinstance(numbered[0][1], Header)):
        numbered.insert(0, (0, header))
    return sorted(assemble(numbered), key=lambda e: e.line)


def assemble(
    lines: Iterable[tuple[int, Header | StepRecord | EpisodeEnd]], *, strict: bool = True
) -> Iterator[Episode]:
    """Group numbered lines into episodes, each yielded once complete.

    Episodes still open when the lines run out are yielded last, in the order they
    started. Ids are scoped by segment: a new header starts a fresh namespace.

    Raises:
        EpisodeFormatError: (``strict``) a line before any header, a line of an episode
            that already ended, or an index out of order.
    """
    header: Header | None = None
    open_: dict[str, Episode] = {}
    ended: set[str] = set()
    for number, line in lines:
        if isinstance(line, Header):
            yield from open_.values()
            header, open_, ended = line, {}, set()
            continue
        if header is None:
            raise EpisodeFormatError(
                "the file does not start with a header line (kind 'header')", line=number
            )
        episode = open_.get(line.episode)
        if episode is None:
            if line.episode in ended:
                if strict:
                    raise EpisodeFormatError(f"episode {line.episode!r} already ended", line=number)
                ended.discard(line.episode)
            episode = Episode(id=line.episode, header=header, line=number)
            open_[line.episode] = episode
        if isinstance(line, EpisodeEnd):
            episode.end = line
            del open_[line.episode]
            ended.add(line.episode)
            yield episode
            continue
        if strict and episode.records and line.index != episode.records[-1].index + 1:
            raise EpisodeFormatError(
                f"episode {line.episode!r}: index {line.index} follows {episode.records[-1].index}",
                line=number,
            )
        episode.records.append(line)
    yield from open_.values()

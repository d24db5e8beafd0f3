"""``EpisodeRecorder``: live ``reset``/``step`` outcomes in, episode lines out.

It keeps one open episode per session: a reset opens one (ending the previous one
as ``abandoned`` if it was still running), each step adds a line, and the step that
ends the episode, or an error that ends the session, writes its end line. The client,
the pool, the eval runner and replay all record through it, so their files agree.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from corral.contract.tasks import TaskRef
from corral.episodes.episode import Tally
from corral.episodes.files import AnyLine, EpisodeWriter
from corral.episodes.format import (
    SESSION_ENDING_CODES,
    EpisodeEnd,
    ErrorInfo,
    Outcome,
    StepRecord,
)

Sink = Callable[[AnyLine], None]
"""Where lines go: an :class:`EpisodeWriter`'s ``write``, a list's ``append``, ..."""


@dataclass
class _Open:
    first: StepRecord
    tally: Tally = field(default_factory=Tally)
    next_index: int = 1


class EpisodeRecorder:
    """Records the episodes of any number of sessions into one sink.

    Args:
        sink: an :class:`EpisodeWriter` or any callable taking a line.
        auto_reset: the environment resets itself on a step after the end, so such a
            step is recorded as the reset of a new episode.
        new_id: makes the id of each new episode (default: random, 16 hex digits).
    """

    def __init__(
        self,
        sink: EpisodeWriter | Sink,
        *,
        auto_reset: bool = False,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self._write: Sink = sink.write if isinstance(sink, EpisodeWriter) else sink
        self.auto_reset = auto_reset
        self._new_id = new_id or (lambda: uuid.uuid4().hex[:16])
        self._open: dict[str, _Open] = {}
        self._ended: set[str] = set()
        self.last_end: EpisodeEnd | None = None
        """The end line written last."""

    def episode_of(self, session: str) -> str | None:
        """The id of the episode ``session`` is in, None if none is open."""
        current = self._open.get(session)
        return current.first.episode if current is not None else None

    def reset(
        self,
        session: str,
        *,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        task: TaskRef | None = None,
        observation: BaseModel | Mapping[str, Any] | None = None,
        error: BaseException | ErrorInfo | None = None,
        t: float = 0.0,
        latency_s: float | None = None,
        state: BaseModel | Mapping[str, Any] | None = None,
        episode: str | None = None,
        action: BaseModel | Mapping[str, Any] | None = None,
    ) -> str:
        """Record a reset of ``session``; returns the new episode's id.

        ``task`` defaults to the ``split``/``index`` reset options when both are given.
        ``action`` is for a step an auto-resetting environment answered with a reset.
        """
        self.end(session, "abandoned")
        options = dict(options or {})
        if task is None:
            task = _task_of(options)
        record = _record(
            episode=episode or self._new_id(),
            session=session,
            index=0,
            op="reset",
            seed=seed,
            task=task,
            options=options,
            action=action,
            observation=observation,
            error=error,
            t=t,
            latency_s=latency_s,
            state=state,
        )
        self._open[session] = current = _Open(first=record)
        self._ended.discard(session)
        self._add(session, current, record)
        return record.episode

    def step(
        self,
        session: str,
        *,
        action: BaseModel | Mapping[str, Any],
        observation: BaseModel | Mapping[str, Any] | None = None,
        error: BaseException | ErrorInfo | None = None,
        t: float = 0.0,
        latency_s: float | None = None,
        state: BaseModel | Mapping[str, Any] | None = None,
    ) -> None:
        """Record a step of ``session``.

        A step of a session with no open episode (before any reset, or after the end
        without auto-reset) is recorded in an episode of its own, so nothing is lost.
        """
        current = self._open.get(session)
        if current is None and self.auto_reset and session in self._ended and error is None:
            self.reset(
                session,
                action=action,
                observation=observation,
                t=t,
                latency_s=latency_s,
                state=state,
            )
            return
        if current is None:
            record = _record(
                episode=self._new_id(),
                session=session,
                index=0,
                op="step",
                action=action,
                observation=observation,
                error=error,
                t=t,
                latency_s=latency_s,
                state=state,
            )
            self._open[session] = current = _Open(first=record)
        else:
            first = current.first
            record = _record(
                episode=first.episode,
                session=session,
                index=current.next_index,
                op="step",
                seed=first.seed,
                task=first.task,
                action=action,
                observation=observation,
                error=error,
                t=t,
                latency_s=latency_s,
                state=state,
            )
            current.next_index += 1
        self._add(session, current, record)

    def end(
        self, session: str, outcome: Outcome = "abandoned", error: ErrorInfo | None = None
    ) -> None:
        """End ``session``'s open episode, if any, with ``outcome``."""
        current = self._open.pop(session, None)
        if current is None:
            return
        self._ended.add(session)
        self.last_end = current.tally.end(current.first, outcome, error)
        self._write(self.last_end)

    def close(self) -> None:
        """End every open episode as ``abandoned`` (the sink stays open)."""
        for session in list(self._open):
            self.end(session, "abandoned")

    def _add(self, session: str, current: _Open, record: StepRecord) -> None:
        self._write(record)
        current.tally.add(record)
        if record.error is not None and record.error.code in SESSION_ENDING_CODES:
            self.end(session, "failed", record.error)
        elif record.done:
            self.end(session, "truncated" if record.truncated else "terminated")


def _record(
    *,
    observation: BaseModel | Mapping[str, Any] | None,
    error: BaseException | ErrorInfo | None,
    action: BaseModel | Mapping[str, Any] | None,
    state: BaseModel | Mapping[str, Any] | None,
    **fields: Any,
) -> StepRecord:
    obs = _json(observation)
    reward: float | None = None
    done = truncated = False
    components: dict[str, float] = {}
    if obs is not None and error is None:
        raw_reward = obs.get("reward")
        reward = float(raw_reward) if isinstance(raw_reward, (int, float)) else None
        done, truncated = bool(obs.get("done")), bool(obs.get("truncated"))
        raw_components = obs.get("reward_components")
        if isinstance(raw_components, Mapping):
            components = {str(k): float(v) for k, v in raw_components.items()}
    if error is not None and not isinstance(error, ErrorInfo):
        error = ErrorInfo.of(error)
    return StepRecord(
        observation=obs if error is None else None,
        error=error,
        action=_json(action),
        state=_json(state),
        reward=reward,
        reward_components=components,
        terminated=done and not truncated,
        truncated=truncated,
        **fields,
    )


def _json(value: BaseModel | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return dict(value)


def _task_of(options: Mapping[str, Any]) -> TaskRef | None:
    split, index = options.get("split"), options.get("index")
    if isinstance(split, str) and isinstance(index, int) and not isinstance(index, bool):
        try:
            return TaskRef(split=split, index=index)
        except ValueError:
            return None  # not a task address; the options are recorded as they are
    return None

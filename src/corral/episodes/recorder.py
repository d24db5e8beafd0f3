"""``EpisodeRecorder``: live ``reset``/``step`` outcomes in, episode lines out.

It keeps one open episode per session: a reset opens one (ending the previous one
as ``abandoned`` if it was still running), each step adds a line, and the step that
ends the episode, or an error that ends the session, writes its end line. The client,
the pool, the eval runner and replay all record through it, so their files agree.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from corral.contract.tasks import TaskRef
from corral.episodes.episode import Tally
from corral.episodes.files import AnyLine, EpisodeWriter
from corral.episodes.format import (
    SESSION_ENDING_CODES,
    EpisodeEnd,
    ErrorInfo,
    Lineage,
    Outcome,
    StepRecord,
)

Sink = Callable[[AnyLine], None]
"""Where lines go: an :class:`EpisodeWriter`'s ``write``, a list's ``append``, ..."""


@dataclass
class _Open:
    episode: str
    seed: int | None
    task: TaskRef | None
    tally: Tally = field(default_factory=Tally)
    next_index: int = 1


class EpisodeRecorder:
    """Records the episodes of any number of sessions into one sink.

    Args:
        sink: an :class:`EpisodeWriter` or any callable taking a line.
        auto_reset: the environment resets itself on a step after the end, so such a
            step is recorded as the reset of a new episode.
        new_id: makes the id of each new episode (default: random, 16 hex digits).

    With an :class:`EpisodeWriter` as the sink, step lines are encoded straight from
    their fields (no model is built for them: recording costs less per step); the bytes
    are the same as :func:`~corral.episodes.format.dump_line` of the model would give.
    """

    def __init__(
        self,
        sink: EpisodeWriter | Sink,
        *,
        auto_reset: bool = False,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self._writer = sink if isinstance(sink, EpisodeWriter) else None
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
        return current.episode if current is not None else None

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
        parent: Lineage | None = None,
    ) -> str:
        """Record a reset of ``session``; returns the new episode's id.

        ``task`` defaults to the ``split``/``index`` reset options when both are given.
        ``action`` is for a step an auto-resetting environment answered with a reset.
        ``parent``: the episode is a fork of another (its first line says of which).
        """
        self.end(session, "abandoned")
        options = dict(options or {})
        if task is None:
            task = _task_of(options)
        current = _Open(episode=episode or self._new_id(), seed=seed, task=task)
        self._open[session] = current
        self._ended.discard(session)
        self._add(
            session,
            current,
            0,
            "reset",
            options,
            action,
            observation,
            error,
            t,
            latency_s,
            state,
            parent,
        )
        return current.episode

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
            current = _Open(episode=self._new_id(), seed=None, task=None, next_index=0)
            self._open[session] = current
        index = current.next_index
        current.next_index += 1
        self._add(
            session, current, index, "step", None, action, observation, error, t, latency_s, state
        )

    def end(
        self, session: str, outcome: Outcome = "abandoned", error: ErrorInfo | None = None
    ) -> None:
        """End ``session``'s open episode, if any, with ``outcome``."""
        current = self._open.pop(session, None)
        if current is None:
            return
        self._ended.add(session)
        self.last_end = current.tally.end(
            current.episode, session, current.seed, current.task, outcome, error
        )
        self._write(self.last_end)

    def close(self) -> None:
        """End every open episode as ``abandoned`` (the sink stays open)."""
        for session in list(self._open):
            self.end(session, "abandoned")

    def _add(
        self,
        session: str,
        current: _Open,
        index: int,
        op: Literal["reset", "step"],
        options: dict[str, Any] | None,
        action: BaseModel | Mapping[str, Any] | None,
        observation: BaseModel | Mapping[str, Any] | None,
        error: BaseException | ErrorInfo | None,
        t: float,
        latency_s: float | None,
        state: BaseModel | Mapping[str, Any] | None,
        parent: Lineage | None = None,
    ) -> None:
        obs = _json(observation) if error is None else None
        info = (
            None
            if error is None
            else error
            if isinstance(error, ErrorInfo)
            else ErrorInfo.of(error)
        )
        if obs is None and info is None:
            raise ValueError("a step line needs an observation or an error")
        if op == "step" and action is None:
            raise ValueError("a step line with op 'step' needs its action")
        reward, components, terminated, truncated = _outcome(obs)
        # The fields in StepRecord's order, null ones left out, as dump_line writes them.
        fields: dict[str, Any] = {
            "kind": "step",
            "episode": current.episode,
            "session": session,
            "index": index,
            "op": op,
        }
        if current.seed is not None:
            fields["seed"] = current.seed
        if current.task is not None:
            fields["task"] = {"split": current.task.split, "index": current.task.index}
        for name, value in (
            ("options", options),
            ("action", _json(action)),
            ("observation", obs),
            ("state", _json(state)),
            ("reward", reward),
        ):
            if value is not None:
                fields[name] = value
        fields["reward_components"] = components
        fields["terminated"] = terminated
        fields["truncated"] = truncated
        fields["t"] = float(t)
        if latency_s is not None:
            fields["latency_s"] = float(latency_s)
        if info is not None:
            fields["error"] = info.model_dump(mode="json", exclude_none=True)
        if parent is not None:
            fields["parent"] = parent.model_dump(mode="json", exclude_none=True)
        if self._writer is None or not self._writer.write_fields(fields):
            self._write(StepRecord.model_validate(fields))
        current.tally.count(op, t, latency_s, info, reward, components, terminated, truncated, obs)
        if info is not None and info.code in SESSION_ENDING_CODES:
            self.end(session, "failed", info)
        elif terminated or truncated:
            self.end(session, "truncated" if truncated else "terminated")


def _outcome(
    obs: dict[str, Any] | None,
) -> tuple[float | None, dict[str, float | None], bool, bool]:
    """``(reward, components, terminated, truncated)`` of an observation's JSON form."""
    if obs is None:
        return None, {}, False, False
    reward = _finite(obs.get("reward"))
    done, truncated = bool(obs.get("done")), bool(obs.get("truncated"))
    raw_components = obs.get("reward_components")
    components: dict[str, float | None] = {}
    if isinstance(raw_components, Mapping):
        components = {str(k): _finite(v) for k, v in raw_components.items()}
    return reward, components, done and not truncated, truncated


def _finite(value: Any) -> float | None:
    """``value`` as a float, None unless it is a finite number (JSON has no NaN)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


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

"""A run's directory: its settings (``run.json``), what is left to play, and the files.

``run.json`` keeps the settings; resuming checks that those defining the episodes
(policy, split, seed, options, max steps) are unchanged. :func:`plan` takes the episode
file as read back (:func:`recorded`, read once per run) and says which episodes are
finished (their last attempt ended, or failed with no retries left) and which attempt
each other one plays next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.episodes import Episode, read
from corral.errors import validation_message
from corral.evaluation.report import final_attempts, parse_episode_id

RUN_FILE = "run.json"
EPISODES_FILE = "episodes.jsonl"
SUMMARY_FILE = "summary.json"


class EvalError(Exception):
    """The evaluation cannot run as asked; the message says why and what to do."""


class RunSettings(BaseModel):
    """What ``run.json`` keeps: the settings that define a run's episodes, and the rest."""

    model_config = ConfigDict(extra="ignore")

    target: str
    policy: str
    episodes: int = Field(ge=1)
    split: str | None = None
    seed: int = 0
    max_steps: int = Field(ge=1)
    retries: int = Field(ge=0)
    concurrency: int = Field(ge=1)
    options: dict[str, Any] = Field(default_factory=dict)

    DEFINING: ClassVar[tuple[str, ...]] = ("policy", "split", "seed", "max_steps", "options")

    def conflicts(self, other: RunSettings) -> list[str]:
        """The defining settings that differ from ``other``'s."""
        return [
            f"{name}: {getattr(other, name)!r} before, {getattr(self, name)!r} now"
            for name in self.DEFINING
            if getattr(self, name) != getattr(other, name)
        ]


def previous_settings(out: Path, *, resume: bool) -> RunSettings | None:
    """The settings of the run already in ``out``, if any.

    Raises:
        EvalError: there is one and ``resume`` is off, or ``run.json`` is not one.
    """
    path = out / RUN_FILE
    if not path.exists():
        return None
    if not resume:
        raise EvalError(f"{out} already holds a run: resume it, or use another --out")
    try:
        return RunSettings.model_validate_json(path.read_text())
    except ValidationError as exc:
        raise EvalError(validation_message(f"{path} is not a run's settings file", exc)) from None


def check_settings(out: Path, settings: RunSettings, previous: RunSettings | None) -> None:
    """Refuse ``settings`` that would change the episodes of the ``previous`` run.

    Raises:
        EvalError: naming each setting that differs.
    """
    if previous is not None and (conflicts := settings.conflicts(previous)):
        raise EvalError(
            f"{out} holds a run with other settings ({'; '.join(conflicts)}): "
            "use another --out, or the same settings to resume it"
        )


def save_settings(out: Path, settings: RunSettings, previous: RunSettings | None) -> None:
    """Write ``run.json``.

    Raises:
        EvalError: ``settings`` would change the episodes of the ``previous`` run.
    """
    check_settings(out, settings, previous)
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_FILE).write_text(settings.model_dump_json(indent=2) + "\n")


@dataclass
class Plan:
    """What a (resumed) run still has to play.

    Attributes:
        queue: ``(k, attempt)`` of every episode to play, in order.
        failures: failed attempts so far, per episode.
        finished: episodes already over (kept from earlier runs).
        successes: how many of those succeeded.
    """

    queue: list[tuple[int, int]] = field(default_factory=list)
    failures: dict[int, int] = field(default_factory=dict)
    finished: int = 0
    successes: int = 0


def recorded(episodes_path: Path) -> list[Episode]:
    """The episodes a run's file holds (none when there is no file yet)."""
    return read(episodes_path, strict=False) if episodes_path.exists() else []


def plan(episodes: Sequence[Episode], planned: int, retries: int) -> Plan:
    """The episodes ``0..planned-1`` still to play, given the ones ``episodes`` recorded."""
    attempts = final_attempts(episodes)
    out = Plan()
    for k in range(planned):
        tried = attempts.get(k, [])
        complete = [a for a in tried if a.complete]
        failed = sum(a.summary.outcome == "failed" for a in complete)
        out.failures[k] = failed
        if (complete and complete[-1].summary.outcome != "failed") or failed > retries:
            out.finished += 1
            out.successes += complete[-1].summary.success is True
            continue
        numbers = [parsed[1] for a in tried if (parsed := parse_episode_id(a.id)) is not None]
        out.queue.append((k, 1 + max(numbers, default=-1)))
    return out

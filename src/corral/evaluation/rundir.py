"""A run's directory: its settings (``run.json``), what is left to play, and the files.

``run.json`` keeps the settings; resuming checks that those defining the episodes
(policy, split, seed, options, max steps) are unchanged. :func:`plan` takes the episode
file as read back (:func:`recorded`, read once per run) and says which episodes are
finished (their last attempt ended, or failed with no retries left) and which attempt
each other one plays next; an episode file this corral cannot read (a newer format, a
damaged header) is an :class:`EvalError` that says so, never a traceback.

The directory's files are its own: ``run.json``, ``episodes.jsonl`` and ``summary.json``
are never followed through a symbolic link (:func:`run_file`, and ``O_NOFOLLOW`` when
written: :func:`write_run_file`, ``EpisodeWriter(follow_symlinks=False)``), so a run
cannot be made to append or write outside its directory.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.episodes import Episode, EpisodeFormatError, read
from corral.errors import UsageError, validation_message
from corral.evaluation.report import final_attempts, parse_episode_id

RUN_FILE = "run.json"
EPISODES_FILE = "episodes.jsonl"
SUMMARY_FILE = "summary.json"


class EvalError(UsageError):
    """The evaluation cannot run as asked; the message says why and what to do."""


def run_file(out: Path, name: str) -> Path:
    """``out / name``, a file of the run directory.

    Raises:
        EvalError: it is a symbolic link, or exists and is not a regular file.
    """
    path = out / name
    if path.is_symlink():
        raise EvalError(
            f"{path} is a symbolic link: a run directory's files must be its own "
            "(remove the link, or use another --out)"
        )
    if path.exists() and not path.is_file():
        raise EvalError(f"{path} is not a regular file: use another --out")
    return path


def write_run_file(out: Path, name: str, text: str) -> None:
    """Write ``text`` to the run directory's file ``name``, refusing a symbolic link as
    the file is opened (``O_NOFOLLOW``).

    Raises:
        EvalError: ``name`` is a link or not a regular file.
    """
    path = run_file(out, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise EvalError(
                f"{path} is a symbolic link: a run directory's files must be its own"
            ) from None
        raise
    with os.fdopen(fd, "w") as file:
        file.write(text)


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
    path = run_file(out, RUN_FILE)
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
    write_run_file(out, RUN_FILE, settings.model_dump_json(indent=2) + "\n")


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
    """The episodes a run's file holds (none when there is no file yet, or an empty one).

    Raises:
        EvalError: the file is a link, or this corral cannot read it (a newer format).
    """
    episodes_path = run_file(episodes_path.parent, episodes_path.name)
    if not episodes_path.exists() or episodes_path.stat().st_size == 0:
        return []
    try:
        return read(episodes_path, strict=False)
    except EpisodeFormatError as exc:
        raise EvalError(
            f"cannot resume the run in {episodes_path.parent}: {episodes_path.name}, {exc}"
        ) from None


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

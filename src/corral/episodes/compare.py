"""Comparing episodes: where a replay (or a second run) first departs from a recording.

Two episodes agree when each request got the same outcome: the same error code, or
the same observation (compared as JSON, so ``reward``, ``done``, ``truncated`` and
``metadata`` included). Paths listed in ``ignore`` are left out of the comparison, for
fields that legitimately change between runs (timings, ids).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.episodes.episode import Episode
from corral.episodes.format import StepRecord


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first path where two JSON values differ (e.g. ``history[2].pattern``), or None.

    Dict keys are visited in sorted order; a key present on one side only, or lists of
    different lengths, count as a difference at that path.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return where
            found = first_difference(a[key], b[key], where)
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path or '(value)'} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if type(a) is not type(b) and not (_number(a) and _number(b)):
        return path or "(value)"
    return None if a == b else (path or "(value)")


def value_at(value: Any, path: str) -> Any:
    """The value at a dotted ``path`` as :func:`first_difference` spells it (or None)."""
    for part in _parts(path.split(" (length", 1)[0]):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            value = value[part]
        else:
            return None
    return value


@dataclass(frozen=True)
class Divergence:
    """Where an episode first departed from the recording it was compared with.

    Attributes:
        episode: the recorded episode's id.
        index: the line where they differ (0 = the reset).
        op: ``reset`` or ``step``.
        path: what differs: ``observation.<field path>``, ``error``, or ``length``.
        expected: the recorded value there.
        actual: the value seen instead.
    """

    episode: str
    index: int
    op: str
    path: str
    expected: Any
    actual: Any

    def __str__(self) -> str:
        where = "the reset" if self.index == 0 else f"step {self.index}"
        return (
            f"episode {self.episode}: {where} differs at {self.path}: "
            f"recorded {_short(self.expected)}, got {_short(self.actual)}"
        )


def compare(recorded: Episode, actual: Episode, *, ignore: Sequence[str] = ()) -> Divergence | None:
    """The first place ``actual`` departs from ``recorded``, or None if they agree.

    Args:
        recorded: the reference episode.
        actual: the episode to check (e.g. its replay).
        ignore: observation field paths to leave out (``metadata.elapsed``; ``*``
            matches any key or list item at its level).
    """
    for mine, theirs in zip(recorded.records, actual.records, strict=False):
        found = compare_records(mine, theirs, ignore=ignore)
        if found is not None:
            return Divergence(recorded.id, mine.index, mine.op, *found)
    if len(recorded.records) != len(actual.records):
        index = min(len(recorded.records), len(actual.records))
        op = (recorded.records if index < len(recorded.records) else actual.records)[index].op
        return Divergence(
            recorded.id, index, op, "length", len(recorded.records), len(actual.records)
        )
    return None


def compare_records(
    recorded: StepRecord, actual: StepRecord, *, ignore: Sequence[str] = ()
) -> tuple[str, Any, Any] | None:
    """``(path, recorded value, actual value)`` where two lines' outcomes differ, or None."""
    code_a = recorded.error.code if recorded.error else None
    code_b = actual.error.code if actual.error else None
    if code_a != code_b:
        return "error", code_a, code_b
    if recorded.observation is None or actual.observation is None:
        return None
    a = _without(recorded.observation, ignore)
    b = _without(actual.observation, ignore)
    where = first_difference(a, b)
    if where is None:
        return None
    return f"observation.{where}", value_at(a, where), value_at(b, where)


def _without(value: dict[str, Any], ignore: Sequence[str]) -> dict[str, Any]:
    if not ignore:
        return value
    copy: dict[str, Any] = _copy(value)
    for path in ignore:
        _drop(copy, [p for p in path.split(".") if p])
    return copy


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _drop(value: Any, parts: list[str]) -> None:
    if not parts:
        return
    head, rest = parts[0], parts[1:]
    if isinstance(value, dict):
        keys = list(value) if head == "*" else [head] if head in value else []
        for key in keys:
            if rest:
                _drop(value[key], rest)
            else:
                del value[key]
    elif isinstance(value, list) and head == "*":
        for item in value:
            _drop(item, rest)


def _parts(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for chunk in path.split("."):
        name, _, rest = chunk.partition("[")
        if name:
            parts.append(name)
        while rest:
            number, _, rest = rest.partition("]")
            parts.append(int(number))
            rest = rest.removeprefix("[")
    return parts


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

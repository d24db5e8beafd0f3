"""The summary of an evaluation, computed from its episode file.

Episode ``k`` of a run is recorded as ``ep<k>-a<attempt>`` (``ep000017-a0``, then
``ep000017-a1`` if it was retried); its result is its last attempt. Returns and lengths
are over the episodes that finished (terminated or truncated); the success rate is over
all of them, a failed episode counting as no success; errors count every failed
request and every failed attempt, by code.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, Field
from rich.table import Table

from corral.episodes import Episode

_ID = re.compile(r"ep(\d+)-a(\d+)")


def episode_id(k: int, attempt: int) -> str:
    """The id of attempt ``attempt`` of episode ``k``."""
    return f"ep{k:06d}-a{attempt}"


def parse_episode_id(text: str) -> tuple[int, int] | None:
    """``(k, attempt)`` of an id made by :func:`episode_id`, else None."""
    match = _ID.fullmatch(text)
    return (int(match[1]), int(match[2])) if match else None


class Throughput(BaseModel):
    """What this process did, timed from the pool being ready to the end."""

    episodes: int = 0
    steps: int = 0
    duration_s: float = 0.0

    @property
    def steps_per_s(self) -> float:
        """Steps per second."""
        return self.steps / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def episodes_per_s(self) -> float:
        """Episodes per second."""
        return self.episodes / self.duration_s if self.duration_s > 0 else 0.0


class EvalSummary(BaseModel):
    """An evaluation's results (see the module docstring)."""

    env: str = ""
    fingerprint: str | None = None
    policy: str = ""
    split: str | None = None
    planned: int = 0
    episodes: int = 0
    outcomes: dict[str, int] = Field(default_factory=dict)
    success_rate: float | None = None
    mean_return: float | None = None
    median_return: float | None = None
    min_return: float | None = None
    max_return: float | None = None
    mean_length: float | None = None
    median_length: float | None = None
    components: dict[str, float] = Field(default_factory=dict)
    """Mean per finished episode of each reward component."""
    errors: dict[str, int] = Field(default_factory=dict)
    attempts: int = 0
    retried: int = 0
    """Episodes that needed more than one attempt."""
    steps: int = 0
    duration_s: float = 0.0
    steps_per_s: float = 0.0
    episodes_per_s: float = 0.0


def final_attempts(episodes: Iterable[Episode]) -> dict[int, list[Episode]]:
    """``{k: [attempts in order]}`` for the run's episodes (others are ignored)."""
    out: dict[int, list[Episode]] = {}
    for episode in episodes:
        parsed = parse_episode_id(episode.id)
        if parsed is not None:
            out.setdefault(parsed[0], []).append(episode)
    for attempts in out.values():
        attempts.sort(key=lambda e: parse_episode_id(e.id) or (0, 0))
    return out


def summarize(
    episodes: Iterable[Episode],
    *,
    planned: int,
    policy: str = "",
    split: str | None = None,
    throughput: Throughput | None = None,
) -> EvalSummary:
    """The summary of a run's recorded episodes (complete ones; the last attempt of each)."""
    runs = final_attempts(e for e in episodes if e.complete)
    errors: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    returns: list[float] = []
    lengths: list[int] = []
    components: Counter[str] = Counter()
    successes = 0
    env, fingerprint = "", None
    for attempts in runs.values():
        for attempt in attempts:
            env = env or attempt.header.env.name
            fingerprint = fingerprint or attempt.header.env.fingerprint
            errors.update(r.error.code for r in attempt.records if r.error is not None)
            end = attempt.summary
            last = attempt.records[-1].error if attempt.records else None
            # A failure that a request's error caused was counted with the request.
            if end.error is not None and (last is None or last.code != end.error.code):
                errors[end.error.code] += 1
        final = attempts[-1].summary
        outcomes[final.outcome] += 1
        successes += final.success is True
        if final.outcome in ("terminated", "truncated"):
            if final.total_reward is not None:
                returns.append(final.total_reward)
            lengths.append(final.length)
            components.update({k: v for k, v in final.reward_components.items() if v is not None})
    finished = len(lengths)
    stats = throughput or Throughput()
    return EvalSummary(
        env=env,
        fingerprint=fingerprint,
        policy=policy,
        split=split,
        planned=planned,
        episodes=len(runs),
        outcomes=dict(outcomes),
        success_rate=successes / len(runs) if runs else None,
        mean_return=statistics.fmean(returns) if returns else None,
        median_return=statistics.median(returns) if returns else None,
        min_return=min(returns) if returns else None,
        max_return=max(returns) if returns else None,
        mean_length=statistics.fmean(lengths) if lengths else None,
        median_length=statistics.median(lengths) if lengths else None,
        components={k: v / finished for k, v in sorted(components.items())} if finished else {},
        errors=dict(sorted(errors.items())),
        attempts=sum(len(a) for a in runs.values()),
        retried=sum(len(a) > 1 for a in runs.values()),
        steps=stats.steps,
        duration_s=round(stats.duration_s, 3),
        steps_per_s=round(stats.steps_per_s, 1),
        episodes_per_s=round(stats.episodes_per_s, 2),
    )


def summary_table(summary: EvalSummary) -> Table:
    """The summary as a two-column rich table."""
    title = f"{summary.env or 'environment'}: {summary.policy}"
    if summary.split:
        title += f" on split {summary.split}"
    table = Table("", "", title=title, show_header=False, title_justify="left")

    def number(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    table.add_row("episodes", f"{summary.episodes} of {summary.planned}")
    table.add_row("outcomes", ", ".join(f"{n} {o}" for o, n in sorted(summary.outcomes.items())))
    rate = summary.success_rate
    table.add_row("success rate", "-" if rate is None else f"{rate:.1%}")
    table.add_row(
        "return",
        f"mean {number(summary.mean_return)}, median {number(summary.median_return)} "
        f"(min {number(summary.min_return)}, max {number(summary.max_return)})",
    )
    table.add_row(
        "episode length",
        f"mean {number(summary.mean_length, 2)}, median {number(summary.median_length, 1)}",
    )
    for name, value in summary.components.items():
        table.add_row(f"  reward {name}", f"mean {value:.3f} per episode")
    errors = ", ".join(f"{code} {n}" for code, n in summary.errors.items())
    table.add_row("errors", errors or "none")
    table.add_row("attempts", f"{summary.attempts} ({summary.retried} episode(s) retried)")
    table.add_row(
        "throughput",
        f"{summary.steps_per_s:.1f} steps/s, {summary.episodes_per_s:.2f} episodes/s "
        f"({summary.steps} steps in {summary.duration_s:.1f} s, this run)",
    )
    return table

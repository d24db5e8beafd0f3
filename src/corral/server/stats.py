"""Server counters, kept cheap on the hot path and read by ``/metrics`` at scrape time."""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from dataclasses import dataclass, field

from corral.protocol.session import Op

LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds (seconds) of the environment-call latency histogram."""


@dataclass
class Histogram:
    """Fixed-bucket latency counts; ``counts[i]`` holds observations in bucket ``i``."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    observations: int = 0

    def observe(self, seconds: float) -> None:
        """Record one observation."""
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds
        self.observations += 1

    def observe_many(self, seconds: list[float]) -> None:
        """Record many observations (one batch's) at once."""
        counts = self.counts
        # Counted in C (Counter's update), then added per bucket: a batch has a few.
        buckets = Counter(map(functools.partial(bisect.bisect_left, self.bounds), seconds))
        for bucket, count in buckets.items():
            counts[bucket] += count
        self.total += sum(seconds)
        self.observations += len(seconds)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs as Prometheus exposes them, ending with +Inf."""
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


@dataclass
class Stats:
    """Counters a server exposes in ``/ready`` and ``/metrics``."""

    opened: int = 0
    closed: int = 0
    reaped: int = 0
    steps: int = 0
    resets: int = 0
    connections: int = 0
    snapshots: int = 0
    """Session snapshots taken (``snapshot`` answered)."""
    restores: int = 0
    """Sessions restored from a snapshot (``restore`` answered)."""
    frames: int = 0
    """Frames received on the protocol's connections (what tells the GC pacer that the
    loop is busy)."""
    errors: dict[str, int] = field(default_factory=dict)
    latency: dict[str, Histogram] = field(default_factory=dict)

    def error(self, code: str) -> None:
        """Count one error reply of ``code``."""
        self.errors[code] = self.errors.get(code, 0) + 1

    def count(self, op: Op) -> None:
        """Count one environment call that returned its model (steps and resets only)."""
        if op is Op.STEP:
            self.steps += 1
        elif op is Op.RESET or op is Op.AUTO_RESET:
            self.resets += 1

    def observe_many(self, op: Op, seconds: list[float]) -> None:
        """Count ``len(seconds)`` calls of ``op`` that returned their model and record
        their times: :meth:`count` and :meth:`observe` for a batch's calls at once."""
        if op is Op.STEP:
            self.steps += len(seconds)
        elif op is Op.RESET or op is Op.AUTO_RESET:
            self.resets += len(seconds)
        name = str(op)
        histogram = self.latency.get(name)
        if histogram is None:
            histogram = self.latency[name] = Histogram()
        histogram.observe_many(seconds)

    def observe(self, op: str, seconds: float) -> None:
        """Record how long an environment call of ``op`` took."""
        histogram = self.latency.get(op)
        if histogram is None:
            histogram = self.latency[op] = Histogram()
        histogram.observe(seconds)

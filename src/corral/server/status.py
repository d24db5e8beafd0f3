"""``GET /status``: a read-only view of the live server, for the web UI's server panel.

It reads the server's own counters (:class:`~corral.server.stats.Stats`, the session
manager) and adds nothing to the request path. Sessions are listed with a shortened id:
enough to tell them apart, not enough to address one (an HTTP session's id alone lets
a caller drive it). A small history of samples (one per poll, at most one a second)
gives the sparklines: active sessions, step latency p50/p99 over each interval, errors.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter

from corral import __version__
from corral.protocol.identity import SEPARATOR
from corral.server.service import EnvService
from corral.server.stats import Histogram

MAX_SESSIONS_LISTED = 200
"""Sessions listed by ``/status`` (the most recently active first)."""

HISTORY = 300
"""Samples kept for the sparklines."""

MIN_SAMPLE_INTERVAL_S = 1.0


def percentile(bounds: tuple[float, ...], counts: list[int], q: float) -> float | None:
    """The ``q``-quantile (0..1) of bucketed counts: the upper bound of its bucket.

    Observations above the last bound count as the last bound. None when empty.
    """
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    running = 0
    for index, count in enumerate(counts):
        running += count
        if running >= rank and count:
            return bounds[min(index, len(bounds) - 1)]
    return bounds[-1]


@dataclass
class Sample:
    """The counters at one moment, and the step latency over the interval before it."""

    t: float
    active: int
    steps: int
    errors: int
    p50: float | None
    p99: float | None


class StatusView:
    """Builds ``/status`` bodies from one service's live state."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self.history: deque[Sample] = deque(maxlen=HISTORY)
        self._last_counts: list[int] | None = None
        self._connections: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        self._numbers = itertools.count(1)

    def sample(self, now: float) -> None:
        """Record a sample unless the last one is under a second old."""
        if self.history and now - self.history[-1].t < MIN_SAMPLE_INTERVAL_S:
            return
        stats = self.service.manager.stats
        step = stats.latency.get("step") or Histogram()
        counts = list(step.counts)
        previous = self._last_counts or [0] * len(counts)
        delta = [a - b for a, b in zip(counts, previous, strict=True)]
        self._last_counts = counts
        self.history.append(
            Sample(
                t=now,
                active=self.service.manager.active,
                steps=stats.steps,
                errors=sum(stats.errors.values()),
                p50=percentile(step.bounds, delta, 0.5),
                p99=percentile(step.bounds, delta, 0.99),
            )
        )

    def _connection(self, owner: object | None) -> int | None:
        if owner is None:
            return None
        number = self._connections.get(owner)
        if number is None:
            number = self._connections[owner] = next(self._numbers)
        return number

    def body(self) -> dict[str, Any]:
        """The ``/status`` reply."""
        service = self.service
        manager = service.manager
        stats = manager.stats
        now = time.monotonic()
        self.sample(time.time())
        live = sorted(manager.sessions.values(), key=lambda s: s.last_active, reverse=True)
        sessions = []
        for session in live[:MAX_SESSIONS_LISTED]:
            worker = getattr(session.runner, "worker", None)
            codec = getattr(session.owner, "codec", None)
            sessions.append(
                {
                    "id": _short(session.id),
                    "age_s": round(now - session.created, 3),
                    "idle_s": round(now - session.last_active, 3),
                    "episodes": session.machine.episodes,
                    "steps": session.machine.steps,
                    "phase": str(session.machine.phase),
                    "busy": session.machine.running is not None,
                    "connection": self._connection(session.owner),
                    "codec": getattr(codec, "name", None),
                    "worker": getattr(worker, "index", None),
                }
            )
        latency = {}
        for op, histogram in sorted(stats.latency.items()):
            latency[op] = {
                "count": histogram.observations,
                "mean_s": histogram.total / histogram.observations
                if histogram.observations
                else None,
                "p50_s": percentile(histogram.bounds, histogram.counts, 0.5),
                "p99_s": percentile(histogram.bounds, histogram.counts, 0.99),
            }
        return {
            "server": {
                "version": __version__,
                "instance": service.instance,
                "uptime_s": round(time.time() - service.started, 3),
                "workers": service.config.workers,
            },
            "workers": service.workers.report() if service.workers is not None else None,
            "env": {"name": service.contract.name, "fingerprint": service.fingerprint},
            "capacity": {
                "active": manager.active,
                "max": service.config.max_sessions,
                "ready": service.readiness()[0],
            },
            "connections": stats.connections,
            "counters": {
                "opened": stats.opened,
                "closed": stats.closed,
                "reaped": stats.reaped,
                "refused": manager.registry.refused,
                "resets": stats.resets,
                "steps": stats.steps,
            },
            "errors": dict(sorted(stats.errors.items())),
            "latency": latency,
            "sessions": sessions,
            "sessions_total": len(live),
            "history": [vars(s) for s in self.history],
        }


def status_router(service: EnvService) -> APIRouter:
    """``GET /status`` for ``service``."""
    view = StatusView(service)
    router = APIRouter()

    @router.get("/status", summary="Live sessions, capacity, counters and recent history")
    async def status() -> dict[str, Any]:
        """What the web UI's server view shows (read-only)."""
        return view.body()

    return router


def _short(session_id: str) -> str:
    """A session's id as the status page lists it: 8 characters of its random part
    (every id of this server begins with the server's id)."""
    parts = session_id.split(SEPARATOR)
    return (parts[1] if len(parts) == 3 else session_id)[:8]

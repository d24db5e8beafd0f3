"""``/metrics``: the server's counters in the Prometheus text format.

A custom collector reads :class:`~corral.server.stats.Stats` at scrape time, so the hot
path only bumps plain integers and nothing is counted twice.

The fleet's figures: ``corral_sessions_total{event="restored"}`` (sessions restored from
a snapshot; how long each took is ``corral_env_call_seconds{op="restore"}``),
``{event="elsewhere"}`` (requests refused ``SESSION_ELSEWHERE``: the session lives on
another server), ``corral_snapshots_total`` (taken; their time is
``corral_env_call_seconds{op="snapshot"}``), and the drain: ``corral_draining`` (1 while
draining), ``corral_drain_deadline_seconds`` (left), ``corral_drain_sessions`` by
``event``: ``at_start``, ``moved_away`` (gone before the deadline), ``lost`` (closed at
the deadline); ``corral_sessions_active`` is how many it still holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from corral.server.rewards import RewardCollector
from corral.server.service import EnvService


class ServiceCollector(Collector):
    """Exports one service's sessions, steps, latencies, errors and connections."""

    def __init__(self, service: EnvService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        """Build every metric family from the live counters."""
        manager = self.service.manager
        stats = manager.stats
        yield GaugeMetricFamily(
            "corral_sessions_active", "Sessions holding a slot now.", value=manager.active
        )
        yield GaugeMetricFamily(
            "corral_sessions_max", "Session capacity.", value=self.service.config.max_sessions
        )
        yield GaugeMetricFamily(
            "corral_connections_active", "Open WebSocket connections.", value=stats.connections
        )
        facts = self.service.facts
        if facts:
            info = GaugeMetricFamily(
                "corral_env_info",
                "The environment's preflight facts as labels (e.g. its sandbox mode).",
                labels=sorted(facts),
            )
            info.add_metric([facts[k] for k in sorted(facts)], 1)
            yield info
        sessions = CounterMetricFamily(
            "corral_sessions", "Session lifecycle events.", labels=["event"]
        )
        for event, value in (
            ("opened", stats.opened),
            ("closed", stats.closed),
            ("reaped", stats.reaped),
            ("refused", manager.registry.refused),
            ("restored", stats.restores),
            ("elsewhere", manager.registry.elsewhere),
        ):
            sessions.add_metric([event], value)
        yield sessions
        yield CounterMetricFamily(
            "corral_snapshots", "Session snapshots taken.", value=stats.snapshots
        )
        yield from _drain_metrics(self.service)
        calls = CounterMetricFamily("corral_env_calls", "Environment calls.", labels=["op"])
        calls.add_metric(["step"], stats.steps)
        calls.add_metric(["reset"], stats.resets)
        yield calls
        errors = CounterMetricFamily("corral_errors", "Error replies by code.", labels=["code"])
        for code, value in sorted(stats.errors.items()):
            errors.add_metric([code], value)
        yield errors
        latency = HistogramMetricFamily(
            "corral_env_call_seconds", "Environment call latency.", labels=["op"]
        )
        for op, histogram in sorted(stats.latency.items()):
            latency.add_metric([op], histogram.cumulative(), sum_value=histogram.total)
        yield latency
        workers = self.service.workers
        if workers is not None:
            yield from _worker_metrics(workers.report())


def _drain_metrics(service: EnvService) -> Iterator[Metric]:
    """The drain: whether it runs, the time left, and its sessions' fates."""
    drain = service.draining
    held = service.manager.active
    yield GaugeMetricFamily(
        "corral_draining", "1 while the server drains.", value=int(drain.draining)
    )
    yield GaugeMetricFamily(
        "corral_drain_deadline_seconds",
        "Seconds left until the drain closes what is left (0 when not draining).",
        value=drain.remaining(time.monotonic()),
    )
    figures = drain.figures(held)
    sessions = CounterMetricFamily(
        "corral_drain_sessions",
        "Sessions of the drain: held at its start, moved away before the deadline, "
        "lost at the deadline.",
        labels=["event"],
    )
    sessions.add_metric(["at_start"], figures.at_start)
    sessions.add_metric(["moved_away"], figures.moved_away)
    sessions.add_metric(["lost"], figures.lost)
    yield sessions


def _worker_metrics(report: dict[str, Any]) -> Iterator[Metric]:
    """The worker processes (``--workers``): how many run and are down, the capacity
    they hold, restarts and failed starts (each retried with back-off)."""
    slots = GaugeMetricFamily("corral_workers", "Worker process slots by state.", labels=["state"])
    slots.add_metric(["alive"], report["alive"])
    slots.add_metric(["down"], len(report["down"]))
    yield slots
    yield GaugeMetricFamily(
        "corral_sessions_capacity",
        "Sessions the live worker processes hold (max_sessions while none is down).",
        value=report["capacity"],
    )
    yield CounterMetricFamily(
        "corral_worker_restarts", "Worker processes restarted.", value=report["restarts"]
    )
    yield CounterMetricFamily(
        "corral_worker_start_failures",
        "Worker processes that failed to start (each retried with back-off).",
        value=report["start_failures"],
    )


def metrics_router(service: EnvService) -> APIRouter:
    """The ``/metrics`` route for ``service``, on a registry of its own."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(ServiceCollector(service))
    registry.register(RewardCollector(service.rewards))
    router = APIRouter()

    # Declared as text, not the JSON FastAPI assumes, so the OpenAPI document is true.
    @router.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        """Prometheus text exposition of the server's counters."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router

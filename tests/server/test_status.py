"""``/status``: the server view's read-only numbers, from the server's own counters."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.envs.echo import EchoEnv
from corral.errors import EpisodeEnded
from corral.server.stats import LATENCY_BUCKETS, Histogram
from corral.server.status import StatusView, percentile


def test_percentile_of_buckets():
    bounds = (0.001, 0.01, 0.1)
    assert percentile(bounds, [0, 0, 0, 0], 0.5) is None
    assert percentile(bounds, [10, 0, 0, 0], 0.99) == 0.001
    assert percentile(bounds, [50, 49, 1, 0], 0.5) == 0.001
    assert percentile(bounds, [50, 49, 1, 0], 0.99) == 0.01
    assert percentile(bounds, [50, 49, 0, 1], 0.999) == 0.1  # past the last bound: the last
    histogram = Histogram()
    for seconds in (0.0002, 0.0002, 0.02):
        histogram.observe(seconds)
    assert percentile(LATENCY_BUCKETS, histogram.counts, 0.5) == 0.00025
    assert percentile(LATENCY_BUCKETS, histogram.counts, 0.99) == 0.025


async def test_sessions_counters_and_history():
    with running(EchoEnv, web=True, max_sessions=7) as srv:
        async with (
            AsyncEnvClient(srv.url, env=EchoEnv) as one,
            AsyncEnvClient(srv.url, env=EchoEnv, codec="json") as two,
            httpx.AsyncClient(base_url=srv.url) as http,
        ):
            await one.reset(seed=1)
            for _ in range(3):
                await one.step({"message": "hi"})
            await two.reset()
            await two.step({"message": "bye"})
            with pytest.raises(EpisodeEnded):
                await two.step({"message": "after the end"})
            body = (await http.get("/status")).json()
            assert body["capacity"] == {"active": 2, "max": 7, "ready": True}
            assert body["connections"] == 2
            assert body["counters"]["steps"] == 4 and body["counters"]["resets"] == 2
            assert body["env"]["name"] == "echo"
            assert body["latency"]["step"]["count"] == 4
            assert body["latency"]["step"]["p50_s"] is not None
            sessions = {s["id"]: s for s in body["sessions"]}
            assert len(sessions) == 2 and body["sessions_total"] == 2
            mine = sessions[label(one.session_id)]
            assert len(mine["id"]) == 8  # never enough to address the session
            assert mine["steps"] == 3 and mine["episodes"] == 1 and mine["phase"] == "ready"
            assert mine["codec"] == "msgpack" and mine["worker"] is None
            assert sessions[label(two.session_id)]["codec"] == "json"
            assert sessions[label(two.session_id)]["phase"] == "ended"
            assert {s["connection"] for s in sessions.values()} == {1, 2}
            assert len(body["history"]) == 1
            assert body["history"][0]["active"] == 2 and body["history"][0]["steps"] == 4
            assert body["history"][0]["p50"] is not None
            assert body["errors"] == {"EPISODE_ENDED": 1}


def label(session_id: str) -> str:
    """How the status page lists a session: 8 characters of its id's random part."""
    return session_id.split("~")[1][:8]


def test_history_samples_at_most_once_a_second_and_is_bounded():
    stats = SimpleNamespace(steps=0, errors={}, latency={})
    service = SimpleNamespace(manager=SimpleNamespace(active=1, sessions={}, stats=stats))
    view = StatusView(service)  # type: ignore[arg-type]
    view.sample(100.0)
    view.sample(100.5)
    assert len(view.history) == 1
    for t in range(1000):
        view.sample(200.0 + t)
    assert len(view.history) == view.history.maxlen

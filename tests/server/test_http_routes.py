"""The plain HTTP routes, against a real server."""

from __future__ import annotations

import httpx
import pytest
from tests.support.envs import CountAction, CounterEnv, CountState
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.errors import EnvError, InvalidArgument


async def test_health_ready_schema_metadata_metrics():
    with running(CounterEnv, max_sessions=3) as srv, httpx.Client(base_url=srv.url) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        ready = http.get("/ready").json()
        assert ready["ready"] is True and ready["max_sessions"] == 3
        schema = http.get("/schema").json()
        assert schema["state"] == CountState.model_json_schema()  # the real State
        assert "history" in schema["state"]["properties"]
        assert schema["fingerprint"] == srv.service.fingerprint
        meta = http.get("/metadata").json()
        assert meta["name"] == "counter" and meta["version"] == "1.0.0"
        assert set(meta) >= {"name", "description", "readme_content", "version", "author"}
        assert http.get("/openapi.json").json()["info"]["version"].startswith("1.")

        async with AsyncEnvClient(srv.url, env=CounterEnv) as env:
            await env.reset(limit=100)
            for _ in range(3):
                await env.step(CountAction())
            with pytest.raises(EnvError):
                await env.step(CountAction(fail=True))
            text = http.get("/metrics").text
            assert "corral_sessions_active 1.0" in text
            assert "corral_connections_active 1.0" in text
            assert 'corral_env_calls_total{op="step"} 3.0' in text
            assert 'corral_env_call_seconds_count{op="step"} 3.0' in text
            assert 'corral_env_call_seconds_bucket{le="+Inf",op="step"} 3.0' in text
        text = http.get("/metrics").text
        assert 'corral_sessions_total{event="opened"} 1.0' in text
        assert 'corral_errors_total{code="ENV_ERROR"} 1.0' in text


async def test_schema_publishes_the_reset_options_and_the_server_checks_them():
    with running(CounterEnv) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            schema = (await http.get("/schema")).json()
        assert schema["reset_options"] == CounterEnv.contract().schemas["reset_options"]
        assert set(schema["reset_options"]["properties"]) == {"limit", "label"}
        assert schema["fingerprint"] == CounterEnv.contract().fingerprint
        async with AsyncEnvClient(srv.url, env=CounterEnv) as client:
            assert client.server_info["compat"] == "exact"
            with pytest.raises(InvalidArgument, match="limit"):
                await client.reset(limit="lots")
            assert (await client.reset(limit=3)).observation.total == 0

"""Bearer-token auth: every HTTP route and the WebSocket handshake, missing/wrong/right."""

from __future__ import annotations

import httpx
import pytest
from tests.support.envs import CountAction, CounterEnv
from tests.support.servers import running
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from corral.auth import bearer_header, bearer_matches, check_token, read_token_file, resolve_token
from corral.client import AsyncEnvClient
from corral.client.connection import ws_url
from corral.errors import Unauthorized
from corral.server import ServerConfig
from corral.server.serve import exposure_warning

TOKEN = "s3cret-token-for-tests"
ROUTES = ["/health", "/ready", "/schema", "/metadata", "/openapi.json", "/docs"]


@pytest.fixture(scope="module")
def server():
    with running(CounterEnv, token=TOKEN) as srv:
        yield srv


@pytest.mark.parametrize("route", ROUTES)
def test_http_routes_need_the_token(server, route):
    missing = httpx.get(server.url + route)
    assert missing.status_code == 401
    assert missing.json()["code"] == "UNAUTHORIZED"
    assert "requires a bearer token" in missing.json()["message"]
    assert missing.headers["www-authenticate"] == 'Bearer realm="corral"'
    wrong = httpx.get(server.url + route, headers=bearer_header("wrong-token-123"))
    assert wrong.status_code == 401 and "wrong bearer token" in wrong.json()["message"]
    basic = httpx.get(server.url + route, headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    right = httpx.get(server.url + route, headers=bearer_header(TOKEN))
    assert right.status_code == 200


@pytest.mark.parametrize(
    "headers", [{}, bearer_header("wrong-token-123")], ids=["missing", "wrong"]
)
async def test_websocket_refused_at_the_handshake(server, headers):
    with pytest.raises(InvalidStatus) as refused:
        await connect(
            ws_url(server.url), subprotocols=["corral.v1.msgpack"], additional_headers=headers
        )
    assert refused.value.response.status_code == 401
    assert server.manager.active == 0


async def test_client_with_missing_wrong_and_right_token(server, monkeypatch):
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    monkeypatch.delenv("CORRAL_TOKEN_FILE", raising=False)
    with pytest.raises(Unauthorized, match="requires a bearer token"):
        await AsyncEnvClient(server.url, env=CounterEnv).connect()
    with pytest.raises(Unauthorized, match="wrong bearer token"):
        await AsyncEnvClient(server.url, env=CounterEnv, token="wrong-token-123").connect()
    async with AsyncEnvClient(server.url, env=CounterEnv, token=TOKEN) as client:
        await client.reset()
        assert (await client.step(CountAction(amount=2))).observation.total == 2
        assert "token" not in client.server_info["limits"]  # never echoed to clients
    monkeypatch.setenv("CORRAL_TOKEN", TOKEN)
    async with AsyncEnvClient(server.url, env=CounterEnv) as client:
        await client.reset()


async def test_client_token_from_a_file(server, monkeypatch, tmp_path):
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    monkeypatch.setenv("CORRAL_TOKEN_FILE", str(path))
    async with AsyncEnvClient(server.url, env=CounterEnv) as client:
        await client.reset()


def test_token_helpers(tmp_path, monkeypatch):
    assert bearer_matches(f"Bearer {TOKEN}", TOKEN)
    assert bearer_matches(f"bearer   {TOKEN} ", TOKEN)
    assert not bearer_matches(None, TOKEN)
    assert not bearer_matches(f"Bearer {TOKEN}x", TOKEN)
    assert not bearer_matches("Bearer ünïcode", TOKEN)
    with pytest.raises(ValueError, match="at least 8"):
        check_token("short", "test")
    with pytest.raises(ValueError, match="whitespace"):
        check_token("has a space in it", "test")
    with pytest.raises(ValueError, match="cannot read the token file"):
        read_token_file(tmp_path / "missing")
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    monkeypatch.delenv("CORRAL_TOKEN_FILE", raising=False)
    assert resolve_token() is None
    with pytest.raises(ValueError, match=r"ServerConfig\.token"):
        ServerConfig(token="tiny")
    assert TOKEN not in repr(ServerConfig(token=TOKEN))


def test_binding_beyond_loopback_without_auth_warns():
    assert exposure_warning("127.0.0.1", None) is None
    assert exposure_warning("::1", None) is None
    warning = exposure_warning("0.0.0.0", None)
    assert warning is not None and "without authentication" in warning
    assert "--token-file" in warning
    assert exposure_warning("0.0.0.0", TOKEN) is None


def test_the_probe_paths_answer_without_the_token_and_say_nothing_else(server):
    """Kubelet httpGet probes cannot send a token (issue 30.17): /livez and /readyz give
    the status of /health and /ready and an empty body, nothing a stranger can use."""
    for path, twin in (("/livez", "/health"), ("/readyz", "/ready")):
        probe = httpx.get(server.url + path)
        assert probe.status_code == 200 and probe.content == b""
        authorised = httpx.get(server.url + twin, headers=bearer_header(TOKEN))
        assert authorised.status_code == probe.status_code
        assert httpx.get(server.url + twin).status_code == 401
    # Only those two paths are public, and only as GET routes.
    assert httpx.post(server.url + "/readyz").status_code == 405
    assert httpx.get(server.url + "/readyz/x").status_code == 401


def test_readyz_follows_ready_when_the_server_is_full():
    with running(CounterEnv, token=TOKEN, max_sessions=1) as srv:
        opened = httpx.post(srv.url + "/sessions", headers=bearer_header(TOKEN), json={})
        assert opened.status_code == 201, opened.text
        assert httpx.get(srv.url + "/readyz").status_code == 503
        full = httpx.get(srv.url + "/ready", headers=bearer_header(TOKEN))
        assert full.status_code == 503

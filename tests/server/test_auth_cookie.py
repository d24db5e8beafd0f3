"""The browser's token exchange: ``POST /auth`` gives a short-lived cookie that every
route and the WebSocket accept from this origin only, and only with the web UI on."""

from __future__ import annotations

import json

import httpx
import pytest
from tests.support.servers import running
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from corral.auth import COOKIE_NAME, bearer_header, cookie_matches, issue_cookie
from corral.client.connection import ws_url
from corral.envs.echo import EchoEnv
from corral.protocol.access import AccessPolicy, RequestHead, check_credentials

TOKEN = "cookie-test-token-123"


@pytest.fixture(scope="module")
def server():
    with running(EchoEnv, token=TOKEN, web=True) as srv:
        yield srv


def test_cookie_values():
    value = issue_cookie(TOKEN, now=1000.0, ttl=60)
    assert cookie_matches(value, TOKEN, now=1059.0)
    assert not cookie_matches(value, TOKEN, now=1061.0)  # expired
    assert not cookie_matches(value, "another-token-456", now=1000.0)
    assert TOKEN not in value
    version, expires, nonce, mac = value.split(".")
    assert (version, expires) == ("v1", "1060")
    forged = f"{version}.{int(expires) + 10**6}.{nonce}.{mac}"
    assert not cookie_matches(forged, TOKEN, now=1000.0)
    for junk in ("", "v1", "v1.x.y.z", "v2.1060.aa.bb", "...."):
        assert not cookie_matches(junk, TOKEN, now=1000.0)
    assert issue_cookie(TOKEN, now=1000.0) != issue_cookie(TOKEN, now=1000.0)


def authorised(headers: list[tuple[bytes, bytes]], token: str, cookies: bool = False) -> bool:
    head = RequestHead.of("GET", "/ws", headers, websocket=True)
    return check_credentials(head, AccessPolicy(token, cookies)) is None


def test_authorised_needs_the_same_origin_for_cookies():
    cookie = (b"cookie", f"a=b; {COOKIE_NAME}={issue_cookie(TOKEN)}".encode())
    host = (b"host", b"127.0.0.1:8000")
    assert authorised([cookie, host], TOKEN, cookies=True)
    assert authorised([cookie, host, (b"origin", b"http://127.0.0.1:8000")], TOKEN, cookies=True)
    assert not authorised([cookie, host, (b"origin", b"http://evil.test")], TOKEN, cookies=True)
    assert not authorised([cookie, host], TOKEN, cookies=False)
    assert authorised([(b"Authorization", f"Bearer {TOKEN}".encode())], TOKEN)


async def test_exchange_then_every_route_and_the_websocket(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        # The UI's files load without a token: they hold no data.
        assert (await http.get("/web/")).status_code == 200
        assert (await http.get("/")).status_code == 307
        for private in ("/status", "/schema", "/render", "/docs"):
            assert (await http.get(private)).status_code == 401, private
        assert (await http.post("/auth")).status_code == 401
        wrong = await http.post("/auth", headers=bearer_header("wrong-token-000"))
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        right = await http.post("/auth", headers=bearer_header(TOKEN))
        assert right.status_code == 204
        cookie = right.headers["set-cookie"]
        for attribute in ("HttpOnly", "SameSite=strict", "Path=/", "Max-Age=3600"):
            assert attribute.lower() in cookie.lower(), attribute
        assert "secure" not in cookie.lower()  # plain http on loopback
        value = http.cookies[COOKIE_NAME]
        for private in ("/status", "/schema", "/render", "/metadata"):
            assert (await http.get(private)).status_code == 200, private
        # A cookie cannot renew itself: the exchange wants the token.
        assert (await http.post("/auth")).status_code == 401
        # From another origin the cookie is refused.
        foreign = await http.get("/status", headers={"Origin": "http://evil.test"})
        assert foreign.status_code == 401

    headers = {"Cookie": f"{COOKIE_NAME}={value}"}
    async with connect(
        ws_url(server.url), subprotocols=["corral.v1.json"], additional_headers=headers
    ) as ws:
        await ws.send(json.dumps({"type": "hello", "id": 1, "protocol": "corral/1"}))
        assert json.loads(await ws.recv())["type"] == "welcome"
    with pytest.raises(InvalidStatus) as refused:
        await connect(
            ws_url(server.url),
            subprotocols=["corral.v1.json"],
            additional_headers={**headers, "Origin": "http://evil.test"},
        )
    # A page elsewhere cannot even try: its origin is refused before any credential.
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body)["code"] == "FORBIDDEN"

    async with httpx.AsyncClient(base_url=server.url, cookies={COOKIE_NAME: value}) as http:
        forgot = await http.delete("/auth")
        assert forgot.status_code == 204
        assert (
            "Max-Age=0" in forgot.headers["set-cookie"]
            or "expires" in forgot.headers["set-cookie"].lower()
        )


async def test_https_behind_a_proxy_gets_a_secure_cookie(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        reply = await http.post(
            "/auth", headers={**bearer_header(TOKEN), "X-Forwarded-Proto": "https"}
        )
        assert "secure" in reply.headers["set-cookie"].lower()


async def test_cookies_are_not_accepted_without_the_web_ui():
    with running(EchoEnv, token=TOKEN) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            http.cookies.set(COOKIE_NAME, issue_cookie(TOKEN))
            assert (await http.get("/schema")).status_code == 401
            assert (await http.post("/auth", headers=bearer_header(TOKEN))).status_code == 404

"""The edge's rules through real servers on 127.0.0.1 (issue 30.6, 30.10, 30.11, 30.13):
browser origins, DNS rebinding, body types, duplicate credentials, and every HTTP error
structured and bounded — on the WebSocket upgrade of both transports and every route."""

from __future__ import annotations

import socket

import httpx
import orjson
import pytest
from tests.support.rawws import RawSocket
from tests.support.servers import ThreadServer, port_of, running

from corral.envs.wordle import WordleEnv
from corral.errors import ErrorCode

TOKEN = "edge-token-12345"
TRANSPORTS = ["native", "asgi"]
CODES = {str(code) for code in ErrorCode}


@pytest.fixture(scope="module", params=TRANSPORTS)
def server(request):
    with running(
        WordleEnv,
        transport=request.param,
        allowed_origins=("https://ui.example",),
        allowed_hosts=("envs.example",),
    ) as srv:
        yield srv


def upgrade(srv: ThreadServer, **headers: str) -> tuple[int, dict]:
    status, _, body = RawSocket(port_of(srv.url)).upgrade(headers=headers)
    return status, (orjson.loads(body) if body else {})


def own_origin(srv: ThreadServer) -> str:
    return srv.url  # http://127.0.0.1:<port>


def test_a_page_of_another_origin_cannot_open_a_websocket(server):
    for origin in ("http://evil.example", "http://127.0.0.1:1", "null"):
        status, body = upgrade(server, Origin=origin)
        assert status == 403 and body["code"] == "FORBIDDEN", (origin, body)
        assert body["details"]["reason"] == "origin"
    assert (
        upgrade(server, Origin=own_origin(server), Host=f"127.0.0.1:{port_of(server.url)}")[0]
        == 101
    )
    assert upgrade(server, Origin="https://ui.example")[0] == 101  # allowed_origins
    assert upgrade(server)[0] == 101  # no Origin: not a browser


def test_state_changing_routes_refuse_other_origins_and_non_json_bodies(server):
    evil = {"Origin": "http://evil.example"}
    counted = server.manager.stats.errors.get("FORBIDDEN", 0)
    with httpx.Client(base_url=server.url, timeout=20) as http:
        for method, path, body in (
            ("POST", "/reset", {}),
            ("POST", "/step", {"action": {"guess": "crane"}}),
            ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
            ("POST", "/sessions", None),
            ("POST", "/wordle/num_tasks", {"split": "test"}),
            ("DELETE", "/sessions/x", None),
        ):
            refused = http.request(method, path, json=body, headers=evil)
            assert refused.status_code == 403, (method, path)
            assert refused.json()["code"] == "FORBIDDEN"
        # What a page can post without a CORS preflight is never read.
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            rpc = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'
            refused = http.post("/mcp", content=rpc, headers={"Content-Type": kind})
            assert refused.status_code == 415 and refused.json()["code"] == "BAD_FRAME", kind
        # Reading is allowed from anywhere (a page cannot read the answer), and so is
        # everything from the server's own page or a listed one.
        assert http.get("/schema", headers=evil).status_code == 200
        mine = {"Origin": own_origin(server)}
        assert http.post("/reset", json={}, headers=mine).status_code == 200
        assert (
            http.post("/reset", json={}, headers={"Origin": "https://ui.example"}).status_code
            == 200
        )
        assert server.manager.stats.errors.get("FORBIDDEN", 0) == counted + 6  # in /metrics


def test_a_loopback_server_refuses_names_someone_else_can_point_here(server):
    port = port_of(server.url)
    with httpx.Client(base_url=server.url, timeout=20) as http:
        rebound = http.get("/schema", headers={"Host": f"evil.example:{port}"})
        assert rebound.status_code == 403 and rebound.json()["details"]["reason"] == "host"
        # Same-origin as far as the browser knows: Origin and Host agree, still refused.
        same = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        assert http.post("/reset", json={}, headers=same).status_code == 403
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "envs.example"):
            assert http.get("/health", headers={"Host": host}).status_code == 200, host
    status, body = upgrade(server, Host=f"evil.example:{port}")
    assert status == 403 and body["details"]["reason"] == "host"


def raw_request(port: int, head: str) -> tuple[int, dict]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head.encode())
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                top, _, rest = data.partition(b"\r\n\r\n")
                length = [
                    int(line.split(b":")[1])
                    for line in top.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                if length and len(rest) >= length[0]:
                    break
    status = int(data.split(b" ", 2)[1])
    return status, orjson.loads(data.partition(b"\r\n\r\n")[2] or b"{}")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_two_authorization_headers_are_refused_whichever_comes_last(transport):
    with running(WordleEnv, transport=transport, token=TOKEN) as srv:
        port = port_of(srv.url)
        right, wrong = f"Authorization: Bearer {TOKEN}", "Authorization: Bearer wrong-token-00"
        for first, last in ((wrong, right), (right, wrong), (right, right)):
            status, body = raw_request(
                port, f"GET /schema HTTP/1.1\r\nHost: 127.0.0.1\r\n{first}\r\n{last}\r\n\r\n"
            )
            assert status == 401 and body["code"] == "UNAUTHORIZED", (first, last)
            assert "more than one" in body["message"]
            raw = RawSocket(port)
            key = "dGhlIHNhbXBsZSBub25jZQ=="
            raw.sock.sendall(
                (
                    "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                    f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                    "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: corral.v1.msgpack\r\n"
                    f"{first}\r\n{last}\r\n\r\n"
                ).encode()
            )
            status, _, body = raw.read_response()
            raw.close()
            assert status == 401 and orjson.loads(body)["code"] == "UNAUTHORIZED"
        assert (
            raw_request(port, f"GET /schema HTTP/1.1\r\nHost: 127.0.0.1\r\n{right}\r\n\r\n")[0]
            == 200
        )


def test_every_http_error_is_structured_json(server):
    with httpx.Client(base_url=server.url, timeout=20) as http:
        answers = [
            # A body that is not JSON, and not UTF-8 either: 415, never a 500.
            http.post(
                "/reset",
                content=b"\x81\xa4seed\xff",
                headers={"Content-Type": "application/msgpack"},
            ),
            # Declared JSON but not UTF-8: 400.
            http.post(
                "/reset", content=b"\x81\xa4seed\xff", headers={"Content-Type": "application/json"}
            ),
            # Bytes that fail the route's model (its input echoed as a bounded repr).
            http.post("/wordle/task", json={"split": "test", "index": "x" * 100_000}),
            http.post("/wordle/task", json={"split": ["x"] * 10_000, "index": 1}),
            http.get("/no/such/route"),
            http.put("/reset", json={}),
            http.post(
                "/step",
                json={"action": {"guess": "crane"}},
                headers={"X-Corral-Session": "s" * 100_000},
            ),
        ]
    for answer in answers:
        assert answer.headers["content-type"].startswith("application/json"), answer
        body = answer.json()
        assert body["code"] in CODES and isinstance(body["details"], dict), body
        assert {"detail", "message"} <= body.keys()
        assert len(answer.content) < 16 * 1024, (answer.request.url, len(answer.content))
    assert [a.status_code for a in answers] == [415, 400, 422, 422, 404, 405, 404]
    assert answers[4].json()["code"] == "UNKNOWN_TYPE"


def test_the_task_routes_echo_a_long_name_cut():
    with running(WordleEnv) as srv, httpx.Client(base_url=srv.url, timeout=20) as http:
        name = "x" * 100_000
        for path, body in (
            ("/wordle/tasks", {"split": name}),
            ("/wordle/task", {"split": name, "index": 0}),
        ):
            answer = http.post(path, json=body)
            assert answer.status_code == 404 and answer.json()["code"] == "INVALID_ARGUMENT"
            assert len(answer.content) < 8 * 1024  # was 300 KB: the name three times
        unknown = http.get(f"/{name[:50_000]}/splits")
        assert unknown.status_code == 404 and len(unknown.content) < 8 * 1024


def test_an_unexpected_exception_is_an_internal_error_without_its_insides():
    srv = ThreadServer(WordleEnv)

    async def boom() -> None:
        raise RuntimeError("secret /etc/path in the traceback")

    srv.app.add_api_route("/boom", boom)
    srv.start()
    try:
        answer = httpx.get(srv.url + "/boom", timeout=20)
    finally:
        srv.stop()
    assert answer.status_code == 500 and answer.json()["code"] == "INTERNAL_ERROR"
    assert "secret" not in answer.text and answer.json()["details"] == {"exception": "RuntimeError"}


def test_openenv_routes_answer_a_bad_body_as_openenv_does_bounded():
    """OpenEnv's clients read its 422 body, FastAPI's ``{"detail": [...]}`` alone; corral
    keeps that shape on those routes, and still cuts what the items echo."""
    with running(WordleEnv) as srv, httpx.Client(base_url=srv.url, timeout=20) as http:
        seed = http.post("/reset", json={"seed": -1})
        huge = http.post("/step", json={"actions": "x" * 100_000})
        task = http.post("/wordle/task", json={"split": "test", "index": "x"})
    assert seed.status_code == 422 and seed.json() == {
        "detail": [
            {
                "type": "greater_than_equal",
                "loc": ["body", "seed"],
                "msg": "Input should be greater than or equal to 0",
                "input": -1,
                "ctx": {"ge": 0},
            }
        ]
    }
    assert huge.status_code == 422 and huge.json().keys() == {"detail"}
    assert len(huge.content) < 8 * 1024
    # corral's own routes keep corral's error body.
    assert task.status_code == 422 and task.json()["code"] == "BAD_MESSAGE"

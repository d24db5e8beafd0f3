"""HTTP body limits on every route, through a real server: 413, 408 and strict JSON 400s."""

from __future__ import annotations

import socket

import httpx
import pytest
from tests.support.rawws import RawSocket
from tests.support.servers import port_of, running

from corral.envs.echo import EchoEnv

LIMIT = 64 * 1024


@pytest.fixture(scope="module", params=["native", "asgi"])
def server(request):
    with running(
        EchoEnv, transport=request.param, max_frame_bytes=LIMIT, http_body_timeout_s=1.0
    ) as srv:
        yield srv


@pytest.mark.parametrize("path", ["/step", "/reset", "/mcp", "/sessions"])
def test_declared_oversized_body_is_413_before_it_is_read(server, path):
    raw = RawSocket(port_of(server.url))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {100 * 1024 * 1024}\r\n\r\n"
    )
    raw.sock.sendall(head.encode() + b"{")  # 100 MiB announced, one byte sent
    status, _, body = raw.read_response()
    assert status == 413 and b"FRAME_TOO_LARGE" in body
    raw.close()


@pytest.mark.parametrize("path", ["/step", "/reset", "/mcp"])
def test_chunked_oversized_body_is_413_while_streaming(server, path):
    raw = RawSocket(port_of(server.url))
    raw.sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
    )
    chunk = b"a" * 16384
    status = None
    try:
        for _ in range(64):  # 1 MiB, far past the limit; the server answers before the end
            raw.sock.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk))
    except OSError:
        pass  # closed after answering
    status, _, body = raw.read_response()
    assert status == 413 and b"FRAME_TOO_LARGE" in body
    raw.close()


@pytest.mark.parametrize(
    "body",
    [b'{"seed": NaN}', b'{"seed": 1e400}', b'{"seed": \xff\xfe}', b'{"seed": Infinity}'],
)
def test_non_strict_json_is_a_structured_400(server, body):
    reply = httpx.post(
        server.url + "/reset", content=body, headers={"content-type": "application/json"}
    )
    assert reply.status_code == 400
    assert reply.json()["code"] == "BAD_FRAME"


def test_step_with_bad_json_is_400_and_good_json_still_works(server):
    bad = httpx.post(
        server.url + "/step",
        content=b'{"action": {"message": NaN}}',
        headers={"content-type": "application/json"},
    )
    assert bad.status_code == 400 and bad.json()["code"] == "BAD_FRAME"
    good = httpx.post(server.url + "/step", json={"action": {"message": "hi"}})
    assert good.status_code == 200


def test_a_slow_body_gets_408(server):
    sock = socket.create_connection(("127.0.0.1", port_of(server.url)))
    sock.sendall(
        b"POST /step HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{"
    )
    sock.settimeout(30)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 408")
    sock.close()


def test_a_body_within_the_limit_passes(server):
    reply = httpx.post(server.url + "/step", json={"action": {"message": "x" * 30_000}})
    assert reply.status_code == 200


def test_http_sessions_count_in_the_per_client_limit():
    with running(EchoEnv, max_connections_per_client=3, max_sessions=64) as srv:
        opened = [httpx.post(srv.url + "/sessions") for _ in range(3)]
        assert [r.status_code for r in opened] == [201, 201, 201]
        refused = httpx.post(srv.url + "/sessions")
        assert refused.status_code == 429 and refused.json()["code"] == "TOO_MANY_CONNECTIONS"
        assert refused.headers["retry-after"] == "1"
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
        assert "error" in httpx.post(srv.url + "/mcp", json=rpc).json()
        sid = opened[0].json()["session_id"]
        assert httpx.delete(f"{srv.url}/sessions/{sid}").status_code == 200
        assert httpx.post(srv.url + "/sessions").status_code == 201
        assert srv.service.manager.active == 3

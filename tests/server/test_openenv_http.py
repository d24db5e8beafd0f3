"""OpenEnv's HTTP routes and corral's HTTP sessions, through real sockets."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from tests.support.envs import CounterEnv
from tests.support.servers import running, wait_until

from corral.contract.tools import tool
from corral.envs.echo import EchoEnv
from corral.server.openenv import SESSION_HEADER

JSON = {"content-type": "application/json"}


async def test_stateless_reset_step_state_like_openenv():
    with running(EchoEnv) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            reply = await http.post("/reset")  # no body at all is fine
            assert reply.status_code == 200
            assert reply.json() == {
                "observation": {"echoed_message": "ready", "message_length": 0},
                "reward": None,
                "done": False,
                "metadata": {"seed": None},
                "truncated": False,
            }
            reply = await http.post("/reset", json={"seed": 4, "episode_id": "e"})
            assert reply.json()["metadata"] == {"seed": 4}
            reply = await http.post("/step", json={"action": {"message": "hey"}, "timeout_s": 5})
            assert reply.status_code == 200
            body = reply.json()
            assert body["observation"] == {"echoed_message": "hey", "message_length": 3}
            assert body["reward"] == pytest.approx(0.3)
            state = (await http.get("/state")).json()
            assert state == {"episode_id": None, "step_count": 0, "total_length": 0}
        assert wait_until(lambda: srv.manager.active == 0)
        assert srv.manager.stats.opened == 4 and srv.manager.stats.closed == 4


@pytest.mark.parametrize(
    ("env", "path", "body", "status", "code"),
    [
        (EchoEnv, "/step", {"action": {"message": ""}}, 422, "INVALID_ACTION"),
        (EchoEnv, "/step", {"action": {"message": "a", "extra": 1}}, 422, "INVALID_ACTION"),
        (CounterEnv, "/reset", {"unknown_option": 1}, 422, "INVALID_ARGUMENT"),
    ],
)
async def test_invalid_input_is_422_with_the_errors(env, path, body, status, code):
    with running(env) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            reply = await http.post(path, json=body)
        assert reply.status_code == status
        payload = reply.json()
        assert payload["code"] == code
        assert payload["message"]
    if code == "INVALID_ACTION":
        assert isinstance(payload["detail"], list) and payload["detail"][0]["loc"]


async def test_request_body_validation():
    with running(CounterEnv) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            for path, body in (
                ("/step", {}),
                ("/step", {"action": {}, "surprise": 1}),
                ("/step", {"action": {}, "timeout_s": 0}),
                ("/reset", {"seed": -1}),
                ("/reset", {"episode_id": "x" * 300}),
            ):
                reply = await http.post(path, json=body)
                assert reply.status_code == 422, (path, body, reply.text)
            reply = await http.post("/step", json={"action": {"fail": True}})
            assert reply.status_code == 500 and reply.json()["code"] == "ENV_ERROR"
            assert "failed on purpose" in reply.json()["detail"]


async def test_http_sessions_run_whole_episodes():
    with running(CounterEnv) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            opened = await http.post("/sessions")
            assert opened.status_code == 201
            sid = opened.json()["session_id"]
            head = {SESSION_HEADER: sid}
            reply = await http.post("/step", json={"action": {"amount": 1}}, headers=head)
            assert reply.status_code == 409 and reply.json()["code"] == "RESET_REQUIRED"
            reply = await http.post("/reset", json={"limit": 3, "seed": 9}, headers=head)
            assert reply.status_code == 200 and reply.json()["metadata"] == {"seed": 9}
            for amount in (1, 1):
                reply = await http.post("/step", json={"action": {"amount": amount}}, headers=head)
                assert reply.json()["done"] is False
            reply = await http.post("/step", json={"action": {"amount": 1}}, headers=head)
            assert reply.json()["done"] is True
            reply = await http.post("/step", json={"action": {"amount": 1}}, headers=head)
            assert reply.status_code == 409 and reply.json()["code"] == "EPISODE_ENDED"
            state = (await http.get("/state", headers=head)).json()
            assert state["total"] == 3 and state["history"] == [1, 1, 1]
            assert srv.manager.active == 1
            closed = await http.delete(f"/sessions/{sid}")
            assert closed.json() == {"session_id": sid, "closed": True}
            assert srv.manager.active == 0
            gone = await http.get("/state", headers=head)
            assert gone.status_code == 410 and gone.json()["code"] == "SESSION_LOST"
            unknown = await http.get("/state", headers={SESSION_HEADER: "nope"})
            assert unknown.status_code == 404 and unknown.json()["code"] == "UNKNOWN_SESSION"
            assert "POST /sessions" in unknown.json()["message"]
            assert (await http.delete("/sessions/nope")).status_code == 404


async def test_http_sessions_count_against_capacity_and_are_reaped():
    with running(EchoEnv, max_sessions=1, idle_timeout_s=0.3) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
            full = await http.post("/reset")
            assert full.status_code == 503 and full.headers["Retry-After"] == "1"
            assert full.json()["code"] == "CAPACITY_REACHED"
            assert (await http.post("/sessions")).status_code == 503
            assert wait_until(lambda: srv.manager.active == 0, timeout=5)
            reaped = await http.get("/state", headers={SESSION_HEADER: sid})
            assert reaped.status_code == 410 and "idle" in reaped.json()["message"]
            assert (await http.post("/reset")).status_code == 200


class ToolEnv(CounterEnv):
    @tool
    def total_plus(self, a: int) -> int:
        """The running total plus ``a``."""
        return self._state.total + a


def call(method: str, rid: Any = 1, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params, "id": rid}


async def test_mcp_over_http():
    with running(ToolEnv, max_sessions=2) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            reply = (await http.post("/mcp", json={})).json()
            assert reply["error"]["code"] == -32600 and reply["id"] is None
            reply = await http.post("/mcp", content=b"{nope", headers=JSON)
            assert reply.status_code == 200 and reply.json()["error"]["code"] == -32700
            tools = await http.post("/mcp", json=call("tools/list"))
            assert [t["name"] for t in tools.json()["result"]["tools"]] == ["total_plus"]
            fresh = (
                await http.post(
                    "/mcp", json=call("tools/call", name="total_plus", arguments={"a": 2})
                )
            ).json()
            assert fresh["result"]["data"] == 2
            created = (await http.post("/mcp", json=call("openenv/session/create", rid="c"))).json()
            sid = created["result"]["session_id"]
            head = {SESSION_HEADER: sid}
            await http.post("/reset", headers=head)
            await http.post("/step", json={"action": {"amount": 5}}, headers=head)
            by_param = await http.post(
                "/mcp",
                json=call("tools/call", name="total_plus", arguments={"a": 1}, session_id=sid),
            )
            assert by_param.json()["result"]["data"] == 6
            by_header = await http.post(
                "/mcp", json=call("tools/call", name="total_plus", arguments={"a": 0}), headers=head
            )
            assert by_header.json()["result"]["data"] == 5
            missing = await http.post(
                "/mcp",
                json=call("tools/call", name="total_plus", arguments={"a": 0}, session_id="x"),
            )
            assert missing.json()["error"]["code"] == -32602
            closed = (
                await http.post("/mcp", json=call("openenv/session/close", session_id=sid))
            ).json()
            assert closed["result"] == {"session_id": sid, "closed": True}
            again = (
                await http.post("/mcp", json=call("openenv/session/close", session_id=sid))
            ).json()
            assert again["error"]["code"] == -32602
        assert wait_until(lambda: srv.manager.active == 0)


async def test_mcp_when_full_is_a_server_error():
    with running(ToolEnv, max_sessions=1) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            await http.post("/sessions")
            reply = (
                await http.post(
                    "/mcp", json=call("tools/call", name="total_plus", arguments={"a": 1})
                )
            ).json()
            assert reply["error"]["code"] == -32000
            assert reply["error"]["data"]["corral_code"] == "CAPACITY_REACHED"
            listed = (await http.post("/mcp", json=call("tools/list"))).json()
            assert "result" in listed  # listing needs no environment instance


async def test_openapi_describes_the_openenv_profile():
    with running(EchoEnv) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            spec = (await http.get("/openapi.json")).json()
    assert spec["info"]["version"].startswith("1.")
    for path in ("/reset", "/step", "/state", "/mcp", "/schema", "/metadata", "/health"):
        assert path in spec["paths"], path
    assert SESSION_HEADER in str(spec["paths"]["/step"])

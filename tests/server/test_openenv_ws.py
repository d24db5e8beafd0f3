"""OpenEnv's envelope on /ws, through real sockets (uvicorn in a thread)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from tests.support.envs import AutoResetEnv, BrokenFactoryEnv, CounterEnv
from tests.support.peers import AppThread
from tests.support.servers import running, wait_until
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from corral.client import AsyncEnvClient
from corral.contract.tools import tool
from corral.envs.echo import EchoEnv
from corral.server import create_app


class Peer:
    """An OpenEnv client by hand: JSON text frames, no subprotocol."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, url: str) -> Peer:
        return cls(await connect(url.replace("http://", "ws://") + "/ws"))

    async def send(self, frame: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))

    async def recv(self) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.recv(), 10)
        assert isinstance(raw, str), "OpenEnv frames are text"
        message: dict[str, Any] = json.loads(raw)
        return message

    async def ask(self, frame: dict[str, Any] | str | bytes) -> dict[str, Any]:
        await self.send(frame)
        return await self.recv()

    async def closed_with(self) -> int | None:
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(self.ws.recv(), 10)
        return self.ws.close_code


def error(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply["type"] == "error", reply
    data: dict[str, Any] = reply["data"]
    assert isinstance(data["message"], str)
    return data


async def test_an_echo_episode_in_openenv_frames():
    with running(EchoEnv) as srv:
        peer = await Peer.open(srv.url)
        assert peer.ws.subprotocol is None
        reply = await peer.ask({"type": "reset", "data": {"seed": 3, "episode_id": "ep1"}})
        assert reply == {
            "type": "observation",
            "data": {
                "observation": {"echoed_message": "ready", "message_length": 0},
                "reward": None,
                "done": False,
                "metadata": {"seed": 3},
                "truncated": False,
            },
        }
        reply = await peer.ask({"type": "step", "data": {"message": "hi"}})
        assert reply["data"]["observation"] == {"echoed_message": "hi", "message_length": 2}
        assert reply["data"]["reward"] == pytest.approx(0.2)
        reply = await peer.ask({"type": "state"})
        assert reply == {
            "type": "state",
            "data": {"episode_id": "ep1", "step_count": 1, "total_length": 2},
        }
        assert srv.manager.active == 1
        await peer.send({"type": "close"})
        assert await peer.closed_with() == 1000
        assert wait_until(lambda: srv.manager.active == 0)


async def test_pipelined_frames_are_answered_in_order():
    with running(EchoEnv) as srv:
        peer = await Peer.open(srv.url)
        await peer.send({"type": "reset"})
        for i in range(5):
            await peer.send({"type": "step", "data": {"message": "m" * (i + 1)}})
        await peer.send({"type": "state"})
        replies = [await peer.recv() for _ in range(7)]
        assert [r["type"] for r in replies] == ["observation"] * 6 + ["state"]
        lengths = [r["data"]["observation"]["message_length"] for r in replies[1:6]]
        assert lengths == [1, 2, 3, 4, 5]
        await peer.ws.close()


async def test_lifecycle_is_strict_and_errors_keep_the_session():
    with running(CounterEnv) as srv:
        peer = await Peer.open(srv.url)
        data = error(await peer.ask({"type": "step", "data": {"amount": 1}}))
        assert (data["code"], data["corral_code"]) == ("EXECUTION_ERROR", "RESET_REQUIRED")
        # CounterEnv.reset takes no episode_id: OpenEnv clients may send it anyway.
        reply = await peer.ask({"type": "reset", "data": {"episode_id": "e", "limit": 2}})
        assert reply["type"] == "observation"
        data = error(await peer.ask({"type": "step", "data": {"amount": 1, "note": "LOUD"}}))
        assert data["code"] == "VALIDATION_ERROR" and data["corral_code"] == "INVALID_ACTION"
        assert data["errors"][0]["loc"] == ["note"]
        assert "no shouting" in data["errors"][0]["msg"]
        data = error(await peer.ask({"type": "step", "data": {"fail": True}}))
        assert data["code"] == "EXECUTION_ERROR" and data["corral_code"] == "ENV_ERROR"
        assert "failed on purpose" in data["message"]
        reply = await peer.ask({"type": "step", "data": {"amount": 2}})
        assert reply["data"]["done"] is True
        data = error(await peer.ask({"type": "step", "data": {"amount": 1}}))
        assert data["corral_code"] == "EPISODE_ENDED"
        data = error(await peer.ask({"type": "reset", "data": {"nope": 1}}))
        assert data["code"] == "VALIDATION_ERROR" and data["corral_code"] == "INVALID_ARGUMENT"
        assert "nope" in data["message"]
        data = error(await peer.ask({"type": "reset", "data": {"seed": -5}}))
        assert data["code"] == "VALIDATION_ERROR"
        data = error(await peer.ask("{not json"))
        assert data["code"] == "INVALID_JSON" and data["message"].startswith("Invalid JSON")
        data = error(await peer.ask({"type": "nope"}))
        assert data["code"] == "UNKNOWN_TYPE" and "nope" in data["message"]
        data = error(await peer.ask({"type": "state", "x": 1}))
        assert data["code"] == "VALIDATION_ERROR" and data["errors"][0]["type"] == "extra_forbidden"
        data = error(await peer.ask("[1, 2]"))
        assert data["code"] == "VALIDATION_ERROR"
        state = await peer.ask(b'{"type": "state"}')  # binary frames are read as JSON too
        assert state["type"] == "state" and state["data"]["total"] == 2
        assert srv.manager.stats.errors["INVALID_ACTION"] == 1
        await peer.ws.close()


async def test_auto_reset_envs_restart_instead_of_refusing():
    with running(AutoResetEnv) as srv:
        peer = await Peer.open(srv.url)
        await peer.ask({"type": "reset", "data": {"limit": 1}})
        assert (await peer.ask({"type": "step", "data": {"amount": 1}}))["data"]["done"] is True
        reply = await peer.ask({"type": "step", "data": {"amount": 1}})
        assert reply["type"] == "observation" and reply["data"]["done"] is False
        await peer.ws.close()


async def test_capacity_is_reported_the_openenv_way():
    with running(EchoEnv, max_sessions=1) as srv:
        first = await Peer.open(srv.url)
        await first.ask({"type": "reset"})
        second = await Peer.open(srv.url)  # accepted, then told and closed
        data = error(await second.recv())
        assert data["code"] == "CAPACITY_REACHED"
        assert (data["active_sessions"], data["max_sessions"]) == (1, 1)
        assert await second.closed_with() == 1000
        assert (await first.ask({"type": "state"}))["type"] == "state"
        await first.ws.close()  # a disconnect without 'close' frees the slot too
        assert wait_until(lambda: srv.manager.active == 0)
        third = await Peer.open(srv.url)
        assert (await third.ask({"type": "reset"}))["type"] == "observation"
        await third.ws.close()
        # corral clients are still refused at the handshake, with 503.
    with running(EchoEnv, max_sessions=1) as srv:
        holder = await Peer.open(srv.url)
        await holder.ask({"type": "state"})
        with pytest.raises(InvalidStatus) as info:
            await connect(srv.url.replace("http", "ws") + "/ws", subprotocols=["corral.v1.json"])  # type: ignore[list-item]
        assert info.value.response.status_code == 503
        await holder.ws.close()


async def test_a_failing_factory_is_reported_then_closed():
    with running(BrokenFactoryEnv) as srv:
        peer = await Peer.open(srv.url)
        data = error(await peer.recv())
        assert data["code"] == "FACTORY_ERROR" and data["factory_name"]
        assert await peer.closed_with() == 1000
        assert srv.manager.active == 0


async def test_a_step_timeout_ends_the_session():
    with running(CounterEnv, step_timeout_s=0.3) as srv:
        peer = await Peer.open(srv.url)
        await peer.ask({"type": "reset"})
        data = error(await peer.ask({"type": "step", "data": {"sleep": 1.0}}))
        assert (data["code"], data["corral_code"]) == ("SESSION_ERROR", "STEP_TIMEOUT")
        assert await peer.closed_with() == 1000
        assert wait_until(lambda: srv.manager.active == 0)


async def test_an_idle_session_is_reaped_and_then_reported():
    with running(EchoEnv, idle_timeout_s=0.2) as srv:
        peer = await Peer.open(srv.url)
        await peer.ask({"type": "reset"})
        assert wait_until(lambda: srv.manager.active == 0, timeout=5)
        data = error(await peer.ask({"type": "state"}))
        assert (data["code"], data["corral_code"]) == ("SESSION_ERROR", "SESSION_LOST")
        assert "idle" in data["message"]
        assert await peer.closed_with() == 1000


async def test_corral_clients_and_openenv_clients_share_a_server():
    with running(EchoEnv) as srv:
        peer = await Peer.open(srv.url)
        await peer.ask({"type": "reset"})
        async with AsyncEnvClient(srv.url, env=EchoEnv) as native:
            await native.reset()
            result = await native.step({"message": "native"})
            assert result.observation.echoed_message == "native"
            assert native.server_info["protocol"] == "corral/1"
        reply = await peer.ask({"type": "step", "data": {"message": "openenv"}})
        assert reply["data"]["observation"]["echoed_message"] == "openenv"
        await peer.ws.close()


async def test_openenv_can_be_switched_off():
    with AppThread(create_app(EchoEnv, openenv=False)) as url:
        with pytest.raises(InvalidStatus) as info:
            await connect(url.replace("http", "ws") + "/ws")
        assert info.value.response.status_code == 400
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.post("/reset")).status_code == 404


class ToolEnv(CounterEnv):
    @tool
    def add(self, a: int, b: int = 1) -> int:
        """Add two numbers, plus the running total."""
        return a + b + self._state.total

    @tool
    async def shout(self, text: str) -> str:
        return text.upper()

    @tool
    def boom(self) -> None:
        raise ValueError("tool failed")


def rpc(method: str, rid: Any = 1, **params: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "data": {"jsonrpc": "2.0", "method": method, "params": params, "id": rid},
    }


async def test_mcp_frames_call_tools_on_the_session_env():
    with running(ToolEnv) as srv:
        peer = await Peer.open(srv.url)
        reply = await peer.ask(rpc("tools/list"))
        assert reply["type"] == "mcp"
        names = [t["name"] for t in reply["data"]["result"]["tools"]]
        assert names == ["add", "boom", "shout"]
        await peer.ask({"type": "reset"})
        await peer.ask({"type": "step", "data": {"amount": 5}})
        reply = await peer.ask(rpc("tools/call", rid="c1", name="add", arguments={"a": 1}))
        assert reply["data"]["id"] == "c1"
        assert reply["data"]["result"]["data"] == 7  # 1 + 1 + this session's total
        assert reply["data"]["result"]["structuredContent"] == {"result": 7}
        reply = await peer.ask(rpc("tools/call", name="shout", arguments={"text": "hi"}))
        assert reply["data"]["result"]["content"] == [{"type": "text", "text": "HI"}]
        reply = await peer.ask(rpc("tools/call", name="boom"))
        result = reply["data"]["result"]
        assert result["isError"] is True and "tool failed" in result["content"][0]["text"]
        reply = await peer.ask(rpc("tools/call", name="add", arguments={"a": "x"}))
        assert reply["data"]["error"]["code"] == -32602
        reply = await peer.ask(rpc("nope"))
        assert reply["data"]["error"]["code"] == -32601
        reply = await peer.ask({"type": "mcp", "data": {"method": "tools/list"}})
        assert reply["data"]["error"]["code"] == -32600
        reply = await peer.ask(rpc("openenv/session/create"))
        own = reply["data"]["result"]["session_id"]
        assert own in srv.manager.sessions
        reply = await peer.ask(rpc("openenv/session/close", session_id=own))
        assert reply["data"]["error"]["code"] == -32600
        assert (await peer.ask({"type": "state"}))["data"]["total"] == 5
        await peer.ws.close()


async def test_mcp_on_an_env_without_tools():
    with running(EchoEnv) as srv:
        peer = await Peer.open(srv.url)
        for method in ("tools/list", "tools/call"):
            reply = await peer.ask(rpc(method, name="x"))
            assert reply["data"]["error"]["code"] == -32601
            assert "exposes no tools" in reply["data"]["error"]["message"]
        await peer.ws.close()

"""JSON-RPC 2.0 and MCP's tool messages (``corral.protocol.jsonrpc``), without sockets."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contract import Action, Environment, Observation, State
from corral.contract.tools import tool, tools_of
from corral.protocol import jsonrpc as rpcmod
from corral.protocol.jsonrpc import RpcCode as RPC


@pytest.mark.parametrize(
    ("payload", "code", "rid"),
    [
        ([], RPC.INVALID_REQUEST, None),
        ({}, RPC.INVALID_REQUEST, None),
        ({"jsonrpc": "1.0", "method": "m", "id": 4}, RPC.INVALID_REQUEST, 4),
        ({"jsonrpc": "2.0", "id": "a"}, RPC.INVALID_REQUEST, "a"),
        ({"jsonrpc": "2.0", "method": "m", "id": 1.5}, RPC.INVALID_REQUEST, None),
        ({"jsonrpc": "2.0", "method": "m", "id": True}, RPC.INVALID_REQUEST, None),
        ({"jsonrpc": "2.0", "method": "m", "x": 1, "id": 2}, RPC.INVALID_REQUEST, 2),
        ({"jsonrpc": "2.0", "method": "m", "params": [1], "id": 3}, RPC.INVALID_PARAMS, 3),
    ],
)
def test_bad_rpc_requests(payload, code, rid):
    with pytest.raises(rpcmod.RpcError) as info:
        rpcmod.parse_rpc(payload)
    response = info.value.response()
    assert response["jsonrpc"] == "2.0" and response["id"] == rid
    assert response["error"]["code"] == code


def test_rpc_parsing():
    request = rpcmod.parse_rpc({"jsonrpc": "2.0", "method": "tools/list", "id": 7, "params": None})
    assert request == rpcmod.RpcRequest(id=7, method="tools/list", params={})
    with pytest.raises(rpcmod.RpcError) as info:
        rpcmod.parse_rpc_bytes(b"{oops")
    assert info.value.code is RPC.PARSE_ERROR
    assert rpcmod.rpc_error(1, -32000, "m") == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32000, "message": "m"},
    }


class Act(Action):
    x: int = 0


class Calc(Environment[Act, Observation, State]):
    @tool
    def add(self, a: int, b: int = 1) -> int:
        """Add two integers."""
        return a + b

    @tool(name="echo.text", description="Echo it.")
    def echo(self, text: str, *, times: int = 1) -> Any:
        return text * times


def rpc(method: str, **params: Any) -> rpcmod.RpcRequest:
    return rpcmod.RpcRequest(id=1, method=method, params=params)


def test_plan_tools_calls():
    tools = tools_of(Calc)
    assert rpcmod.plan_rpc(rpc("tools/list"), tools, "calc") == rpcmod.ListTools(1)
    plan = rpcmod.plan_rpc(rpc("tools/call", name="add", arguments={"a": 2}), tools, "calc")
    assert isinstance(plan, rpcmod.CallTool)
    assert (plan.tool.name, plan.args, plan.kwargs, plan.session_id) == ("add", (2, 1), {}, None)
    plan = rpcmod.plan_rpc(
        rpc("tools/call", name="echo.text", arguments={"text": "a", "times": 2}, session_id="s"),
        tools,
        "calc",
    )
    assert isinstance(plan, rpcmod.CallTool)
    assert (plan.args, plan.kwargs, plan.session_id) == (("a",), {"times": 2}, "s")
    assert rpcmod.plan_rpc(rpc("openenv/session/create"), tools, "calc") == rpcmod.CreateSession(1)
    assert rpcmod.plan_rpc(rpc("openenv/session/close", session_id="s"), tools, "calc") == (
        rpcmod.CloseRpcSession(1, "s")
    )


@pytest.mark.parametrize(
    ("request_", "code", "match"),
    [
        (rpc("tools/call"), RPC.INVALID_PARAMS, "Missing 'name'"),
        (rpc("tools/call", name="nope"), RPC.INVALID_PARAMS, "Unknown tool: 'nope'"),
        (
            rpc("tools/call", name="add", arguments=[1]),
            RPC.INVALID_PARAMS,
            "must be an object",
        ),
        (
            rpc("tools/call", name="add", arguments={"a": "x"}),
            RPC.INVALID_PARAMS,
            "invalid arguments",
        ),
        (
            rpc("tools/call", name="add", arguments={"a": 1, "c": 2}),
            RPC.INVALID_PARAMS,
            "invalid arguments",
        ),
        (rpc("tools/call", name="add", session_id=3), RPC.INVALID_PARAMS, "session_id"),
        (rpc("openenv/session/close"), RPC.INVALID_PARAMS, "'session_id' is required"),
        (rpc("initialize"), RPC.METHOD_NOT_FOUND, "Method not found: 'initialize'"),
    ],
)
def test_plan_errors(request_, code, match):
    with pytest.raises(rpcmod.RpcError, match=match) as info:
        rpcmod.plan_rpc(request_, tools_of(Calc), "calc")
    assert info.value.code is code and info.value.request_id == 1


def test_invalid_arguments_carry_the_errors():
    with pytest.raises(rpcmod.RpcError) as info:
        rpcmod.plan_rpc(rpc("tools/call", name="add", arguments={}), tools_of(Calc), "calc")
    assert info.value.data == {
        "errors": [{"type": "missing", "loc": ["a"], "msg": "Field required", "input": {}}]
    }


def test_an_env_without_tools_answers_method_not_found():
    for method in ("tools/list", "tools/call"):
        with pytest.raises(rpcmod.RpcError, match="exposes no tools") as info:
            rpcmod.plan_rpc(rpc(method, name="x"), {}, "echo")
        assert info.value.code is RPC.METHOD_NOT_FOUND


def test_tool_results():
    listing = rpcmod.tools_list_result(tools_of(Calc))["tools"]
    assert [t["name"] for t in listing] == ["add", "echo.text"]
    add = listing[0]
    assert add["description"] == "Add two integers."
    assert add["inputSchema"]["required"] == ["a"]
    # MCP requires an object output schema: a bare integer result is wrapped.
    assert add["outputSchema"] == {
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
    }
    assert "outputSchema" not in listing[1]
    spec = tools_of(Calc)["add"]
    assert rpcmod.tool_result(spec, 3) == {
        "content": [{"type": "text", "text": "3"}],
        "isError": False,
        "structuredContent": {"result": 3},
        "data": 3,
    }
    untyped = tools_of(Calc)["echo.text"]
    assert "structuredContent" not in rpcmod.tool_result(untyped, {"a": 1})
    assert rpcmod.tool_result(untyped, "hi")["content"][0]["text"] == "hi"
    error = rpcmod.tool_error("boom")
    assert error["isError"] is True and error["content"][0]["text"] == "boom"

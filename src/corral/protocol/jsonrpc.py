"""JSON-RPC 2.0 and MCP's tool messages: sans I/O, shared by every MCP face of corral.

Three transports speak it and all of them use this module, so a tool answers the same
everywhere:

* OpenEnv's dialect: ``POST /mcp``, the ``/mcp`` WebSocket and ``mcp`` frames on
  ``/ws`` (``tools/list``, ``tools/call``, ``openenv/session/create|close``; no
  ``initialize``), see :mod:`corral.server.openenv`;
* the MCP specification's streamable HTTP transport (``corral serve --mcp``) and its
  stdio transport (``corral mcp TARGET``), see :mod:`corral.adapters.mcp`.

:func:`parse_rpc` validates a request; :func:`plan_rpc` decides what an OpenEnv-dialect
request asks for, validating tool arguments against the environment's
:mod:`tool registry <corral.contract.tools>`; :func:`tool_descriptor`,
:func:`tool_result` and :func:`tool_error` shape MCP's ``tools/list`` entries and
``tools/call`` results (``content``, ``structuredContent`` when the tool has an output
schema, ``isError``, plus ``data``: the bare value, where OpenEnv's ``MCPToolClient``
reads a result).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import orjson
from pydantic import ValidationError

from corral.contract.tools import Tool
from corral.errors import validation_errors, validation_message


class RpcCode(IntEnum):
    """JSON-RPC 2.0 error codes (and the server-error code OpenEnv uses)."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    SERVER_ERROR = -32000


RpcId = str | int | None


class RpcError(Exception):
    """A JSON-RPC error to answer with; :meth:`response` builds the reply."""

    def __init__(
        self, code: RpcCode, message: str, *, request_id: RpcId = None, data: Any = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.data = data

    def response(self) -> dict[str, Any]:
        """The JSON-RPC error response."""
        return rpc_error(self.request_id, self.code, self.message, self.data)


@dataclass(frozen=True, slots=True)
class RpcRequest:
    """A valid JSON-RPC 2.0 request."""

    id: RpcId
    method: str
    params: dict[str, Any]


_RPC_KEYS = frozenset({"jsonrpc", "method", "params", "id"})


def rpc_request(
    request_id: RpcId, method: str, params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON-RPC request (what a client of ``POST /mcp`` sends)."""
    request: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        request["params"] = params
    return request


def rpc_result(request_id: RpcId, result: Any) -> dict[str, Any]:
    """A JSON-RPC success response."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def rpc_error(request_id: RpcId, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response (``data`` omitted when None)."""
    error: dict[str, Any] = {"code": int(code), "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def parse_rpc_bytes(body: bytes | str) -> RpcRequest:
    """Decode and validate a JSON-RPC request body.

    Raises:
        RpcError: PARSE_ERROR for bad JSON, else as :func:`parse_rpc`.
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RpcError(RpcCode.PARSE_ERROR, f"Parse error: {exc}") from None
    return parse_rpc(payload)


def parse_rpc(payload: Any) -> RpcRequest:
    """Validate a decoded JSON-RPC 2.0 request (batches are not supported).

    Raises:
        RpcError: INVALID_REQUEST for a malformed request, INVALID_PARAMS for non-object
            params; the error carries the request's id whenever it was readable.
    """
    if not isinstance(payload, dict):
        raise RpcError(
            RpcCode.INVALID_REQUEST,
            "Invalid request: expected a JSON-RPC 2.0 request object (batches are not supported)",
        )
    raw_id = payload.get("id")
    request_id: RpcId = (
        raw_id if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) else None
    )
    problems = []
    if payload.get("jsonrpc") != "2.0":
        problems.append("'jsonrpc' must be \"2.0\"")
    if not isinstance(payload.get("method"), str):
        problems.append("'method' must be a string")
    if "id" in payload and raw_id is not None and request_id is None:
        problems.append("'id' must be a string, an integer or null")
    unknown = sorted(set(payload) - _RPC_KEYS)
    if unknown:
        problems.append(f"unknown member(s) {unknown}")
    if problems:
        raise RpcError(
            RpcCode.INVALID_REQUEST,
            "Invalid request: " + "; ".join(problems),
            request_id=request_id,
        )
    params = payload.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(RpcCode.INVALID_PARAMS, "Params must be an object", request_id=request_id)
    return RpcRequest(id=request_id, method=payload["method"], params=params)


@dataclass(frozen=True, slots=True)
class ListTools:
    """``tools/list``: answer with :func:`tools_list_result`."""

    id: RpcId


@dataclass(frozen=True, slots=True)
class CallTool:
    """``tools/call`` with validated arguments: run ``tool`` on the session's env."""

    id: RpcId
    tool: Tool
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    session_id: str | None


@dataclass(frozen=True, slots=True)
class CreateSession:
    """OpenEnv's ``openenv/session/create``: open a stateful session."""

    id: RpcId


@dataclass(frozen=True, slots=True)
class CloseRpcSession:
    """OpenEnv's ``openenv/session/close``: close the session ``session_id``."""

    id: RpcId
    session_id: str


RpcPlan = ListTools | CallTool | CreateSession | CloseRpcSession

TOOLS_LIST = "tools/list"
TOOLS_CALL = "tools/call"
SESSION_CREATE = "openenv/session/create"
SESSION_CLOSE = "openenv/session/close"


def plan_rpc(request: RpcRequest, tools: Mapping[str, Tool], env_name: str) -> RpcPlan:
    """Decide what a JSON-RPC request asks for, validating tool arguments.

    Raises:
        RpcError: METHOD_NOT_FOUND for an unknown method (or any tool method on an
            environment without tools), INVALID_PARAMS for a bad tool name or arguments.
    """
    rid = request.id
    params = request.params
    session_id = params.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        raise RpcError(RpcCode.INVALID_PARAMS, "'session_id' must be a string", request_id=rid)
    if request.method == SESSION_CREATE:
        return CreateSession(rid)
    if request.method == SESSION_CLOSE:
        if not session_id:
            raise RpcError(
                RpcCode.INVALID_PARAMS, "Invalid params - 'session_id' is required", request_id=rid
            )
        return CloseRpcSession(rid, session_id)
    if request.method not in (TOOLS_LIST, TOOLS_CALL):
        raise RpcError(
            RpcCode.METHOD_NOT_FOUND,
            f"Method not found: {request.method!r}; this server answers "
            f"{TOOLS_LIST}, {TOOLS_CALL}, {SESSION_CREATE} and {SESSION_CLOSE}",
            request_id=rid,
        )
    if not tools:
        raise RpcError(
            RpcCode.METHOD_NOT_FOUND,
            f"environment {env_name!r} exposes no tools, so {request.method} is not "
            "available; mark environment methods with @corral.contract.tools.tool",
            request_id=rid,
        )
    if request.method == TOOLS_LIST:
        return ListTools(rid)
    name = params.get("name")
    if not isinstance(name, str) or not name:
        raise RpcError(RpcCode.INVALID_PARAMS, "Missing 'name' in params", request_id=rid)
    spec = tools.get(name)
    if spec is None:
        raise RpcError(
            RpcCode.INVALID_PARAMS,
            f"Unknown tool: {name!r}; available: {sorted(tools)}",
            request_id=rid,
        )
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise RpcError(RpcCode.INVALID_PARAMS, "'arguments' must be an object", request_id=rid)
    try:
        args, kwargs = spec.bind(arguments)
    except ValidationError as exc:
        raise RpcError(
            RpcCode.INVALID_PARAMS,
            validation_message(f"invalid arguments for tool {name!r}", exc),
            request_id=rid,
            data={"errors": validation_errors(exc)},
        ) from None
    return CallTool(rid, spec, args, kwargs, session_id)


def output_schema(spec: Tool) -> dict[str, Any] | None:
    """The tool's MCP ``outputSchema``: its return type's schema when that is an object,
    else ``{"result": <schema>}`` (MCP requires an object; the result is wrapped alike)."""
    schema = spec.output_schema
    if schema is None:
        return None
    if schema.get("type") == "object":
        return schema
    return {"type": "object", "properties": {"result": schema}, "required": ["result"]}


def tool_descriptor(spec: Tool) -> dict[str, Any]:
    """A tool as MCP's ``tools/list`` describes it."""
    out: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "inputSchema": spec.input_schema,
    }
    schema = output_schema(spec)
    if schema is not None:
        out["outputSchema"] = schema
    return out


def tools_list_result(tools: Mapping[str, Tool]) -> dict[str, Any]:
    """The ``tools/list`` result."""
    return {"tools": [tool_descriptor(spec) for spec in tools.values()]}


def tool_result(spec: Tool, value: Any) -> dict[str, Any]:
    """The ``tools/call`` result for the JSON form of a tool's return value."""
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    schema = output_schema(spec)
    if schema is not None:
        wrapped = schema is not spec.output_schema
        result["structuredContent"] = {"result": value} if wrapped else value
    result["data"] = value
    return result


def tool_error(message: str) -> dict[str, Any]:
    """A ``tools/call`` result reporting a failure to the agent (not a protocol error)."""
    return {"content": [{"type": "text", "text": message}], "isError": True, "data": None}


def argument_problems(exc: ValidationError) -> str:
    """Validation errors of tool arguments as one line an agent can act on."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
        for e in validation_errors(exc)
    )


__all__ = [
    "CallTool",
    "CloseRpcSession",
    "CreateSession",
    "ListTools",
    "RpcCode",
    "RpcError",
    "RpcId",
    "RpcPlan",
    "RpcRequest",
    "output_schema",
    "parse_rpc",
    "parse_rpc_bytes",
    "plan_rpc",
    "rpc_error",
    "rpc_request",
    "rpc_result",
    "tool_descriptor",
    "tool_error",
    "tool_result",
    "tools_list_result",
]

"""OpenEnv's wire envelope, translated to and from ``corral/1``: sans I/O.

OpenEnv (``openenv-core``) speaks JSON text frames on ``/ws`` with no request ids, in
strict request/reply order:

    >> {"type": "reset", "data": {"seed": 1, "episode_id": "e1"}}
    << {"type": "observation", "data": {"observation": {...}, "reward": null, "done": false}}
    >> {"type": "step", "data": {<bare action fields>}}
    >> {"type": "state"}            << {"type": "state", "data": {...}}
    >> {"type": "mcp", "data": <JSON-RPC 2.0 request>}   << {"type": "mcp", "data": <response>}
    >> {"type": "close"}            (no reply; the server closes with 1000)
    << {"type": "error", "data": {"message": ..., "code": <OpenEnv code>, ...}}

This module holds both directions as plain functions and classes:

* server side (:class:`ServerTranslator`): an OpenEnv frame becomes a corral request
  (validated by :func:`corral.protocol.messages.parse_request`, so both protocols apply
  exactly the same rules), and corral's reply becomes the OpenEnv frame;
* client side (:func:`client_frame`, :func:`client_reply`): what corral's client sends
  becomes an OpenEnv frame, and the OpenEnv reply becomes a corral reply or exception;
* MCP: JSON-RPC 2.0 parsing, ``tools/list`` / ``tools/call`` planning against an
  environment's :mod:`tool registry <corral.contract.tools>`, and result shaping.

Observations are *flattened* the OpenEnv way: ``done``, ``reward``, ``metadata`` (and
corral's ``truncated``) move out of the observation to the top level of ``data``;
unlike OpenEnv 0.3, ``metadata`` is kept (as OpenEnv 0.10 does).

Error mapping (corral code → OpenEnv code; corral's own code always rides along in
``corral_code``, its ``details`` in ``details``):

=================================================  ====================  ==============
corral                                             OpenEnv               session
=================================================  ====================  ==============
BAD_FRAME                                          INVALID_JSON          kept
UNKNOWN_TYPE                                       UNKNOWN_TYPE          kept
BAD_MESSAGE, INVALID_ACTION, INVALID_ARGUMENT,     VALIDATION_ERROR      kept
FRAME_TOO_LARGE, BATCH_TOO_LARGE                   (+ ``errors``)
RESET_REQUIRED, EPISODE_ENDED, SESSION_BUSY,       EXECUTION_ERROR       kept
ENV_ERROR, BAD_OBSERVATION, INTERNAL_ERROR, ...
CAPACITY_REACHED                                   CAPACITY_REACHED      closed (1000)
                                                   (+ ``active_sessions``, ``max_sessions``)
FACTORY_ERROR                                      FACTORY_ERROR         closed (1000)
STEP_TIMEOUT, SESSION_LOST, UNKNOWN_SESSION, ...   SESSION_ERROR         closed (1000)
=================================================  ====================  ==============
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.contract.tools import Tool
from corral.errors import (
    BadFrame,
    BadMessage,
    CapacityReached,
    CorralError,
    EnvError,
    ErrorCode,
    FactoryError,
    FrameTooLarge,
    InvalidAction,
    InvalidArgument,
    SessionLost,
    UnknownType,
    UnsupportedProtocol,
    error_from_wire,
    validation_errors,
)
from corral.protocol import messages as m

PROTOCOL_NAME = "openenv"
"""How corral names the OpenEnv envelope in handshakes, reports and logs."""


class OpenEnvCode(StrEnum):
    """The error codes of OpenEnv's WebSocket envelope (``WSErrorCode``)."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


FATAL_CODES = frozenset(
    {OpenEnvCode.CAPACITY_REACHED, OpenEnvCode.FACTORY_ERROR, OpenEnvCode.SESSION_ERROR}
)
"""Codes after which the session is gone and the server closes the socket with 1000."""

_E = ErrorCode
_O = OpenEnvCode
OPENENV_CODES: dict[str, OpenEnvCode] = {
    _E.BAD_FRAME: _O.INVALID_JSON,
    _E.BAD_MESSAGE: _O.VALIDATION_ERROR,
    _E.UNKNOWN_TYPE: _O.UNKNOWN_TYPE,
    _E.FRAME_TOO_LARGE: _O.VALIDATION_ERROR,
    _E.BATCH_TOO_LARGE: _O.VALIDATION_ERROR,
    _E.HANDSHAKE_REQUIRED: _O.SESSION_ERROR,
    _E.UNSUPPORTED_PROTOCOL: _O.SESSION_ERROR,
    _E.CONTRACT_MISMATCH: _O.SESSION_ERROR,
    _E.UNAUTHORIZED: _O.SESSION_ERROR,
    _E.CAPACITY_REACHED: _O.CAPACITY_REACHED,
    _E.TOO_MANY_SESSIONS: _O.CAPACITY_REACHED,
    _E.TOO_MANY_CONNECTIONS: _O.CAPACITY_REACHED,
    _E.UNKNOWN_SESSION: _O.SESSION_ERROR,
    _E.SESSION_LOST: _O.SESSION_ERROR,
    _E.RESET_REQUIRED: _O.EXECUTION_ERROR,
    _E.EPISODE_ENDED: _O.EXECUTION_ERROR,
    _E.SESSION_BUSY: _O.EXECUTION_ERROR,
    _E.INVALID_ACTION: _O.VALIDATION_ERROR,
    _E.INVALID_ARGUMENT: _O.VALIDATION_ERROR,
    _E.ENV_ERROR: _O.EXECUTION_ERROR,
    _E.FACTORY_ERROR: _O.FACTORY_ERROR,
    _E.BAD_OBSERVATION: _O.EXECUTION_ERROR,
    _E.STEP_TIMEOUT: _O.SESSION_ERROR,
    _E.INTERNAL_ERROR: _O.EXECUTION_ERROR,
    _E.REQUEST_TIMEOUT: _O.EXECUTION_ERROR,
    _E.CONNECTION_LOST: _O.SESSION_ERROR,
    _E.CLIENT_CLOSED: _O.SESSION_ERROR,
}
"""Every corral code and the OpenEnv code it is reported as (see the module table)."""


def openenv_code(corral_code: str) -> OpenEnvCode:
    """The OpenEnv code for a corral code (``EXECUTION_ERROR`` for one it does not know)."""
    return OPENENV_CODES.get(corral_code, OpenEnvCode.EXECUTION_ERROR)


def is_fatal(frame: Mapping[str, Any]) -> bool:
    """True when ``frame`` is an error after which the OpenEnv session is closed."""
    if frame.get("type") != "error":
        return False
    data = frame.get("data")
    return isinstance(data, Mapping) and data.get("code") in FATAL_CODES


def error_frame(exc: CorralError) -> dict[str, Any]:
    """The OpenEnv ``error`` frame reporting ``exc``."""
    code = openenv_code(str(exc.code))
    details = dict(exc.details)
    data: dict[str, Any] = {"message": exc.message, "code": str(code)}
    if code is OpenEnvCode.VALIDATION_ERROR:
        errors = details.pop("errors", None)
        if not isinstance(errors, list):
            loc = [details["field"]] if isinstance(details.get("field"), str) else []
            errors = [{"type": str(exc.code).lower(), "loc": loc, "msg": exc.message}]
        data["errors"] = errors
    elif code is OpenEnvCode.CAPACITY_REACHED:
        data["active_sessions"] = details.get("active_sessions")
        data["max_sessions"] = details.get("max_sessions", details.get("limit"))
    elif code is OpenEnvCode.FACTORY_ERROR:
        data["factory_name"] = details.get("factory")
    data["corral_code"] = str(exc.code)
    if details:
        data["details"] = details
    return {"type": "error", "data": data}


# -- observations ------------------------------------------------------------------

LIFTED_KEYS = ("reward", "done", "metadata", "truncated", "reward_components")
"""Observation fields that OpenEnv carries beside the observation rather than inside it."""


def flatten_observation(observation: Mapping[str, Any]) -> dict[str, Any]:
    """OpenEnv's reply ``data`` for an observation's wire object.

    ``{"observation": <fields but the lifted ones>, "reward", "done", "metadata",
    "truncated"}``: OpenEnv clients read the first three; ``metadata`` is where OpenEnv
    0.10 puts it; ``truncated`` is corral's (OpenEnv clients ignore it), and so is
    ``reward_components``, there only when the observation has some (inside the
    observation it would break OpenEnv's typed clients, whose models forbid unknown fields).
    """
    flat = {
        "observation": {k: v for k, v in observation.items() if k not in LIFTED_KEYS},
        "reward": observation.get("reward"),
        "done": bool(observation.get("done", False)),
        "metadata": observation.get("metadata") or {},
        "truncated": bool(observation.get("truncated", False)),
    }
    components = observation.get("reward_components")
    if components:
        flat["reward_components"] = components
    return flat


def unflatten_observation(data: Any) -> dict[str, Any]:
    """An observation's wire object rebuilt from OpenEnv's reply ``data``.

    Raises:
        BadMessage: ``data`` does not have OpenEnv's observation layout.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("observation"), Mapping):
        raise BadMessage(
            "an OpenEnv observation reply must carry data.observation as an object",
            details={"field": "observation"},
        )
    observation = dict(data["observation"])
    for key in LIFTED_KEYS:
        if key in data and data[key] is not None:
            observation[key] = data[key]
    reward = observation.get("reward")
    if isinstance(reward, bool):
        # OpenEnv allows bool rewards; corral's reward is a float.
        observation["reward"] = float(reward)
    return observation


# -- server side: OpenEnv frames in, corral requests out ---------------------------


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ResetFrame(_Envelope):
    type: Literal["reset"]
    data: dict[str, Any] = Field(default_factory=dict)


class _StepFrame(_Envelope):
    type: Literal["step"]
    data: dict[str, Any]


class _StateFrame(_Envelope):
    type: Literal["state"]


class _CloseFrame(_Envelope):
    type: Literal["close"]


class _McpFrame(_Envelope):
    type: Literal["mcp"]
    data: dict[str, Any]


_FRAMES: dict[str, type[_Envelope]] = {
    "reset": _ResetFrame,
    "step": _StepFrame,
    "state": _StateFrame,
    "close": _CloseFrame,
    "mcp": _McpFrame,
}
FRAME_TYPES = tuple(_FRAMES)
"""The ``type`` values an OpenEnv client may send."""


@dataclass(frozen=True, slots=True)
class Call:
    """An OpenEnv ``reset``/``step``/``state``: the corral request to run."""

    request: m.Request


@dataclass(frozen=True, slots=True)
class CloseSession:
    """An OpenEnv ``close``: end the session, send nothing, close the socket with 1000."""


@dataclass(frozen=True, slots=True)
class McpMessage:
    """An OpenEnv ``mcp`` frame: its JSON-RPC payload, still to be parsed."""

    payload: dict[str, Any]


Inbound = Call | CloseSession | McpMessage


class ServerTranslator:
    """The server side of one OpenEnv connection, bound to one corral session.

    Args:
        session: the corral session id this connection drives.
        reset_options: reset keywords the environment accepts besides ``seed`` (None:
            any, it takes ``**kwargs``). OpenEnv clients send ``episode_id`` to every
            server; it is dropped when the environment does not take it. Any other
            unknown keyword is refused with VALIDATION_ERROR, never silently dropped.
        action_fields: the Action model's field names. OpenEnv's Action base class has
            ``metadata={}``; an empty ``metadata`` is dropped when the model has none.
        max_frame_bytes: larger frames get VALIDATION_ERROR (the session lives on).
    """

    def __init__(
        self,
        session: str,
        *,
        reset_options: frozenset[str] | None,
        action_fields: frozenset[str],
        max_frame_bytes: int,
    ) -> None:
        self.session = session
        self.reset_options = reset_options
        self.action_fields = action_fields
        self.max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)

    def read(self, frame: str | bytes) -> Inbound:
        """Parse one client frame.

        Raises:
            CorralError: the frame is not valid JSON, not a known message, or its
                content fails corral's validation; report it with :func:`error_frame`.
        """
        if len(frame) > self.max_frame_bytes:
            raise FrameTooLarge(
                f"frame of {len(frame)} bytes exceeds the limit of {self.max_frame_bytes}",
                details={"size": len(frame), "limit": self.max_frame_bytes},
            )
        try:
            message = orjson.loads(frame)
        except orjson.JSONDecodeError as exc:
            raise BadFrame(f"Invalid JSON: {exc}") from None
        return self.parse(message)

    def parse(self, message: Any) -> Inbound:
        """Validate one decoded client message (what :meth:`read` does after decoding).

        Raises:
            CorralError: as for :meth:`read`.
        """
        if not isinstance(message, dict):
            raise BadMessage(
                f"a message must be a JSON object with a 'type', got {type(message).__name__}",
                details={"field": "type"},
            )
        kind = message.get("type")
        model = _FRAMES.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise UnknownType(
                f"Unknown message type: {kind!r}; send one of {', '.join(FRAME_TYPES)}",
                details={"type": kind if isinstance(kind, str) else None},
            )
        try:
            envelope = model.model_validate(message)
        except ValidationError as exc:
            raise BadMessage(
                f"invalid {kind!r} message: {exc.error_count()} error(s)",
                details={"errors": validation_errors(exc)},
            ) from None
        if isinstance(envelope, _CloseFrame):
            return CloseSession()
        if isinstance(envelope, _McpFrame):
            return McpMessage(envelope.data)
        return Call(m.parse_request(self._corral_message(envelope)))

    def _corral_message(self, envelope: _Envelope) -> dict[str, Any]:
        base = {"id": next(self._ids), "session": self.session}
        if isinstance(envelope, _ResetFrame):
            options = dict(envelope.data)
            seed = options.pop("seed", None)
            if (
                self.reset_options is not None
                and "episode_id" not in self.reset_options
                and "episode_id" in options
            ):
                del options["episode_id"]
            return {"type": "reset", **base, "seed": seed, "options": options}
        if isinstance(envelope, _StepFrame):
            action = dict(envelope.data)
            if "metadata" not in self.action_fields and action.get("metadata") == {}:
                del action["metadata"]
            return {"type": "step", **base, "action": action}
        return {"type": "state", **base}

    def reply(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """The OpenEnv frame for corral's reply to a :class:`Call`.

        Raises:
            ValueError: ``message`` is not a reply to reset/step/state.
        """
        kind = message.get("type")
        if kind == "result":
            return {"type": "observation", "data": flatten_observation(message["observation"])}
        if kind == "state":
            return {"type": "state", "data": message["state"]}
        if kind == "error":
            return error_frame(error_from_wire(dict(message)))
        raise ValueError(f"no OpenEnv form for a corral {kind!r} reply")


# -- MCP: JSON-RPC 2.0 -------------------------------------------------------------


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
            f"invalid arguments for tool {name!r}: {exc.error_count()} error(s)",
            request_id=rid,
            data={"errors": validation_errors(exc)},
        ) from None
    return CallTool(rid, spec, args, kwargs, session_id)


def tool_descriptor(spec: Tool) -> dict[str, Any]:
    """A tool as MCP's ``tools/list`` describes it."""
    out: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "inputSchema": spec.input_schema,
    }
    if spec.output_schema is not None:
        out["outputSchema"] = spec.output_schema
    return out


def tools_list_result(tools: Mapping[str, Tool]) -> dict[str, Any]:
    """The ``tools/list`` result."""
    return {"tools": [tool_descriptor(spec) for spec in tools.values()]}


def tool_call_result(value: Any) -> dict[str, Any]:
    """The ``tools/call`` result for a JSON-compatible return value.

    MCP's ``content``/``structuredContent``/``isError``, plus ``data`` (the bare value),
    which is where OpenEnv's MCP client reads a tool's result.
    """
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    structured = value if isinstance(value, dict) else {"result": value}
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": False,
        "data": value,
    }


def tool_error_result(message: str) -> dict[str, Any]:
    """The ``tools/call`` result when the tool itself raised (MCP: not a protocol error)."""
    return {"content": [{"type": "text", "text": message}], "isError": True, "data": None}


def mcp_frame(response: dict[str, Any]) -> dict[str, Any]:
    """The OpenEnv frame carrying a JSON-RPC response."""
    return {"type": "mcp", "data": response}


# -- client side: corral requests out as OpenEnv frames, OpenEnv replies back in ----

CLIENT_REQUESTS = frozenset({"reset", "step", "state", "close"})
"""The corral requests that have an OpenEnv form."""


def client_frame(message: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenEnv frame for a corral ``reset``/``step``/``state``/``close`` request.

    Raises:
        UnsupportedProtocol: the request has no OpenEnv form (attach, batches, ...).
        BadMessage: a step's action is not an object.
    """
    kind = message.get("type")
    if kind == "reset":
        data = dict(message.get("options") or {})
        if message.get("seed") is not None:
            data["seed"] = message["seed"]
        return {"type": "reset", "data": data}
    if kind == "step":
        action = message.get("action")
        if not isinstance(action, Mapping):
            raise BadMessage(
                "over the OpenEnv envelope an action must be an object",
                details={"field": "action"},
            )
        return {"type": "step", "data": dict(action)}
    if kind in ("state", "close"):
        return {"type": kind}
    raise UnsupportedProtocol(
        f"{kind!r} is not available over the OpenEnv envelope, which has one session per "
        "connection and no request ids, resume or batching",
        details={"protocol": PROTOCOL_NAME, "request": kind},
    )


_EXPECTED = {"reset": "observation", "step": "observation", "state": "state"}


def client_reply(kind: str, frame: str | bytes, *, request_id: int, session: str) -> dict[str, Any]:
    """corral's reply to request ``kind``, from the OpenEnv frame that answered it.

    Raises:
        CorralError: the server answered with an error frame (see
            :func:`error_from_openenv`), or a frame that is not the expected reply.
    """
    try:
        message = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise BadFrame(f"the OpenEnv server sent invalid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise BadMessage("the OpenEnv server sent a frame that is not an object")
    got = message.get("type")
    data = message.get("data")
    if got == "error":
        raise error_from_openenv(data if isinstance(data, Mapping) else {}, kind, request_id)
    expected = _EXPECTED.get(kind)
    if got != expected:
        raise BadMessage(
            f"expected an OpenEnv {expected!r} reply to {kind!r}, got {got!r}",
            details={"expected": expected, "got": got},
            request_id=request_id,
        )
    if got == "state":
        if not isinstance(data, Mapping):
            raise BadMessage("an OpenEnv state reply must carry an object", request_id=request_id)
        return m.StateReply(request_id, session, dict(data)).to_wire()
    return m.Result(request_id, session, unflatten_observation(data)).to_wire()


_FROM_OPENENV: dict[str, type[CorralError]] = {
    OpenEnvCode.INVALID_JSON: BadFrame,
    OpenEnvCode.UNKNOWN_TYPE: UnknownType,
    OpenEnvCode.EXECUTION_ERROR: EnvError,
    OpenEnvCode.CAPACITY_REACHED: CapacityReached,
    OpenEnvCode.FACTORY_ERROR: FactoryError,
    OpenEnvCode.SESSION_ERROR: SessionLost,
}


def error_from_openenv(data: Mapping[str, Any], kind: str, request_id: int) -> CorralError:
    """The corral exception for an OpenEnv error frame's ``data`` answering ``kind``.

    A corral server's ``corral_code`` is honoured; otherwise VALIDATION_ERROR is
    INVALID_ACTION for a step, INVALID_ARGUMENT for a reset and BAD_MESSAGE else.
    """
    code = str(data.get("code", OpenEnvCode.EXECUTION_ERROR))
    message = str(data.get("message", code))
    details: dict[str, Any] = {"openenv_code": code}
    for key in ("errors", "active_sessions", "max_sessions", "factory_name"):
        if key in data:
            details[key] = data[key]
    if isinstance(data.get("details"), Mapping):
        details.update(data["details"])
    corral_code = data.get("corral_code")
    if isinstance(corral_code, str):
        return error_from_wire(
            {"code": corral_code, "message": message, "details": details}, request_id
        )
    if code == OpenEnvCode.VALIDATION_ERROR:
        cls: type[CorralError] = {"step": InvalidAction, "reset": InvalidArgument}.get(
            kind, BadMessage
        )
    else:
        cls = _FROM_OPENENV.get(code, EnvError)
    return cls(message, details=details, request_id=request_id)

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
FRAME_TOO_LARGE, BATCH_TOO_LARGE,                  (+ ``errors``)
REQUEST_ID_REUSED, BAD_SNAPSHOT
RESET_REQUIRED, EPISODE_ENDED, SESSION_BUSY,       EXECUTION_ERROR       kept
ENV_ERROR, BAD_OBSERVATION, INTERNAL_ERROR,
SNAPSHOT_UNSUPPORTED, SNAPSHOT_TOO_LARGE, ...
CAPACITY_REACHED, NOT_READY                        CAPACITY_REACHED      closed (1000)
                                                   (+ ``active_sessions``, ``max_sessions``)
FACTORY_ERROR                                      FACTORY_ERROR         closed (1000)
STEP_TIMEOUT, SESSION_LOST, UNKNOWN_SESSION,       SESSION_ERROR         closed (1000)
SESSION_ELSEWHERE, ...
=================================================  ====================  ==============

One module (~600 lines) because the envelope's two directions and its error table are one
translation that both the server routes and the fallback client use.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    SnapshotUnsupported,
    UnknownType,
    UnsupportedProtocol,
    error_from_wire,
    validation_errors,
    validation_message,
)
from corral.protocol import messages as m
from corral.protocol.fields import MESSAGE_CHARS, clip, echo

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
    _E.REQUEST_ID_REUSED: _O.VALIDATION_ERROR,
    _E.HANDSHAKE_REQUIRED: _O.SESSION_ERROR,
    _E.UNSUPPORTED_PROTOCOL: _O.SESSION_ERROR,
    _E.CONTRACT_MISMATCH: _O.SESSION_ERROR,
    _E.UNAUTHORIZED: _O.SESSION_ERROR,
    _E.FORBIDDEN: _O.SESSION_ERROR,
    _E.CAPACITY_REACHED: _O.CAPACITY_REACHED,
    _E.NOT_READY: _O.CAPACITY_REACHED,
    _E.TOO_MANY_SESSIONS: _O.CAPACITY_REACHED,
    _E.TOO_MANY_CONNECTIONS: _O.CAPACITY_REACHED,
    _E.UNKNOWN_SESSION: _O.SESSION_ERROR,
    _E.SESSION_LOST: _O.SESSION_ERROR,
    _E.SESSION_ELSEWHERE: _O.SESSION_ERROR,
    _E.RESET_REQUIRED: _O.EXECUTION_ERROR,
    _E.EPISODE_ENDED: _O.EXECUTION_ERROR,
    _E.SESSION_BUSY: _O.EXECUTION_ERROR,
    _E.SNAPSHOT_UNSUPPORTED: _O.EXECUTION_ERROR,
    _E.SNAPSHOT_TOO_LARGE: _O.EXECUTION_ERROR,
    _E.BAD_SNAPSHOT: _O.VALIDATION_ERROR,
    _E.INVALID_ACTION: _O.VALIDATION_ERROR,
    _E.INVALID_ARGUMENT: _O.VALIDATION_ERROR,
    _E.ENV_ERROR: _O.EXECUTION_ERROR,
    _E.FACTORY_ERROR: _O.FACTORY_ERROR,
    _E.BAD_OBSERVATION: _O.EXECUTION_ERROR,
    _E.REPLY_TOO_LARGE: _O.EXECUTION_ERROR,
    _E.STEP_TIMEOUT: _O.SESSION_ERROR,
    _E.INTERNAL_ERROR: _O.EXECUTION_ERROR,
    _E.REQUEST_TIMEOUT: _O.EXECUTION_ERROR,
    _E.CONNECTION_LOST: _O.SESSION_ERROR,
    _E.CLIENT_CLOSED: _O.SESSION_ERROR,
    # Local families, never sent; mapped like the client-side codes above, for totality.
    _E.USAGE_ERROR: _O.EXECUTION_ERROR,
    _E.PLATFORM_ERROR: _O.EXECUTION_ERROR,
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
    details = dict(echo(exc.details))
    data: dict[str, Any] = {"message": clip(exc.message, MESSAGE_CHARS), "code": str(code)}
    if code is OpenEnvCode.VALIDATION_ERROR:
        errors = details.pop("errors", None)
        if not isinstance(errors, list):
            loc = [details["field"]] if isinstance(details.get("field"), str) else []
            errors = [{"type": str(exc.code).lower(), "loc": loc, "msg": data["message"]}]
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


def peer_error(message: str, code: OpenEnvCode, **extra: Any) -> dict[str, Any]:
    """An error frame exactly as OpenEnv's server sends it (no corral keys)."""
    return {"type": "error", "data": {"message": message, "code": str(code), **extra}}


class PeerRuntime(Protocol):
    """An installed OpenEnv release's semantics for one served OpenEnv environment.

    Provided by :class:`corral.adapters.openenv_env.OpenEnvRuntime`; the server's OpenEnv
    routes use it so that an OpenEnv environment answers exactly as under OpenEnv's own
    server of the same release.
    """

    env_name: str
    version: str
    nested_metadata: bool
    ws_models: dict[str, type[BaseModel]]
    reset_request: type[BaseModel]
    step_request: type[BaseModel]
    own_routes: list[Any]
    """The app's own routes (a custom ``/web`` page...), served beside OpenEnv's."""

    def serialize(self, observation: Any) -> dict[str, Any]:
        """OpenEnv's flattened observation."""
        ...

    def deserialize_action(self, data: dict[str, Any]) -> Any:
        """OpenEnv's action from a JSON object (raises pydantic's ValidationError)."""
        ...

    def jsonable(self, value: Any) -> Any:
        """OpenEnv's ``_make_json_serializable``."""
        ...

    def rpc_request(self, payload: Any) -> Any:
        """OpenEnv's ``JsonRpcRequest`` (raises on an invalid request)."""
        ...

    def rpc_success(self, request_id: Any, result: Any) -> dict[str, Any]:
        """OpenEnv's JSON-RPC success response."""
        ...

    def rpc_error(
        self, code: int, message: str | None, request_id: Any = None, data: Any = None
    ) -> dict[str, Any]:
        """OpenEnv's JSON-RPC error response."""
        ...

    def reset_observation_schema(self) -> dict[str, Any] | None:
        """``GET /schema``'s ``reset_observation`` under a release that publishes one
        (0.10): the reset observation model's schema, or None when it is the observation
        model (the contract's observation schema then stands for it) or the release
        publishes none."""
        ...

    @property
    def publishes_reset_observation(self) -> bool:
        """The release's ``/schema`` has a ``reset_observation`` (0.10)."""
        ...

    def http_reply(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        """OpenEnv's HTTP ``/reset`` or ``/step`` response body."""
        ...

    def task_request(self, name: str) -> type[BaseModel]:
        """The Task API request model of route ``name``."""
        ...

    def http_state(self, data: dict[str, Any]) -> dict[str, Any]:
        """OpenEnv's ``GET /state`` body for a state."""
        ...

    def metadata(self) -> dict[str, Any]:
        """OpenEnv's ``GET /metadata`` body."""
        ...

    @property
    def has_task_api(self) -> bool:
        """The release serves the Task API routes."""
        ...

    def normalize_split(self, split: Any) -> dict[str, Any]:
        """OpenEnv's split shape."""
        ...


def envelope(kind: str, data: Any = None) -> dict[str, Any]:
    """The OpenEnv frame ``{"type": kind, "data": data}`` (no ``data`` when None: ``state``
    and ``close`` requests carry none)."""
    return {"type": kind} if data is None else {"type": kind, "data": data}


def mcp_frame(response: dict[str, Any]) -> dict[str, Any]:
    """The OpenEnv frame carrying a JSON-RPC response."""
    return envelope("mcp", response)


# -- observations ------------------------------------------------------------------

LIFTED_KEYS = ("reward", "done", "metadata", "truncated", "reward_components")
"""Observation fields that OpenEnv carries beside the observation rather than inside it."""


def flatten_observation(
    observation: Mapping[str, Any], *, nested_metadata: bool = False
) -> dict[str, Any]:
    """OpenEnv's reply ``data`` for an observation's wire object.

    ``{"observation": <fields but the lifted ones>, "reward", "done", "metadata",
    "truncated"}``: OpenEnv clients read the first three; ``metadata`` is where OpenEnv
    0.10 puts it (top-level); ``truncated`` is corral's (OpenEnv clients ignore it), and so
    is ``reward_components``, there only when the observation has some (inside the
    observation it would break OpenEnv's typed clients, whose models forbid unknown
    fields). With ``nested_metadata`` (OpenEnv 0.10's layout) ``metadata`` also stays
    inside ``observation``; 0.3's typed clients pass ``metadata=`` beside the
    observation's fields, so they must not get it there.
    """
    lifted = (
        LIFTED_KEYS if not nested_metadata else tuple(k for k in LIFTED_KEYS if k != "metadata")
    )
    flat = {
        "observation": {k: v for k, v in observation.items() if k not in lifted},
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
class OpenEnvClose:
    """An OpenEnv ``close``: end the session, send nothing, close the socket with 1000."""


@dataclass(frozen=True, slots=True)
class McpMessage:
    """An OpenEnv ``mcp`` frame: its JSON-RPC payload, still to be parsed."""

    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolStep:
    """A ``step`` carrying OpenEnv's ``ListToolsAction`` / ``CallToolAction`` to an
    environment whose own action is no tool action: answered from its ``@tool`` methods.

    OpenEnv 0.3's ``MCPToolClient`` lists and calls tools this way (as step actions),
    which an OpenEnv ``MCPEnvironment`` answers; a corral environment with tools answers
    the same, through the JSON-RPC request :attr:`rpc` stands for.
    """

    rpc: dict[str, Any]
    tool_name: str | None
    """The tool called, None for ``list_tools``."""


Inbound = Call | OpenEnvClose | McpMessage | ToolStep

TOOL_ACTIONS = frozenset({"list_tools", "call_tool"})
"""The ``type`` values of OpenEnv's MCP tool actions."""


def tool_step(action: Mapping[str, Any]) -> ToolStep | None:
    """The :class:`ToolStep` a step's action stands for, or None for any other action."""
    kind = action.get("type")
    if kind == "list_tools":
        return ToolStep({"jsonrpc": "2.0", "id": 0, "method": "tools/list"}, None)
    if kind != "call_tool":
        return None
    name = action.get("tool_name")
    arguments = action.get("arguments", {})
    params = {"name": name, "arguments": arguments}
    return ToolStep(
        {"jsonrpc": "2.0", "id": 0, "method": "tools/call", "params": params},
        name if isinstance(name, str) else "",
    )


def tool_step_observation(step: ToolStep, response: Mapping[str, Any]) -> dict[str, Any]:
    """The observation OpenEnv's ``MCPEnvironment`` gives for ``step``, from the JSON-RPC
    ``response`` to :attr:`ToolStep.rpc`: ``ListToolsObservation`` (tools as ``name``,
    ``description``, ``input_schema``) or ``CallToolObservation`` (``tool_name``,
    ``result``, ``error`` with OpenEnv's ``error_type``)."""
    base: dict[str, Any] = {"done": False, "reward": None, "metadata": {}}
    error = response.get("error")
    result = response.get("result")
    if step.tool_name is None:
        tools = result.get("tools", []) if isinstance(result, dict) else []
        listed = [
            {
                "name": t.get("name", ""),
                "description": t.get("description") or "",
                "input_schema": t.get("inputSchema", {}),
            }
            for t in tools
        ]
        return {**base, "tools": listed}
    if isinstance(error, dict):
        message = str(error.get("message", ""))
        kind = "tool_not_found" if message.startswith("Unknown tool") else "invalid_args"
        if error.get("code") not in (-32602,):
            kind = "execution_error"
        return {
            **base,
            "tool_name": step.tool_name,
            "result": None,
            "error": {"error_type": kind, "message": message},
        }
    if isinstance(result, dict) and result.get("isError"):
        content = result.get("content") or [{}]
        return {
            **base,
            "tool_name": step.tool_name,
            "result": None,
            "error": {"error_type": "execution_error", "message": content[0].get("text", "")},
        }
    return {**base, "tool_name": step.tool_name, "result": result, "error": None}


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
        tool_actions: a step whose action is OpenEnv's ``list_tools`` / ``call_tool`` is a
            :class:`ToolStep` (the environment has tools, and its action model no ``type``).
    """

    def __init__(
        self,
        session: str,
        *,
        reset_options: frozenset[str] | None,
        action_fields: frozenset[str],
        max_frame_bytes: int,
        tool_actions: bool = False,
    ) -> None:
        self.session = session
        self.tool_actions = tool_actions
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
                validation_message(f"invalid {kind!r} message", exc),
                details={"errors": validation_errors(exc)},
            ) from None
        if isinstance(envelope, _CloseFrame):
            return OpenEnvClose()
        if isinstance(envelope, _McpFrame):
            return McpMessage(envelope.data)
        if isinstance(envelope, _StepFrame) and self.tool_actions:
            step = tool_step(envelope.data)
            if step is not None:
                return step
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

    def tool_reply(
        self, step: ToolStep, response: Mapping[str, Any], *, nested_metadata: bool = False
    ) -> dict[str, Any]:
        """The OpenEnv frame for a :class:`ToolStep`, given its JSON-RPC ``response``."""
        observation = tool_step_observation(step, response)
        data = flatten_observation(observation, nested_metadata=nested_metadata)
        return {"type": "observation", "data": data}

    def reply(self, message: Mapping[str, Any], *, nested_metadata: bool = False) -> dict[str, Any]:
        """The OpenEnv frame for corral's reply to a :class:`Call`.

        Raises:
            ValueError: ``message`` is not a reply to reset/step/state.
        """
        kind = message.get("type")
        if kind == "result":
            data = flatten_observation(message["observation"], nested_metadata=nested_metadata)
            return {"type": "observation", "data": data}
        if kind == "state":
            return {"type": "state", "data": message["state"]}
        if kind == "error":
            return error_frame(error_from_wire(dict(message)))
        raise ValueError(f"no OpenEnv form for a corral {kind!r} reply")


# -- client side: corral requests out as OpenEnv frames, OpenEnv replies back in ----

CLIENT_REQUESTS = frozenset({"reset", "step", "state", "close"})
"""The corral requests that have an OpenEnv form."""


def client_frame(message: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenEnv frame for a corral ``reset``/``step``/``state``/``close`` request.

    Raises:
        UnsupportedProtocol: the request has no OpenEnv form (attach, batches, ...).
        SnapshotUnsupported: a ``snapshot`` or ``restore`` (the envelope has none).
        BadMessage: a step's action is not an object.
    """
    kind = message.get("type")
    if kind == "reset":
        data = dict(message.get("options") or {})
        task = message.get("task")
        if isinstance(task, Mapping):  # OpenEnv 0.10 chooses a task by these options
            data.update(split=task.get("split"), index=task.get("index"))
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
    if kind in ("snapshot", "restore"):
        raise SnapshotUnsupported(
            f"{kind!r} is not available over the OpenEnv envelope, which has no snapshots: "
            "connect to a corral server with corral's protocol to snapshot and restore",
            details={"protocol": PROTOCOL_NAME, "request": kind},
        )
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

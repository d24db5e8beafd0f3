"""OpenEnv's HTTP routes: ``POST /reset``, ``POST /step``, ``GET /state``, ``POST /mcp``.

Stateless by default, as in OpenEnv: each call opens a fresh session (a fresh
environment instance, counted against capacity), runs, and closes it.

* ``POST /reset`` (body ``{"seed"?, "episode_id"?, <reset options>}``, may be empty)
  returns the first observation, flattened: ``{"observation", "reward", "done",
  "metadata", "truncated"}``.
* ``POST /step`` (body ``{"action": {...}, "timeout_s"?, "request_id"?}``) returns
  the first step of a fresh episode: corral resets the fresh instance (default
  options) before stepping it, where OpenEnv steps a never-reset instance.
  ``timeout_s`` and ``request_id`` are accepted for OpenEnv compatibility; the server's
  step timeout applies.
* ``GET /state`` returns a fresh instance's state.
* ``POST /mcp`` answers JSON-RPC 2.0 (always HTTP 200): ``tools/list``, ``tools/call``
  (on a fresh instance unless ``params.session_id`` names a session), and OpenEnv's
  ``openenv/session/create`` / ``openenv/session/close``.

**Stateful HTTP sessions (a corral extension).** ``POST /sessions`` opens a session and
returns ``{"session_id"}``; send that id in the ``X-Corral-Session`` header to
``/reset``, ``/step``, ``/state`` and ``/mcp`` to run a multi-step episode over plain
HTTP; ``DELETE /sessions/{id}`` closes it. Such sessions obey the same lifecycle rules
as WebSocket sessions (``409`` ``RESET_REQUIRED`` for a step before reset), count
against capacity and are reaped when idle (then ``410`` ``SESSION_LOST``). Sessions
made with ``openenv/session/create`` are the same sessions.

Errors are JSON ``{"detail", "code", "message", "details"}`` with ``code`` corral's
error code: ``422`` for invalid input (``detail`` is the validation error list, as
FastAPI's), ``409`` for lifecycle errors, ``404``/``410`` for unknown/lost sessions,
``503`` + ``Retry-After`` when full, ``504`` for a step timeout, ``500`` when the
environment raised.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from corral.errors import CorralError, ErrorCode, SessionLost, UnknownSession, error_from_wire
from corral.protocol.jsonrpc import (
    CallTool,
    CloseRpcSession,
    CreateSession,
    ListTools,
    RpcCode,
    RpcError,
    parse_rpc_bytes,
    plan_rpc,
    rpc_error,
    rpc_result,
    tools_list_result,
)
from corral.protocol.openenv import Call, envelope, flatten_observation
from corral.server.http import error_response as http_error
from corral.server.openenv_link import LinkRegistry, LockstepLink, PeerLink, client_address
from corral.server.openenv_peer_http import mcp_transport_request, peer_router
from corral.server.openenv_ws import registry_of, serve_mcp_socket
from corral.server.service import EnvService

SESSION_HEADER = "X-Corral-Session"
"""The header naming the stateful HTTP session a request addresses."""

_HTTP_STATUS: dict[str, int] = {
    ErrorCode.BAD_FRAME: 400,
    ErrorCode.BAD_MESSAGE: 422,
    ErrorCode.INVALID_ACTION: 422,
    ErrorCode.INVALID_ARGUMENT: 422,
    ErrorCode.FRAME_TOO_LARGE: 413,
    ErrorCode.RESET_REQUIRED: 409,
    ErrorCode.EPISODE_ENDED: 409,
    ErrorCode.SESSION_BUSY: 409,
    ErrorCode.UNKNOWN_SESSION: 404,
    ErrorCode.SESSION_LOST: 410,
    ErrorCode.CAPACITY_REACHED: 503,
    ErrorCode.TOO_MANY_SESSIONS: 503,
    ErrorCode.TOO_MANY_CONNECTIONS: 429,
    ErrorCode.STEP_TIMEOUT: 504,
}

SessionHeader = Annotated[
    str | None,
    Header(
        alias=SESSION_HEADER,
        description="Run on this stateful session (from POST /sessions) instead of a fresh one.",
    ),
]


class ResetBody(BaseModel):
    """``POST /reset``: OpenEnv's reset request (extra keys are reset options)."""

    # Strict: the OpenAPI document says "integer", so ``false`` is not a seed of 0.
    model_config = ConfigDict(extra="allow", strict=True)

    seed: int | None = Field(
        default=None, ge=0, le=2**63 - 1, description="Random seed for the episode."
    )
    episode_id: str | None = Field(
        default=None, max_length=255, description="An id for the episode (if the env takes one)."
    )


class StepBody(BaseModel):
    """``POST /step``: OpenEnv's step request."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: dict[str, Any] = Field(description="The action, as the /schema action schema says.")
    timeout_s: float | None = Field(
        default=None, gt=0, description="Accepted for OpenEnv; the server's step timeout applies."
    )
    request_id: str | None = Field(
        default=None, max_length=255, description="Accepted for OpenEnv; not used."
    )


class ObservationReply(BaseModel):
    """A flattened observation, OpenEnv's reset/step response (plus corral's extras)."""

    observation: dict[str, Any]
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    truncated: bool = False


class ErrorReply(BaseModel):
    """An error answer of these routes; ``code`` is corral's stable error code.

    A body the web framework cannot even parse gets its plain ``{"detail"}`` (400).
    """

    detail: Any = Field(description="The message, or the validation errors for a 422.")
    code: str | None = None
    message: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)


_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorReply, "description": description}
    for status, description in [
        (400, "The request could not be read."),
        (404, "No such session."),
        (409, "The session's lifecycle does not allow this now (e.g. step before reset)."),
        (410, "The session is gone (reaped, timed out); the reason is in the message."),
        (413, "The request is larger than the server's frame limit."),
        (500, "The environment raised; the session stays usable."),
        (503, "The server is at capacity; retry after Retry-After seconds."),
        (504, "The environment overran the step timeout; the session was closed."),
    ]
}
"""Every status ``error_response`` can answer with, for the OpenAPI document."""


def lookup(registry: LinkRegistry, session_id: str) -> LockstepLink | PeerLink:
    """The live HTTP session ``session_id``.

    Raises:
        SessionLost: it existed and was closed or reaped (with the reason).
        UnknownSession: no HTTP session has that id.
    """
    link = registry.find(session_id)
    if link is not None:
        return link
    try:
        registry.service.manager.get(session_id, _NoOwner())
    except SessionLost:
        raise
    except CorralError:
        pass
    raise UnknownSession(
        f"no HTTP session {session_id!r}; open one with POST /sessions and send its "
        f"id in the {SESSION_HEADER} header",
        details={"session": session_id},
    )


class _NoOwner:
    """An owner no session has: looking a session up with it yields its tombstone."""

    def send(self, reply: object) -> None:
        """Never called."""


def error_response(exc: CorralError) -> JSONResponse:
    """The HTTP error response for ``exc`` (status by code, see the module docstring)."""
    status = _HTTP_STATUS.get(str(exc.code), 500)
    details = dict(exc.details)
    detail: Any = None  # the message (bounded), unless a 422 lists its errors
    if status == 422:
        # A 422's detail is always FastAPI's list of errors, as the OpenAPI document says.
        errors = details.get("errors")
        detail = (
            errors
            if isinstance(errors, list)
            else [{"type": str(exc.code), "loc": ["body"], "msg": exc.message}]
        )
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return http_error(exc, status, detail=detail, headers=headers)


def _reply_response(reply: dict[str, Any]) -> JSONResponse:
    kind = reply.get("type")
    if kind == "result":
        return JSONResponse(flatten_observation(reply["observation"]))
    if kind == "state":
        return JSONResponse(reply["state"])
    return error_response(error_from_wire(reply))


def openenv_router(service: EnvService) -> APIRouter:
    """OpenEnv's HTTP routes (and the ``/mcp`` WebSocket) for ``service``.

    An OpenEnv environment gets OpenEnv's own routes (:func:`peer_router`); a corral
    environment gets these, with corral's HTTP session routes.
    """
    registry = registry_of(service)
    if registry.runtime is not None:
        return peer_router(service, registry)
    tools = registry.tools
    router = APIRouter(tags=["OpenEnv"])

    async def exchange(link: LockstepLink, messages: list[dict[str, Any]]) -> JSONResponse:
        reply: dict[str, Any] = {}
        for message in messages:
            try:
                inbound = link.translator.parse(message)
            except CorralError as exc:
                link.count_error(str(exc.code))
                return error_response(exc)
            assert isinstance(inbound, Call)
            reply = await link.run(inbound.request)
            if reply.get("type") == "error":
                break
        return _reply_response(reply)

    async def run(messages: list[dict[str, Any]], session_id: str | None) -> JSONResponse:
        """Run ``messages`` (OpenEnv frames) on a session; answer with the last reply."""
        if session_id is not None:
            try:
                link = lookup(registry, session_id)
            except CorralError as exc:
                return error_response(exc)
            assert isinstance(link, LockstepLink)
            async with link.lock:
                return await exchange(link, messages)
        link = LockstepLink(service, tools, registry)
        try:
            await link.open()
        except CorralError as exc:
            service.manager.stats.error(str(exc.code))
            return error_response(exc)
        try:
            return await exchange(link, messages)
        finally:
            await link.close("stateless HTTP call finished")

    @router.post(
        "/reset",
        response_model=ObservationReply,
        responses=_ERROR_RESPONSES,
        summary="Reset the environment",
        description="Start an episode and return its first observation (stateless unless "
        f"the {SESSION_HEADER} header names a session).",
    )
    async def reset(
        body: Annotated[ResetBody, Body(default_factory=ResetBody)],
        x_corral_session: SessionHeader = None,
    ) -> JSONResponse:
        data = body.model_dump(exclude_unset=True)
        return await run([envelope("reset", data)], x_corral_session)

    @router.post(
        "/step",
        response_model=ObservationReply,
        responses=_ERROR_RESPONSES,
        summary="Execute an action",
        description="Apply an action. Stateless: the first step of a fresh episode; with the "
        f"{SESSION_HEADER} header: the next step of that session's episode.",
    )
    async def step(
        body: StepBody,
        x_corral_session: SessionHeader = None,
    ) -> JSONResponse:
        frame = envelope("step", body.action)
        if x_corral_session is not None:
            return await run([frame], x_corral_session)
        return await run([envelope("reset", {}), frame], None)

    @router.get(
        "/state",
        responses=_ERROR_RESPONSES,
        summary="Get the environment state",
        description="A fresh instance's state (stateless), or the session's with the header.",
    )
    async def state(
        x_corral_session: SessionHeader = None,
    ) -> JSONResponse:
        return await run([envelope("state")], x_corral_session)

    @router.post(
        "/sessions",
        status_code=201,
        responses=_ERROR_RESPONSES,
        summary="Open a stateful HTTP session (corral extension)",
    )
    async def open_session(request: Request) -> JSONResponse:
        try:
            link = await registry.create(client_address(request))
        except CorralError as exc:
            service.manager.stats.error(str(exc.code))
            return error_response(exc)
        assert link.session is not None
        return JSONResponse({"session_id": link.session.id}, status_code=201)

    @router.delete(
        "/sessions/{session_id}",
        summary="Close a stateful HTTP session",
        responses=_ERROR_RESPONSES,
    )
    async def close_session(session_id: str) -> JSONResponse:
        try:
            lookup(registry, session_id)
        except CorralError as exc:
            return error_response(exc)
        outcome = await registry.close(session_id, "closed by the HTTP client")
        body: dict[str, Any] = {"session_id": session_id, "closed": outcome == "closed"}
        if outcome == "closing":
            body["closing"] = True
        return JSONResponse(body)

    @router.post(
        "/mcp",
        summary="MCP JSON-RPC 2.0",
        description="tools/list, tools/call, openenv/session/create, openenv/session/close. "
        "An MCP-transport request (initialize, Mcp-Session-Id) is answered by the "
        "streamable MCP endpoint when the server runs with --mcp.",
    )
    async def mcp(
        request: Request,
        x_corral_session: SessionHeader = None,
    ) -> Response:
        body = await request.body()
        handover = await mcp_transport_request(request, body)
        if handover is not None:
            return handover
        return JSONResponse(await answer_mcp(body, x_corral_session, client_address(request)))

    @router.websocket("/mcp")
    async def mcp_socket(websocket: WebSocket) -> None:
        await serve_mcp_socket(websocket, registry)

    async def answer_mcp(body: bytes, header_session: str | None, address: str) -> dict[str, Any]:
        try:
            plan = plan_rpc(parse_rpc_bytes(body), tools, service.contract.name)
        except RpcError as exc:
            return exc.response()
        if isinstance(plan, ListTools):
            return rpc_result(plan.id, tools_list_result(tools))
        if isinstance(plan, CreateSession):
            try:
                link = await registry.create(address)
            except CorralError as exc:
                return _rpc_failure(plan.id, exc)
            assert link.session is not None
            return rpc_result(plan.id, {"session_id": link.session.id})
        if isinstance(plan, CloseRpcSession):
            outcome = await registry.close(plan.session_id, "closed over MCP")
            if outcome == "unknown":
                message = f"Unknown session_id: {plan.session_id}"
                return rpc_error(plan.id, RpcCode.INVALID_PARAMS, message)
            result: dict[str, Any] = {"session_id": plan.session_id, "closed": outcome == "closed"}
            if outcome == "closing":
                result["closing"] = True
            return rpc_result(plan.id, result)
        assert isinstance(plan, CallTool)
        session_id = plan.session_id or header_session
        if session_id is not None:
            try:
                found = lookup(registry, session_id)
            except CorralError as exc:
                return rpc_error(plan.id, RpcCode.INVALID_PARAMS, exc.message)
            assert isinstance(found, LockstepLink)
            async with found.lock:
                return await found.call_tool(plan)
        link = LockstepLink(service, tools, registry)
        try:
            await link.open()
        except CorralError as exc:
            return _rpc_failure(plan.id, exc)
        try:
            return await link.call_tool(plan)
        finally:
            await link.close("stateless MCP call finished")

    return router


def _rpc_failure(request_id: Any, exc: CorralError) -> dict[str, Any]:
    data = {"corral_code": str(exc.code), **exc.details}
    return rpc_error(request_id, RpcCode.SERVER_ERROR, exc.message, data)

"""OpenEnv's HTTP routes, each defined once and answered by the server's personality.

``POST /reset``, ``POST /step``, ``GET /state``, ``POST /mcp`` and the ``/mcp`` WebSocket
are OpenEnv's; ``POST /sessions`` and ``DELETE /sessions/{id}`` are corral's stateful HTTP
sessions (send the id in the ``X-Corral-Session`` header to ``/reset``, ``/step``,
``/state`` and ``/mcp`` to run a multi-step episode over plain HTTP; sessions made with
``openenv/session/create`` are the same sessions). What each answers depends on the
environment served, and is the :class:`~corral.server.openenv.personality.Personality`'s
business: these handlers only read the request and ask it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from corral.errors import CorralError
from corral.protocol.jsonrpc import RpcCode, rpc_error
from corral.server.bodies import with_body
from corral.server.http_errors import ERROR_RESPONSES, OPENENV_TAG, error_response
from corral.server.openenv.links import SESSION_HEADER, client_address, close_result
from corral.server.openenv.personality import Personality
from corral.server.openenv.sockets import serve_mcp_socket

STREAM_PATH = "/mcp/stream"
"""Where ``corral serve --mcp`` serves the MCP specification's streamable transport."""

SessionHeader = Annotated[
    str | None,
    Header(
        alias=SESSION_HEADER,
        description="Run on this stateful session (from POST /sessions) instead of a fresh one.",
    ),
]


async def mcp_transport_request(request: Request, body: bytes) -> Response | None:
    """Hand an MCP-transport request sent to ``/mcp`` to the streamable endpoint.

    OpenEnv's JSON-RPC dialect has no ``initialize`` and no ``Mcp-Session-Id``; an MCP
    SDK client sends both. With the endpoint mounted (``--mcp``) it answers; without, the
    client gets an error naming the right path. None: an OpenEnv-dialect request.
    """
    method = None
    payload: Any = None
    try:
        payload = json.loads(body)
        if isinstance(payload, dict):
            method = payload.get("method")
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    if method != "initialize" and "mcp-session-id" not in request.headers:
        return None
    endpoint = getattr(request.app.state, "mcp", None)
    if endpoint is not None:
        response: Response = await endpoint.post(request)
        return response
    message = (
        "Method not found: 'initialize': /mcp is OpenEnv's JSON-RPC route (tools/list, "
        "tools/call without a handshake). MCP clients connect to "
        f"{STREAM_PATH} of a server started with `corral serve --mcp`, or run "
        "`corral mcp TARGET` for stdio"
    )
    request_id = payload.get("id") if isinstance(payload, dict) else None
    return JSONResponse(rpc_error(request_id, RpcCode.METHOD_NOT_FOUND, message), 404)


def openenv_router(personality: Personality) -> APIRouter:
    """OpenEnv's HTTP routes (and the ``/mcp`` WebSocket), answered by ``personality``."""
    router = APIRouter(tags=[OPENENV_TAG])
    registry = personality.registry

    async def reset(body: BaseModel, x_corral_session: SessionHeader = None) -> Response:
        return await personality.reset(body, x_corral_session)

    async def step(body: BaseModel, x_corral_session: SessionHeader = None) -> Response:
        return await personality.step(body, x_corral_session)

    router.add_api_route(
        "/reset",
        with_body(reset, "body", personality.reset_body, optional=True),
        methods=["POST"],
        summary="Reset the environment",
        **personality.route_docs("reset"),
    )
    router.add_api_route(
        "/step",
        with_body(step, "body", personality.step_body),
        methods=["POST"],
        summary="Execute an action",
        **personality.route_docs("step"),
    )

    @router.get("/state", summary="Get the environment state", **personality.route_docs("state"))
    async def state(x_corral_session: SessionHeader = None) -> Response:
        return await personality.state(x_corral_session)

    @router.post(
        "/sessions",
        status_code=201,
        responses=ERROR_RESPONSES,
        summary="Open a stateful HTTP session (corral extension)",
    )
    async def open_session(request: Request) -> JSONResponse:
        try:
            link = await registry.create(client_address(request))
        except CorralError as exc:
            personality.service.manager.stats.error(str(exc.code))
            return error_response(exc)
        assert link.session is not None
        return JSONResponse({"session_id": link.session.id}, status_code=201)

    @router.delete(
        "/sessions/{session_id}",
        summary="Close a stateful HTTP session",
        responses=ERROR_RESPONSES,
    )
    async def close_session(session_id: str) -> JSONResponse:
        try:
            registry.lookup(session_id)
        except CorralError as exc:
            return error_response(exc)
        outcome = await registry.close(session_id, "closed by the HTTP client")
        return JSONResponse(close_result(session_id, outcome))

    @router.post(
        "/mcp",
        summary="MCP JSON-RPC 2.0",
        description="tools/list, tools/call, openenv/session/create, openenv/session/close. "
        "An MCP-transport request (initialize, Mcp-Session-Id) is answered by the "
        "streamable MCP endpoint when the server runs with --mcp.",
    )
    async def mcp(request: Request, x_corral_session: SessionHeader = None) -> Response:
        body = await request.body()
        handover = await mcp_transport_request(request, body)
        if handover is not None:
            return handover
        answer = await personality.mcp(body, x_corral_session, client_address(request))
        return JSONResponse(answer)

    @router.websocket("/mcp")
    async def mcp_socket(websocket: WebSocket) -> None:
        await serve_mcp_socket(websocket, personality)

    return router


__all__ = ["STREAM_PATH", "mcp_transport_request", "openenv_router"]

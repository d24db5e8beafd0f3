"""Deliberately broken servers, for ``corral validate`` to catch.

* :func:`unflattened_app`: a corral server whose OpenEnv ``/ws`` forgets to flatten
  observations and reports bad JSON with the wrong code.
* :func:`sloppy_app`: an OpenEnv look-alike with a wrong health body, a 2.x OpenAPI
  version, no state schema, and a ``/ws`` that hangs up on any unknown message.
* :func:`bad_corral_app`: speaks corral's subprotocol but its welcome lacks the protocol
  and fingerprint, and its errors do not echo request ids.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.envs.echo import EchoEnv
from corral.server import create_app

ECHO_SCHEMA = {
    "type": "object",
    "properties": {"message": {"type": "string", "minLength": 1}},
    "required": ["message"],
    "additionalProperties": False,
}
OBS_SCHEMA = {
    "type": "object",
    "properties": {
        "echoed": {"type": "string"},
        "reward": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "done": {"type": "boolean"},
    },
}


async def _unflattened_ws(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            raw = await websocket.receive_text()
            try:
                message = json.loads(raw)
            except json.JSONDecodeError:
                reply: dict[str, Any] = {
                    "type": "error",
                    "data": {"message": "bad", "code": "EXECUTION_ERROR"},
                }
            else:
                kind = message.get("type")
                if kind == "close":
                    await websocket.close(1000)
                    return
                if kind in ("reset", "step"):
                    reply = {
                        "type": "observation",
                        "data": {"echoed_message": "x", "reward": 0.0, "done": False},
                    }
                elif kind == "state":
                    reply = {"type": "state", "data": {"step_count": 0}}
                else:
                    reply = {
                        "type": "error",
                        "data": {"message": "?", "code": "UNKNOWN_TYPE"},
                    }
            await websocket.send_text(json.dumps(reply))
    except WebSocketDisconnect:
        return


def unflattened_app() -> Any:
    """corral's echo server with a broken OpenEnv ``/ws`` fallback."""
    return create_app(EchoEnv, fallback=_unflattened_ws)


async def _sloppy_ws(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            message = json.loads(await websocket.receive_text())
            if message.get("type") == "state":
                await websocket.send_text(json.dumps({"type": "state", "data": {"step_count": 0}}))
            elif message.get("type") in ("reset", "step"):
                data = {"observation": {"echoed": "x"}, "reward": None, "done": False}
                await websocket.send_text(json.dumps({"type": "observation", "data": data}))
            else:
                await websocket.close(1011)
                return
    except (WebSocketDisconnect, json.JSONDecodeError):
        return


def sloppy_app() -> Any:
    """An OpenEnv look-alike that breaks the HTTP shapes and drops sessions on errors."""

    async def openapi(_: Any) -> JSONResponse:
        paths = {p: {} for p in ("/reset", "/step", "/state", "/health")}
        return JSONResponse({"openapi": "3.1.0", "info": {"version": "2.0.0"}, "paths": paths})

    async def health(_: Any) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def metadata(_: Any) -> JSONResponse:
        return JSONResponse({"name": "sloppy", "description": "breaks things"})

    async def schema(_: Any) -> JSONResponse:
        return JSONResponse({"action": ECHO_SCHEMA, "observation": OBS_SCHEMA})

    async def observation(_: Any) -> JSONResponse:
        return JSONResponse({"observation": {"echoed": "x"}, "reward": None, "done": False})

    async def state(_: Any) -> JSONResponse:
        return JSONResponse({"step_count": 0})

    async def mcp(_: Any) -> JSONResponse:
        return JSONResponse(
            {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "x"}}
        )

    return Starlette(
        routes=[
            Route("/openapi.json", openapi),
            Route("/health", health),
            Route("/metadata", metadata),
            Route("/schema", schema),
            Route("/reset", observation, methods=["POST"]),
            Route("/step", observation, methods=["POST"]),
            Route("/state", state),
            Route("/mcp", mcp, methods=["POST"]),
            WebSocketRoute("/ws", _sloppy_ws),
        ]
    )


async def _bad_corral_ws(websocket: WebSocket) -> None:
    if "corral.v1.json" not in websocket.scope.get("subprotocols", []):
        await websocket.close(1008)
        return
    await websocket.accept(subprotocol="corral.v1.json")
    try:
        while True:
            raw = await websocket.receive_text()
            try:
                message = json.loads(raw)
            except json.JSONDecodeError:
                message = {}
            if message.get("type") == "hello":
                reply = {"type": "welcome", "id": message.get("id"), "server": {}, "env": {}}
            else:
                reply = {"type": "error", "code": "BAD_MESSAGE", "message": "no", "details": {}}
            await websocket.send_text(json.dumps(reply))
    except WebSocketDisconnect:
        return


def bad_corral_app() -> Any:
    """A server on corral's subprotocol that breaks the handshake and the error replies."""

    async def openapi(_: Any) -> JSONResponse:
        return JSONResponse({"openapi": "3.1.0", "info": {"version": "1.0.0"}, "paths": {}})

    async def health(_: Any) -> JSONResponse:
        return JSONResponse({"status": "healthy"})

    async def metadata(_: Any) -> JSONResponse:
        return JSONResponse({"name": "bad", "description": "bad corral"})

    async def schema(_: Any) -> JSONResponse:
        return JSONResponse({"action": ECHO_SCHEMA, "observation": OBS_SCHEMA, "state": {}})

    return Starlette(
        routes=[
            Route("/openapi.json", openapi),
            Route("/health", health),
            Route("/metadata", metadata),
            Route("/schema", schema),
            WebSocketRoute("/ws", _bad_corral_ws),
        ]
    )

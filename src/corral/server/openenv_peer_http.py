"""OpenEnv's HTTP routes for an OpenEnv environment, answered as OpenEnv's server does.

For an environment served through :mod:`corral.adapters.openenv_env` the routes take
the installed OpenEnv release's request and response models (so FastAPI validates and
reports bodies exactly as under OpenEnv's server) and keep its semantics:

* ``POST /reset`` / ``POST /step`` / ``GET /state`` are stateless: each runs on a fresh
  instance (``/step`` on a never-reset one), closed afterwards; an environment error is
  HTTP 500 ``Internal Server Error``; an invalid action 422 ``{"detail": errors}``. With
  corral's ``X-Corral-Session`` header they run on that stateful session instead.
* ``GET /schema`` / ``GET /metadata``: OpenEnv's bodies (0.10 adds ``reset_observation``).
* ``POST /mcp``: OpenEnv's JSON-RPC handler (``openenv/session/create|close``, tools of an
  ``MCPEnvironment``, 0.10's fallback to step-based tool actions); ``/mcp`` WebSocket.
* the Task API of OpenEnv 0.10 (``/list_environments``, ``/{env}/splits``, ``/{env}/tasks``,
  ``/{env}/num_tasks``, ``/{env}/task``, ``/{env}/task_range``), answered by the
  environment's own task methods, when the installed release has it.

This module does not use postponed annotations: the routes' body types are the installed
release's classes, given to FastAPI at run time.
"""

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Body, Header, HTTPException, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError

from corral.errors import CorralError, ErrorCode
from corral.protocol.jsonrpc import RpcCode, rpc_error
from corral.protocol.openenv import PeerRuntime
from corral.server.openenv_link import (
    LinkRegistry,
    PeerLink,
    capacity_message,
    client_address,
    to_json,
)
from corral.server.runner import EnvRunner
from corral.server.service import EnvService

STREAM_PATH = "/mcp/stream"
"""Where ``corral serve --mcp`` serves the MCP specification's streamable transport."""


async def mcp_transport_request(request: Request, body: bytes) -> Response | None:
    """Hand an MCP-transport request sent to ``/mcp`` to the streamable endpoint.

    OpenEnv's JSON-RPC dialect has no ``initialize`` and no ``Mcp-Session-Id``; an MCP
    SDK client sends both. With the endpoint mounted (``--mcp``) it answers; without, the
    client gets an error naming the right path. None: an OpenEnv-dialect request.
    """
    method = None
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


class _Fresh:
    """One environment instance for one stateless call (OpenEnv builds and closes one)."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self.runner: EnvRunner | None = None

    async def __aenter__(self) -> "_Fresh":
        manager = self.service.manager
        self.runner = await EnvRunner.create(
            manager.factory,
            manager.executor,
            thread_affinity=self.service.env_type.thread_affinity,
            timeout=self.service.config.step_timeout_s,
        )
        return self

    async def call(self, method: str, *args: Any) -> Any:
        assert self.runner is not None
        return await self.runner.call(method, *args, timeout=self.service.config.step_timeout_s)

    async def __aexit__(self, *exc: object) -> None:
        if self.runner is not None:
            await self.runner.close()


def _with_body(
    handler: Callable[..., Awaitable[Any]], name: str, model: type[BaseModel], default: bool
) -> Callable[..., Awaitable[Any]]:
    """``handler`` with a body parameter of the run-time type ``model`` (for FastAPI)."""
    body = Body(default_factory=model) if default else Body()
    # Last: a body's default (Body()) may not precede a parameter without one.
    params = [
        *list(inspect.signature(handler).parameters.values())[1:],
        inspect.Parameter(
            name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=body, annotation=model
        ),
    ]
    handler.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return handler


def peer_router(service: EnvService, registry: LinkRegistry) -> APIRouter:
    """OpenEnv's routes for the OpenEnv environment ``service`` serves."""
    runtime = registry.runtime
    assert runtime is not None
    router = APIRouter(tags=["OpenEnv"])
    session_header = Header(default=None, alias="X-Corral-Session")

    def session_link(session_id: str) -> PeerLink:
        link = registry.find(session_id)
        if not isinstance(link, PeerLink):
            raise HTTPException(404, f"no HTTP session {session_id!r}")
        return link

    async def reset(request: Any, x_corral_session: str | None = session_header) -> Any:
        data = request.model_dump(exclude_unset=True)
        try:
            if x_corral_session is not None:
                link = session_link(x_corral_session)
                async with link.lock:
                    result = await link.call("openenv_reset", data)
            else:
                async with _Fresh(service) as env:
                    result = await env.call("openenv_reset", data)
            return JSONResponse(runtime.http_reply("reset", to_json(result)))
        except HTTPException:
            raise
        except Exception:
            return PlainTextResponse("Internal Server Error", status_code=500)

    async def step(request: Any, x_corral_session: str | None = session_header) -> Any:
        try:
            action = runtime.deserialize_action(request.action)
        except ValidationError as exc:
            return JSONResponse({"detail": to_json(exc.errors())}, status_code=422)
        kwargs = request.model_dump(exclude_unset=True, exclude={"action"})
        try:
            if x_corral_session is not None:
                link = session_link(x_corral_session)
                async with link.lock:
                    result = await link.call("openenv_step", action, kwargs)
            else:
                async with _Fresh(service) as env:
                    result = await env.call("openenv_step", action, kwargs)
            return JSONResponse(runtime.http_reply("step", to_json(result)))
        except HTTPException:
            raise
        except Exception:
            return PlainTextResponse("Internal Server Error", status_code=500)

    router.add_api_route(
        "/reset",
        _with_body(reset, "request", runtime.reset_request, default=True),
        methods=["POST"],
        summary="Reset the environment",
    )
    router.add_api_route(
        "/step",
        _with_body(step, "request", runtime.step_request, default=False),
        methods=["POST"],
        summary="Execute an action in the environment",
    )

    @router.get("/state", summary="Get current environment state")
    async def state(x_corral_session: str | None = session_header) -> Any:
        try:
            if x_corral_session is not None:
                link = session_link(x_corral_session)
                async with link.lock:
                    data = await link.call("openenv_state")
            else:
                async with _Fresh(service) as env:
                    data = await env.call("openenv_state")
            return JSONResponse(runtime.http_state(to_json(data)))
        except HTTPException:
            raise
        except Exception:
            return PlainTextResponse("Internal Server Error", status_code=500)

    @router.get("/schema", summary="Get all JSON schemas")
    async def schema() -> Any:
        return runtime.schema()

    @router.get("/metadata", summary="Get environment metadata")
    async def metadata() -> Any:
        try:
            return JSONResponse(await asyncio.to_thread(runtime.metadata))
        except Exception:
            return PlainTextResponse("Internal Server Error", status_code=500)

    @router.post("/mcp", summary="MCP JSON-RPC endpoint")
    async def mcp(request: Request) -> Response:
        body = await request.body()
        handover = await mcp_transport_request(request, body)
        if handover is not None:
            return handover
        return JSONResponse(await answer_mcp(body, client_address(request)))

    async def answer_mcp(body: bytes, address: str) -> dict[str, Any]:
        try:
            payload = json.loads(body)
            rpc = runtime.rpc_request(payload)
        except json.JSONDecodeError:
            return runtime.rpc_error(RpcCode.PARSE_ERROR, None)
        except ValidationError as exc:
            return runtime.rpc_error(RpcCode.INVALID_REQUEST, f"Invalid request: {exc}")
        except Exception:
            return runtime.rpc_error(RpcCode.PARSE_ERROR, None)
        params = rpc.params
        if not isinstance(params, dict):
            return runtime.rpc_error(RpcCode.INVALID_PARAMS, "Params must be an object", rpc.id)
        if rpc.method == "openenv/session/create":
            try:
                link = await registry.create(address)
                assert isinstance(link, PeerLink)
                await link.call("openenv_enter_mcp")
            except CorralError as exc:
                return _open_failure(runtime, rpc.id, exc)
            assert link.session is not None
            return runtime.rpc_success(rpc.id, {"session_id": link.session.id})
        if rpc.method == "openenv/session/close":
            target = params.get("session_id")
            if not target:
                message = "Invalid params - 'session_id' is required"
                return runtime.rpc_error(RpcCode.INVALID_PARAMS, message, rpc.id)
            outcome = await registry.close(target, "closed over MCP")
            if outcome == "unknown":
                message = f"Unknown session_id: {target}"
                return runtime.rpc_error(RpcCode.INVALID_PARAMS, message, rpc.id)
            result: dict[str, Any] = {"session_id": target, "closed": outcome == "closed"}
            if outcome == "closing":
                result["closing"] = True
            return runtime.rpc_success(rpc.id, result)
        target = params.get("session_id")
        if target:
            found = registry.find(target)
            if not isinstance(found, PeerLink):
                message = f"Unknown session_id: {target}"
                return runtime.rpc_error(RpcCode.INVALID_PARAMS, message, rpc.id)
            async with found.lock:
                return await found.rpc(rpc.method, params, rpc.id)
        try:
            async with _Fresh(service) as env:
                value = await env.call("openenv_mcp", rpc.method, params)
        except Exception as exc:
            code = getattr(exc, "code", RpcCode.INTERNAL_ERROR)
            return runtime.rpc_error(int(code), str(exc), rpc.id)
        return runtime.rpc_success(rpc.id, to_json(value))

    @router.websocket("/mcp")
    async def mcp_socket(websocket: WebSocket) -> None:
        from corral.server.openenv_ws import serve_mcp_socket

        await serve_mcp_socket(websocket, registry)

    if runtime.has_task_api:
        _task_routes(router, service, runtime)
    return router


def _open_failure(runtime: PeerRuntime, request_id: Any, exc: CorralError) -> dict[str, Any]:
    if exc.code in (ErrorCode.CAPACITY_REACHED, ErrorCode.TOO_MANY_SESSIONS):
        data = {k: exc.details.get(k) for k in ("active_sessions", "max_sessions")}
        return runtime.rpc_error(RpcCode.SERVER_ERROR, capacity_message(exc), request_id, data)
    data = {"factory_name": exc.details.get("factory")}
    return runtime.rpc_error(RpcCode.SERVER_ERROR, exc.message, request_id, data)


def _task_routes(router: APIRouter, service: EnvService, runtime: Any) -> None:
    """OpenEnv 0.10's Task API, answered by the environment's task methods."""
    name = runtime.env_name

    def check(env_name: str) -> None:
        if env_name.lower() != name.lower():
            raise HTTPException(404, f"unknown environment {env_name!r}")

    async def task_call(method: str, *args: Any) -> Any:
        try:
            async with _Fresh(service) as env:
                return await env.call("openenv_task", method, *args)
        except NotImplementedError as exc:
            raise HTTPException(501, f"{method} is not supported for this environment") from exc
        except IndexError as exc:
            raise HTTPException(400, "Invalid task index") from exc

    @router.get("/list_environments", tags=["Task API"])
    async def list_environments() -> list[str]:
        return [name]

    @router.get("/{env_name}/splits", tags=["Task API"])
    async def list_splits(env_name: str) -> Any:
        check(env_name)
        return [runtime.normalize_split(s) for s in await task_call("list_splits")]

    async def tasks(request: Any, env_name: str) -> Any:
        check(env_name)
        found = await task_call("list_tasks", request.split)
        return {"tasks": runtime.jsonable(found), "env_name": name}

    async def num_tasks(request: Any, env_name: str) -> Any:
        check(env_name)
        return {"num_tasks": await task_call("num_tasks", request.split)}

    async def task(request: Any, env_name: str) -> Any:
        check(env_name)
        return {"task": runtime.jsonable(await task_call("get_task", request.split, request.index))}

    async def task_range(request: Any, env_name: str) -> Any:
        check(env_name)
        found = await task_call("get_task_range", request.split, request.start, request.stop)
        return {"tasks": runtime.jsonable(found)}

    for route, handler in (
        ("tasks", tasks),
        ("num_tasks", num_tasks),
        ("task", task),
        ("task_range", task_range),
    ):
        router.add_api_route(
            f"/{{env_name}}/{route}",
            _with_body(handler, "request", runtime.task_request(route), default=False),
            methods=["POST"],
            tags=["Task API"],
        )


__all__ = ["STREAM_PATH", "mcp_transport_request", "peer_router"]

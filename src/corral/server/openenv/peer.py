"""An OpenEnv environment as OpenEnv clients see it: answered as OpenEnv's server does.

For an environment served through :mod:`corral.adapters.openenv_env` the routes take
the installed OpenEnv release's request models (so FastAPI validates and reports bodies
exactly as under OpenEnv's server) and keep its semantics, computed by that release
through the adapter's :class:`~corral.protocol.openenv.PeerRuntime`:

* ``POST /reset`` / ``POST /step`` / ``GET /state`` are stateless: each runs on a fresh
  instance (``/step`` on a never-reset one), closed afterwards; an environment error is
  HTTP 500 ``Internal Server Error``; an invalid action 422 ``{"detail": errors}``. With
  corral's ``X-Corral-Session`` header they run on that stateful session instead.
* ``GET /schema``: the one contract (as for any environment; OpenEnv 0.10 adds
  ``reset_observation``); ``GET /metadata``: the environment's ``get_metadata()``.
* ``POST /mcp``: OpenEnv's JSON-RPC handler (``openenv/session/create|close``, tools of an
  ``MCPEnvironment``, 0.10's fallback to step-based tool actions).
* the Task API of OpenEnv 0.10 (``/list_environments``, ``/{env}/splits``, ``/{env}/tasks``,
  ``/{env}/num_tasks``, ``/{env}/task``, ``/{env}/task_range``), answered by the
  environment's own task methods, when the installed release has it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ValidationError
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.errors import CorralError, ErrorCode
from corral.protocol.fields import echo
from corral.protocol.jsonrpc import RpcCode
from corral.protocol.openenv import OpenEnvCode, PeerRuntime, peer_error
from corral.server.http_errors import error_response
from corral.server.openenv.links import (
    LinkRegistry,
    PeerLink,
    capacity_message,
    close_result,
    to_json,
)
from corral.server.openenv.personality import Personality
from corral.server.runner import EnvRunner
from corral.server.service import EnvService
from corral.server.tasks import TaskAnswers, TaskCatalog

_SERVER_ERROR = PlainTextResponse("Internal Server Error", status_code=500)


class _Fresh:
    """One environment instance for one stateless call (OpenEnv builds and closes one)."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self.runner: EnvRunner | None = None

    async def __aenter__(self) -> _Fresh:
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


class PeerPersonality(Personality):
    """An OpenEnv environment, answering with the installed OpenEnv release's semantics."""

    registry: LinkRegistry[PeerLink]

    def __init__(self, service: EnvService, runtime: PeerRuntime) -> None:
        tasks: TaskAnswers = (
            PeerTasks(service, runtime) if runtime.has_task_api else TaskCatalog(service)
        )
        super().__init__(service, tasks)
        self.runtime = runtime
        self.reset_body = runtime.reset_request
        self.step_body = runtime.step_request
        self.registry = LinkRegistry(service, self._link)

    def _link(self, registry: LinkRegistry[PeerLink]) -> PeerLink:
        return PeerLink(self.service, self.runtime, registry)

    def open_failure(self, exc: CorralError) -> dict[str, Any]:
        """OpenEnv's frame for a full server or a failing factory."""
        if exc.code in (ErrorCode.CAPACITY_REACHED, ErrorCode.TOO_MANY_SESSIONS):
            return peer_error(
                capacity_message(exc),
                OpenEnvCode.CAPACITY_REACHED,
                active_sessions=exc.details.get("active_sessions"),
                max_sessions=exc.details.get("max_sessions"),
            )
        if exc.code == ErrorCode.FACTORY_ERROR:
            return peer_error(
                exc.message, OpenEnvCode.FACTORY_ERROR, factory_name=exc.details.get("factory")
            )
        return peer_error(exc.message, OpenEnvCode.SESSION_ERROR)

    def attach_failure(self, problem: str) -> dict[str, Any]:
        """OpenEnv's ``SESSION_ERROR`` frame."""
        return peer_error(problem, OpenEnvCode.SESSION_ERROR)

    def rpc_error(self, code: int, message: str, data: Any = None) -> dict[str, Any]:
        """OpenEnv's JSON-RPC error shape."""
        return self.runtime.rpc_error(code, message, None, data)

    async def _on_session(self, session_id: str | None, method: str, *args: Any) -> Any:
        """``adapter.<method>(*args)`` on the session, or on a fresh instance."""
        if session_id is not None:
            link = self.registry.lookup(session_id)
            async with link.lock:
                return await link.call(method, *args)
        async with _Fresh(self.service) as env:
            return await env.call(method, *args)

    async def reset(self, body: BaseModel, session_id: str | None) -> Response:
        """OpenEnv's ``/reset``."""
        try:
            result = await self._on_session(
                session_id, "openenv_reset", body.model_dump(exclude_unset=True)
            )
            return JSONResponse(self.runtime.http_reply("reset", to_json(result)))
        except CorralError as exc:
            return error_response(exc)
        except Exception:
            return _SERVER_ERROR

    async def step(self, body: BaseModel, session_id: str | None) -> Response:
        """OpenEnv's ``/step``: the action deserialized as OpenEnv does (422 when invalid)."""
        try:
            action = self.runtime.deserialize_action(body.action)  # type: ignore[attr-defined]
        except ValidationError as exc:
            # OpenEnv's own 422 shape, its echo of the action bounded as every error's is.
            return JSONResponse({"detail": echo(to_json(exc.errors()))}, status_code=422)
        kwargs = body.model_dump(exclude_unset=True, exclude={"action"})
        try:
            result = await self._on_session(session_id, "openenv_step", action, kwargs)
            return JSONResponse(self.runtime.http_reply("step", to_json(result)))
        except CorralError as exc:
            return error_response(exc)
        except Exception:
            return _SERVER_ERROR

    async def state(self, session_id: str | None) -> Response:
        """OpenEnv's ``/state``."""
        try:
            data = await self._on_session(session_id, "openenv_state")
            return JSONResponse(self.runtime.http_state(to_json(data)))
        except CorralError as exc:
            return error_response(exc)
        except Exception:
            return _SERVER_ERROR

    def schema(self) -> dict[str, Any]:
        """The contract (see :meth:`Personality.schema`), plus OpenEnv 0.10's
        ``reset_observation`` when the installed release publishes it."""
        body = super().schema()
        if self.runtime.publishes_reset_observation:
            own = self.runtime.reset_observation_schema()
            body["reset_observation"] = own if own is not None else body["observation"]
        return body

    def own_routes(self) -> list[BaseRoute]:
        """The routes the environment's app added itself (a custom ``/web``, a ``/config``),
        served as under OpenEnv."""
        return list(self.runtime.own_routes)

    async def metadata(self) -> Response:
        """A fresh instance's ``get_metadata()``, as OpenEnv answers."""
        try:
            return JSONResponse(await asyncio.to_thread(self.runtime.metadata))
        except Exception:
            return _SERVER_ERROR

    async def mcp(self, body: bytes, session_id: str | None, address: str) -> dict[str, Any]:
        """OpenEnv's ``mcp_handler``: sessions, and tools on a session or a fresh instance."""
        runtime = self.runtime
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
                link = await self.registry.create(address)
            except CorralError as exc:
                return self._open_failure(rpc.id, exc)
            assert link.session is not None
            return runtime.rpc_success(rpc.id, {"session_id": link.session.id})
        if rpc.method == "openenv/session/close":
            target = params.get("session_id")
            if not target:
                message = "Invalid params - 'session_id' is required"
                return runtime.rpc_error(RpcCode.INVALID_PARAMS, message, rpc.id)
            outcome = await self.registry.close(target, "closed over MCP")
            if outcome == "unknown":
                message = self.registry.unknown(target)
                return runtime.rpc_error(RpcCode.INVALID_PARAMS, message, rpc.id)
            return runtime.rpc_success(rpc.id, close_result(target, outcome))
        target = params.get("session_id") or session_id
        if target:
            found = self.registry.find(target)
            if found is None:
                message = self.registry.unknown(target)
                return runtime.rpc_error(RpcCode.INVALID_PARAMS, message, rpc.id)
            async with found.lock:
                return await found.rpc(rpc.method, params, rpc.id)
        try:
            async with _Fresh(self.service) as env:
                value = await env.call("openenv_mcp", rpc.method, params)
        except Exception as exc:
            code = getattr(exc, "code", RpcCode.INTERNAL_ERROR)
            return runtime.rpc_error(int(code), str(exc), rpc.id)
        return runtime.rpc_success(rpc.id, to_json(value))

    def _open_failure(self, request_id: Any, exc: CorralError) -> dict[str, Any]:
        if exc.code in (ErrorCode.CAPACITY_REACHED, ErrorCode.TOO_MANY_SESSIONS):
            data = {k: exc.details.get(k) for k in ("active_sessions", "max_sessions")}
            return self.runtime.rpc_error(
                RpcCode.SERVER_ERROR, capacity_message(exc), request_id, data
            )
        data = {"factory_name": exc.details.get("factory")}
        return self.runtime.rpc_error(RpcCode.SERVER_ERROR, exc.message, request_id, data)


class PeerTasks:
    """OpenEnv 0.10's Task API, answered by the environment's own task methods."""

    def __init__(self, service: EnvService, runtime: PeerRuntime) -> None:
        self.service = service
        self.runtime = runtime
        self.name = runtime.env_name

    def body(self, route: str) -> type[BaseModel]:
        """The installed release's request model of ``route``."""
        return self.runtime.task_request(route)

    def docs(self, route: str) -> dict[str, Any]:
        """Nothing beyond OpenEnv's own documentation of the route."""
        return {}

    def _check(self, env_name: str) -> None:
        if env_name.lower() != self.name.lower():
            raise HTTPException(404, f"unknown environment {env_name!r}")

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            async with _Fresh(self.service) as env:
                return await env.call("openenv_task", method, *args)
        except NotImplementedError as exc:
            raise HTTPException(501, f"{method} is not supported for this environment") from exc
        except IndexError as exc:
            raise HTTPException(400, "Invalid task index") from exc

    async def list_environments(self) -> Response:
        """The environment's name, as given to ``create_app``."""
        return JSONResponse([self.name])

    async def splits(self, env_name: str) -> Response:
        """The environment's ``list_splits()``, in OpenEnv 0.10's shape."""
        self._check(env_name)
        found = await self._call("list_splits")
        return JSONResponse([self.runtime.normalize_split(s) for s in found])

    async def answer(self, route: str, env_name: str, body: Any) -> Response:
        """The environment's ``list_tasks``/``num_tasks``/``get_task``/``get_task_range``."""
        self._check(env_name)
        jsonable = self.runtime.jsonable
        if route == "tasks":
            found = await self._call("list_tasks", body.split)
            return JSONResponse({"tasks": jsonable(found), "env_name": self.name})
        if route == "num_tasks":
            return JSONResponse({"num_tasks": await self._call("num_tasks", body.split)})
        if route == "task":
            return JSONResponse(
                {"task": jsonable(await self._call("get_task", body.split, body.index))}
            )
        found = await self._call("get_task_range", body.split, body.start, body.stop)
        return JSONResponse({"tasks": jsonable(found)})

    async def close(self) -> None:
        """Nothing held: each answer uses a fresh instance, as OpenEnv does."""


__all__ = ["PeerPersonality", "PeerTasks"]

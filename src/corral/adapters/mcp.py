"""An environment's tools over the Model Context Protocol (streamable HTTP transport).

    app = create_app(MyEnv)
    mount_mcp(app)                 # POST/DELETE /mcp/stream  (OpenEnv's JSON-RPC is /mcp)

An agent connects with any MCP client (``mcp.Client("http://host:port/mcp/stream")``):

* ``initialize`` opens one corral session and resets its environment: **one MCP session is
  one episode**. The reply carries the ``Mcp-Session-Id`` header that every later request
  must send. The episode's seed and reset options come from the endpoint URL's query:
  ``/mcp/stream?seed=7&options={"word":"crane"}`` (options as JSON).
* ``tools/list`` lists the environment's tools: the methods marked with
  :func:`corral.contract.tools.tool`, their typed arguments as JSON Schema. ``reset``,
  ``step``, ``state`` and ``close`` are never tools: they belong to the training loop,
  which drives episodes over corral's own protocol.
* ``tools/call`` runs a tool on the episode's environment instance (calls of one episode
  run one at a time). A tool that raises, or arguments that do not validate, give a result
  with ``isError: true`` so the agent can correct itself; an unknown tool is a JSON-RPC
  error. ``ping`` answers ``{}``.
* ``DELETE`` with the session header ends the episode and frees its slot; idle episodes
  are reaped with the server's other sessions, after which their id answers 404 and the
  client must initialize again.

Requests answer with ``application/json`` (the transport's single-response form); there
is no server-initiated stream, so ``GET`` answers 405. Protocol versions 2025-03-26,
2025-06-18 and 2025-11-25 are negotiated; a ``MCP-Protocol-Version`` header naming another
version is refused with 400, as is an ``Origin`` header from a non-loopback origin when
the server is bound to loopback (DNS-rebinding protection).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
from fastapi import FastAPI, Request, Response
from pydantic import TypeAdapter, ValidationError

from corral import __version__
from corral.contract.tools import Tool, tools_of
from corral.errors import CorralError, StepTimeout, validation_errors
from corral.protocol.openenv import (
    RpcCode,
    RpcError,
    parse_rpc,
    rpc_error,
    rpc_result,
)
from corral.protocol.session import Phase
from corral.server.service import EnvService
from corral.server.sessions import Session

DEFAULT_PATH = "/mcp/stream"
"""Where :func:`mount_mcp` mounts the endpoint (``/mcp`` is OpenEnv's JSON-RPC route)."""

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
"""MCP revisions this endpoint speaks, newest first (the first is offered by default)."""

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class _NoReplies:
    """The owner of MCP sessions' corral sessions: tools answer directly, not by message."""

    def send(self, reply: object) -> None:
        """Drop protocol replies (an MCP episode never sends corral requests)."""


@dataclass(eq=False)
class Episode:
    """One MCP session: a corral session whose environment the agent's tools act on."""

    id: str
    session: Session
    protocol_version: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def alive(self) -> bool:
        """False once the corral session was closed (reaped, timed out, shut down)."""
        return self.session.machine.phase is not Phase.CLOSED and not self.session.runner.closed


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
    """A tool as ``tools/list`` describes it."""
    out: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "inputSchema": spec.input_schema,
    }
    schema = output_schema(spec)
    if schema is not None:
        out["outputSchema"] = schema
    return out


def tool_result(spec: Tool, value: Any) -> dict[str, Any]:
    """The ``tools/call`` result for the JSON form of a tool's return value."""
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    schema = output_schema(spec)
    if schema is not None:
        wrapped = schema is not spec.output_schema
        result["structuredContent"] = {"result": value} if wrapped else value
    return result


def tool_error(message: str) -> dict[str, Any]:
    """A ``tools/call`` result reporting a failure to the agent (not a protocol error)."""
    return {"content": [{"type": "text", "text": message}], "isError": True}


_OPTIONS = TypeAdapter(dict[str, Any])


class McpEndpoint:
    """The streamable HTTP MCP endpoint of one environment service (see module docstring).

    Args:
        service: the app's environment service (``app.state.service``).
        loopback_only: refuse ``Origin`` headers that are not loopback origins.
    """

    def __init__(self, service: EnvService, *, loopback_only: bool = True) -> None:
        self.service = service
        self.tools = tools_of(service.env_type)
        for spec in self.tools.values():  # fail at mount time, not at the first tools/list
            _ = spec.input_schema, spec.output_schema
        self.loopback_only = loopback_only
        self.episodes: dict[str, Episode] = {}

    # -- HTTP -----------------------------------------------------------------------------

    async def post(self, request: Request) -> Response:
        """A JSON-RPC message from the client."""
        refused = self._check_headers(request)
        if refused is not None:
            return refused
        try:
            payload = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _json(rpc_error(None, RpcCode.PARSE_ERROR, f"Parse error: {exc}"), 400)
        if isinstance(payload, dict) and "method" not in payload:
            return Response(status_code=202)  # a response to a server request: none are sent
        if isinstance(payload, dict) and "id" not in payload:
            return Response(status_code=202)  # a notification (initialized, cancelled, ...)
        try:
            rpc = parse_rpc(payload)
        except RpcError as exc:
            return _json(exc.response(), 400)
        if rpc.method == "initialize":
            return await self._initialize(request, rpc.id, rpc.params)
        episode_id = request.headers.get(SESSION_HEADER)
        if not episode_id:
            message = f"missing {SESSION_HEADER} header; send initialize first"
            return _json(rpc_error(rpc.id, RpcCode.INVALID_REQUEST, message), 400)
        episode = self._live(episode_id)
        if episode is None:
            message = f"unknown or expired MCP session {episode_id!r}; initialize a new one"
            return _json(rpc_error(rpc.id, RpcCode.INVALID_REQUEST, message), 404)
        try:
            result = await self._dispatch(episode, rpc.method, rpc.params)
        except RpcError as exc:
            exc.request_id = rpc.id
            return _json(exc.response(), 200)
        return _json(rpc_result(rpc.id, result), 200)

    async def delete(self, request: Request) -> Response:
        """End the episode named by the session header."""
        refused = self._check_headers(request)
        if refused is not None:
            return refused
        episode = self.episodes.pop(request.headers.get(SESSION_HEADER, ""), None)
        if episode is None:
            return Response(status_code=404)
        await self.service.manager.close(episode.session, "the MCP session was deleted")
        return Response(status_code=200)

    async def get(self, request: Request) -> Response:
        """No server-initiated stream is offered."""
        return Response(status_code=405, headers={"Allow": "POST, DELETE"})

    def _check_headers(self, request: Request) -> Response | None:
        origin = request.headers.get("origin")
        if self.loopback_only and origin is not None:
            host = urlsplit(origin).hostname
            if host not in _LOOPBACK_HOSTS:
                body = rpc_error(None, RpcCode.INVALID_REQUEST, f"origin {origin!r} is not allowed")
                return _json(body, 403)
        version = request.headers.get(VERSION_HEADER)
        if version is not None and version not in PROTOCOL_VERSIONS:
            message = f"unsupported {VERSION_HEADER} {version!r}; use one of {PROTOCOL_VERSIONS}"
            return _json(rpc_error(None, RpcCode.INVALID_REQUEST, message), 400)
        return None

    def _live(self, episode_id: str) -> Episode | None:
        episode = self.episodes.get(episode_id)
        if episode is not None and not episode.alive:
            del self.episodes[episode_id]
            return None
        return episode

    # -- JSON-RPC -------------------------------------------------------------------------

    async def _initialize(self, request: Request, rpc_id: Any, params: dict[str, Any]) -> Response:
        wanted = params.get("protocolVersion")
        version = wanted if wanted in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        try:
            seed, options = _episode_parameters(request)
        except ValueError as exc:
            return _json(rpc_error(rpc_id, RpcCode.INVALID_PARAMS, str(exc)), 400)
        manager = self.service.manager
        try:
            session = await manager.open(_NoReplies(), 0)
        except CorralError as exc:
            body = rpc_error(rpc_id, RpcCode.SERVER_ERROR, exc.message, {"corral_code": exc.code})
            return _json(body, 503)
        try:
            await session.runner.call(
                "reset", seed, timeout=self.service.config.step_timeout_s, **options
            )
        except Exception as exc:
            await manager.close(session, "the MCP episode failed to reset")
            message = f"the environment failed to reset: {type(exc).__name__}: {exc}"
            return _json(rpc_error(rpc_id, RpcCode.SERVER_ERROR, message), 500)
        episode = Episode(secrets.token_urlsafe(24), session, version)
        self.episodes[episode.id] = episode
        env = self.service.env_type
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": self.service.contract.name, "version": __version__},
            "instructions": env.description or f"Tools of the {self.service.contract.name} env.",
        }
        return _json(rpc_result(rpc_id, result), 200, {SESSION_HEADER: episode.id})

    async def _dispatch(self, episode: Episode, method: str, params: dict[str, Any]) -> Any:
        episode.session.touch()
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": [tool_descriptor(spec) for spec in self.tools.values()]}
        if method == "tools/call":
            return await self._call(episode, params)
        raise RpcError(
            RpcCode.METHOD_NOT_FOUND,
            f"Method not found: {method!r}; this endpoint answers initialize, ping, "
            "tools/list and tools/call",
        )

    async def _call(self, episode: Episode, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        spec = self.tools.get(name) if isinstance(name, str) else None
        if spec is None:
            raise RpcError(
                RpcCode.INVALID_PARAMS, f"Unknown tool: {name!r}; available: {sorted(self.tools)}"
            )
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise RpcError(RpcCode.INVALID_PARAMS, "'arguments' must be an object")
        try:
            args, kwargs = spec.bind(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in validation_errors(exc)
            )
            return tool_error(f"invalid arguments for {spec.name}: {problems}")
        async with episode.lock:
            try:
                value = await episode.session.runner.call(
                    spec.method, *args, timeout=self.service.config.step_timeout_s, **kwargs
                )
            except StepTimeout as exc:
                self.episodes.pop(episode.id, None)
                await self.service.manager.close(episode.session, "a tool call overran")
                raise RpcError(RpcCode.SERVER_ERROR, exc.message) from None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the tool's own failure is a result, as MCP specifies
                return tool_error(f"{type(exc).__name__}: {exc}")
        try:
            dumped = spec.dump_result(value)
        except Exception as exc:
            raise RpcError(
                RpcCode.INTERNAL_ERROR,
                f"tool {spec.name!r} returned a value that does not match its annotation: {exc}",
            ) from None
        return tool_result(spec, dumped)


def _episode_parameters(request: Request) -> tuple[int | None, dict[str, Any]]:
    """The episode's seed and reset options from the endpoint URL's query."""
    query = request.query_params
    seed: int | None = None
    if "seed" in query:
        try:
            seed = int(query["seed"])
        except ValueError:
            raise ValueError(
                f"the seed query parameter must be an integer, got {query['seed']!r}"
            ) from None
    options: dict[str, Any] = {}
    if "options" in query:
        try:
            options = _OPTIONS.validate_json(query["options"])
        except ValidationError:
            raise ValueError(
                f"the options query parameter must be a JSON object, got {query['options']!r}"
            ) from None
    return seed, options


def _json(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def mount_mcp(app: FastAPI, path: str = DEFAULT_PATH, *, loopback_only: bool = True) -> McpEndpoint:
    """Serve the MCP endpoint of ``app``'s environment at ``path``; return the endpoint.

    Raises:
        TypeError: a tool's signature cannot be described (see :func:`tools_of`).
    """
    endpoint = McpEndpoint(app.state.service, loopback_only=loopback_only)
    app.add_api_route(path, endpoint.post, methods=["POST"], include_in_schema=False)
    app.add_api_route(path, endpoint.delete, methods=["DELETE"], include_in_schema=False)
    app.add_api_route(path, endpoint.get, methods=["GET"], include_in_schema=False)
    app.state.mcp = endpoint
    return endpoint


__all__ = ["DEFAULT_PATH", "PROTOCOL_VERSIONS", "Episode", "McpEndpoint", "mount_mcp"]

"""An environment's tools over the Model Context Protocol: streamable HTTP and stdio.

    corral serve my_env:MyEnv --mcp          # POST/DELETE /mcp/stream, and initialize on /mcp
    corral mcp my_env:MyEnv                  # stdio: an MCP client launches this command

    app = create_app(MyEnv)
    mount_mcp(app)                           # what --mcp does

Any MCP client works (``mcp.Client("http://host:port/mcp/stream")``, or a stdio client
configured with ``corral mcp TARGET``):

* ``initialize`` opens one corral session and resets its environment: **one MCP session is
  one episode**. Over HTTP the reply carries the ``Mcp-Session-Id`` header that every later
  request must send. The episode's seed and reset options come from the endpoint URL's
  query (``/mcp/stream?seed=7&options={"word":"crane"}``, options as JSON) or, for stdio,
  from ``corral mcp --seed/--options``.
* ``tools/list`` lists the environment's tools: the methods marked with
  :func:`corral.contract.tools.tool` (their typed arguments as JSON Schema, ``Args:``
  docstring entries as argument descriptions), or an OpenEnv ``MCPEnvironment``'s own
  tools. ``reset``, ``step``, ``state`` and ``close`` are never tools: they belong to the
  training loop, which drives episodes over corral's own protocol.
* ``tools/call`` runs a tool on the episode's environment instance (calls of one episode
  run one at a time). A tool that raises, or arguments that do not validate, give a result
  with ``isError: true`` so the agent can correct itself; an unknown tool is a JSON-RPC
  error. ``ping`` answers ``{}``.
* Over HTTP, ``DELETE`` with the session header ends the episode and frees its slot; idle
  episodes are reaped with the server's other sessions, after which their id answers 404
  and the client must initialize again. Over stdio the episode ends with the input.

``/mcp`` itself is OpenEnv's JSON-RPC dialect (no ``initialize``); the two are told apart
by the request: an ``initialize`` or a request carrying ``Mcp-Session-Id`` sent to
``/mcp`` is answered by this endpoint when it is mounted, else with an error naming
``corral serve --mcp``. HTTP requests answer with ``application/json`` (the transport's
single-response form); there is no server-initiated stream, so ``GET`` answers 405.
Protocol versions 2025-03-26, 2025-06-18 and 2025-11-25 are negotiated; an
``MCP-Protocol-Version`` header naming another version is refused with 400, as is an
``Origin`` header from a non-loopback origin when the server is bound to loopback
(DNS-rebinding protection). All JSON-RPC shaping is :mod:`corral.protocol.jsonrpc`'s.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
from fastapi import FastAPI, Request, Response
from pydantic import TypeAdapter, ValidationError

from corral import __version__
from corral.contract.tools import tools_of
from corral.errors import CorralError, StepTimeout
from corral.protocol.jsonrpc import (
    RpcCode,
    RpcError,
    RpcId,
    argument_problems,
    parse_rpc,
    rpc_error,
    rpc_result,
    tool_error,
    tool_result,
    tools_list_result,
)
from corral.protocol.position import Phase
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


_OPTIONS = TypeAdapter(dict[str, Any])


def parse_options(text: str) -> dict[str, Any]:
    """Reset options given as a JSON object.

    Raises:
        ValueError: ``text`` is not a JSON object.
    """
    try:
        return _OPTIONS.validate_json(text)
    except ValidationError:
        raise ValueError(f"the reset options must be a JSON object, got {text!r}") from None


class McpSessions:
    """MCP episodes of one environment service, independent of the transport.

    Args:
        service: the environment service.
    """

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self.tools = tools_of(service.env_type)
        for spec in self.tools.values():  # fail at mount time, not at the first tools/list
            _ = spec.input_schema, spec.output_schema
        # An OpenEnv MCPEnvironment brings its own tools (FastMCP), run by the adapter.
        self.openenv = getattr(service.env_type, "openenv_runtime", None) is not None
        self.episodes: dict[str, Episode] = {}

    def live(self, episode_id: str) -> Episode | None:
        """The episode ``episode_id`` while its corral session lives."""
        episode = self.episodes.get(episode_id)
        if episode is not None and not episode.alive:
            del self.episodes[episode_id]
            return None
        return episode

    async def initialize(
        self, rpc_id: RpcId, params: dict[str, Any], seed: int | None, options: dict[str, Any]
    ) -> tuple[Episode, dict[str, Any]]:
        """Open and reset an episode; return it and the ``initialize`` response.

        Raises:
            RpcError: the server is full (SERVER_ERROR, ``data.corral_code``) or the
                environment failed to reset.
        """
        wanted = params.get("protocolVersion")
        version = wanted if wanted in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        manager = self.service.manager
        try:
            session = await manager.open(_NoReplies(), 0)
        except CorralError as exc:
            raise RpcError(
                RpcCode.SERVER_ERROR,
                exc.message,
                request_id=rpc_id,
                data={"corral_code": str(exc.code)},
            ) from None
        try:
            await session.runner.call(
                "reset", seed, timeout=self.service.config.step_timeout_s, **options
            )
        except Exception as exc:
            await manager.close(session, "the MCP episode failed to reset")
            message = f"the environment failed to reset: {type(exc).__name__}: {exc}"
            raise RpcError(RpcCode.SERVER_ERROR, message, request_id=rpc_id) from None
        episode = Episode(secrets.token_urlsafe(24), session, version)
        self.episodes[episode.id] = episode
        name = self.service.contract.name
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": name, "version": __version__},
            "instructions": self.service.env_type.description or f"Tools of the {name} env.",
        }
        return episode, rpc_result(rpc_id, result)

    async def answer(self, episode: Episode, rpc_id: RpcId, method: str, params: Any) -> Any:
        """The JSON-RPC response to a request of an initialized episode."""
        try:
            return rpc_result(rpc_id, await self._dispatch(episode, method, params))
        except RpcError as exc:
            exc.request_id = rpc_id
            return exc.response()

    async def end(self, episode: Episode, reason: str) -> None:
        """End the episode and free its slot."""
        self.episodes.pop(episode.id, None)
        await self.service.manager.close(episode.session, reason)

    async def _dispatch(self, episode: Episode, method: str, params: dict[str, Any]) -> Any:
        episode.session.touch()
        if method == "ping":
            return {}
        if method in ("tools/list", "tools/call") and self.openenv:
            return await self._openenv_tools(episode, method, params)
        if method == "tools/list":
            return tools_list_result(self.tools)
        if method == "tools/call":
            return await self._call(episode, params)
        raise RpcError(
            RpcCode.METHOD_NOT_FOUND,
            f"Method not found: {method!r}; this endpoint answers initialize, ping, "
            "tools/list and tools/call",
        )

    async def _openenv_tools(self, episode: Episode, method: str, params: dict[str, Any]) -> Any:
        async with episode.lock:
            try:
                return await episode.session.runner.call(
                    "openenv_mcp", method, params, timeout=self.service.config.step_timeout_s
                )
            except StepTimeout as exc:
                await self.end(episode, "a tool call overran")
                raise RpcError(RpcCode.SERVER_ERROR, exc.message) from None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                code = getattr(exc, "code", RpcCode.INTERNAL_ERROR)
                raise RpcError(RpcCode(code), str(exc)) from None

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
            return tool_error(f"invalid arguments for {spec.name}: {argument_problems(exc)}")
        async with episode.lock:
            try:
                value = await episode.session.runner.call(
                    spec.method, *args, timeout=self.service.config.step_timeout_s, **kwargs
                )
            except StepTimeout as exc:
                await self.end(episode, "a tool call overran")
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


class McpEndpoint:
    """The streamable HTTP MCP endpoint of one environment service (see module docstring).

    Args:
        service: the app's environment service (``app.state.service``).
        loopback_only: refuse ``Origin`` headers that are not loopback origins.
    """

    def __init__(self, service: EnvService, *, loopback_only: bool = True) -> None:
        self.service = service
        self.sessions = McpSessions(service)
        self.loopback_only = loopback_only

    @property
    def episodes(self) -> dict[str, Episode]:
        """The live episodes by MCP session id."""
        return self.sessions.episodes

    async def post(self, request: Request) -> Response:
        """A JSON-RPC message from the client."""
        refused = self._check_headers(request)
        if refused is not None:
            return refused
        try:
            payload = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _json(rpc_error(None, RpcCode.PARSE_ERROR, f"Parse error: {exc}"), 400)
        if isinstance(payload, dict) and ("method" not in payload or "id" not in payload):
            # A response to a server request (none are sent) or a notification.
            return Response(status_code=202)
        try:
            rpc = parse_rpc(payload)
        except RpcError as exc:
            return _json(exc.response(), 400)
        if rpc.method == "initialize":
            try:
                seed, options = _episode_parameters(request)
            except ValueError as exc:
                return _json(rpc_error(rpc.id, RpcCode.INVALID_PARAMS, str(exc)), 400)
            try:
                opened, body = await self.sessions.initialize(rpc.id, rpc.params, seed, options)
            except RpcError as exc:
                status = 503 if isinstance(exc.data, dict) and "corral_code" in exc.data else 500
                return _json(exc.response(), status)
            return _json(body, 200, {SESSION_HEADER: opened.id})
        episode_id = request.headers.get(SESSION_HEADER)
        if not episode_id:
            message = f"missing {SESSION_HEADER} header; send initialize first"
            return _json(rpc_error(rpc.id, RpcCode.INVALID_REQUEST, message), 400)
        episode = self.sessions.live(episode_id)
        if episode is None:
            message = f"unknown or expired MCP session {episode_id!r}; initialize a new one"
            return _json(rpc_error(rpc.id, RpcCode.INVALID_REQUEST, message), 404)
        return _json(await self.sessions.answer(episode, rpc.id, rpc.method, rpc.params), 200)

    async def delete(self, request: Request) -> Response:
        """End the episode named by the session header."""
        refused = self._check_headers(request)
        if refused is not None:
            return refused
        episode = self.sessions.episodes.get(request.headers.get(SESSION_HEADER, ""))
        if episode is None:
            return Response(status_code=404)
        await self.sessions.end(episode, "the MCP session was deleted")
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
        options = parse_options(query["options"])
    return seed, options


def _json(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def mount_mcp(app: FastAPI, path: str = DEFAULT_PATH, *, loopback_only: bool = True) -> McpEndpoint:
    """Serve the MCP endpoint of ``app``'s environment at ``path``; return the endpoint.

    ``app.state.mcp`` is set to it, so OpenEnv's ``/mcp`` route hands MCP-transport
    requests (``initialize``, ``Mcp-Session-Id``) over to it.

    Raises:
        TypeError: a tool's signature cannot be described (see :func:`tools_of`).
    """
    endpoint = McpEndpoint(app.state.service, loopback_only=loopback_only)
    app.add_api_route(path, endpoint.post, methods=["POST"], include_in_schema=False)
    app.add_api_route(path, endpoint.delete, methods=["DELETE"], include_in_schema=False)
    app.add_api_route(path, endpoint.get, methods=["GET"], include_in_schema=False)
    app.state.mcp = endpoint
    return endpoint


# -- stdio -----------------------------------------------------------------------------


async def serve_stdio(
    service: EnvService,
    read_line: Callable[[], Awaitable[bytes]],
    write: Callable[[bytes], None],
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> None:
    """Serve MCP over newline-delimited JSON-RPC until ``read_line`` returns ``b""``.

    One process, one client, one episode (opened by ``initialize``). Every request gets
    exactly one response line; notifications and responses get none.
    """
    sessions = McpSessions(service)
    episode: Episode | None = None
    body: dict[str, Any]
    try:
        while True:
            line = await read_line()
            if not line:
                return
            if not line.strip():
                continue
            try:
                payload = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                write(orjson.dumps(rpc_error(None, RpcCode.PARSE_ERROR, f"Parse error: {exc}")))
                continue
            if isinstance(payload, dict) and ("method" not in payload or "id" not in payload):
                continue
            try:
                rpc = parse_rpc(payload)
            except RpcError as exc:
                write(orjson.dumps(exc.response()))
                continue
            if rpc.method == "initialize":
                if episode is not None:
                    await sessions.end(episode, "the MCP client initialized again")
                episode = None
                try:
                    episode, body = await sessions.initialize(
                        rpc.id, rpc.params, seed, dict(options or {})
                    )
                except RpcError as exc:
                    body = exc.response()
            elif episode is None or sessions.live(episode.id) is None:
                message = "the session is not initialized (or was closed); send initialize"
                body = rpc_error(rpc.id, RpcCode.INVALID_REQUEST, message)
            else:
                body = await sessions.answer(episode, rpc.id, rpc.method, rpc.params)
            write(orjson.dumps(body))
    finally:
        if episode is not None:
            await sessions.end(episode, "the MCP client went away")


async def run_stdio(
    service: EnvService, *, seed: int | None = None, options: dict[str, Any] | None = None
) -> None:
    """:func:`serve_stdio` on this process's stdin and stdout."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=service.config.max_frame_bytes)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data + b"\n")
        out.flush()

    service.manager.start()
    try:
        await serve_stdio(service, reader.readline, write, seed=seed, options=options)
    finally:
        await service.manager.shutdown()


__all__ = [
    "DEFAULT_PATH",
    "PROTOCOL_VERSIONS",
    "Episode",
    "McpEndpoint",
    "McpSessions",
    "mount_mcp",
    "parse_options",
    "run_stdio",
    "serve_stdio",
]

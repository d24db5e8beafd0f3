"""An environment over the Model Context Protocol: streamable HTTP and stdio.

    corral serve my_env:MyEnv --mcp          # POST/DELETE /mcp/stream, and initialize on /mcp
    corral mcp my_env:MyEnv                  # stdio: an MCP client launches this command

    app = create_app(MyEnv)
    mount_mcp(app)                           # what --mcp does

Any MCP client works (``mcp.Client("http://host:port/mcp/stream")``, or a stdio client
configured with ``corral mcp TARGET``):

* ``initialize`` opens one corral session and resets its environment: **one MCP session is
  one corral session**, whose first episode has started. Over HTTP the reply carries the
  ``Mcp-Session-Id`` header that every later request must send. The first episode's seed
  and reset options come from the endpoint URL's query
  (``/mcp/stream?seed=7&options={"word":"crane"}``, options as JSON) or, for stdio, from
  ``corral mcp --seed/--options``; its first observation is in the ``instructions``.
* ``tools/list`` lists what an agent needs to play, as TRL's ``environment_factory``
  offers it (:mod:`corral.adapters.action_tool`): ``reset`` (arguments ``seed`` and the
  environment's reset options) starts a new episode and returns its first observation;
  the **action tool**, named after the Action model (``WordleAction`` → ``wordle``, or
  the name given to :func:`mount_mcp` / ``corral mcp --tool-name``), takes the Action's
  fields as arguments (its JSON Schema, field descriptions included) and returns the next
  observation. Both return the observation as ``structuredContent`` (every field, arrays
  as numbers: :func:`corral.contract.readable.readable`) and as JSON text. Beside them,
  the environment's own tools: the methods marked with :func:`corral.contract.tools.tool`
  (their typed arguments as JSON Schema, ``Args:`` docstring entries as argument
  descriptions), or an OpenEnv ``MCPEnvironment``'s own tools (then those alone).
* ``tools/call`` runs a tool on the session's environment instance (calls of one session
  run one at a time). ``reset`` and the action go through the server like any client's
  (lifecycle rules, validation, the step timeout): an invalid action, a step after the
  episode ended, a tool that raises or arguments that do not validate give a result with
  ``isError: true`` and a one-line message, so the agent can correct itself; an unknown
  tool is a JSON-RPC error. ``ping`` answers ``{}``.
* Over HTTP, ``DELETE`` with the session header ends the session and frees its slot; idle
  sessions are reaped with the server's other sessions, after which their id answers 404
  and the client must initialize again. Over stdio the session ends with the input.

``/mcp`` itself is OpenEnv's JSON-RPC dialect (no ``initialize``); the two are told apart
by the request: an ``initialize`` or a request carrying ``Mcp-Session-Id`` sent to
``/mcp`` is answered by this endpoint when it is mounted, else with an error naming
``corral serve --mcp``. HTTP requests answer with ``application/json`` (the transport's
single-response form); there is no server-initiated stream, so ``GET`` answers 405.
Protocol versions 2025-03-26, 2025-06-18 and 2025-11-25 are negotiated; an
``MCP-Protocol-Version`` header naming another version is refused with 400, as is an
``Origin`` header from a non-loopback origin when the server is bound to loopback
(DNS-rebinding protection). JSON-RPC envelopes are :mod:`corral.protocol.jsonrpc`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, TypeAdapter, ValidationError

from corral import __version__
from corral.adapters.action_tool import action_summary, action_tool_name
from corral.contract.readable import observation_text, readable, readable_schema
from corral.contract.tools import Tool, tools_of
from corral.errors import CorralError, InvalidArgument, StepTimeout
from corral.protocol import messages as m
from corral.protocol.jsonrpc import (
    RpcCode,
    RpcError,
    RpcId,
    argument_problems,
    parse_rpc,
    rpc_error,
    rpc_result,
    tool_descriptor,
    tool_error,
    tool_result,
)
from corral.protocol.position import Phase
from corral.server.openenv.links import LinkRegistry, LockstepLink
from corral.server.service import EnvService

DEFAULT_PATH = "/mcp/stream"
"""Where :func:`mount_mcp` mounts the endpoint (``/mcp`` is OpenEnv's JSON-RPC route)."""

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
"""MCP revisions this endpoint speaks, newest first (the first is offered by default)."""

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
RESET_TOOL = "reset"
"""The tool that starts a new episode."""

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(eq=False)
class McpEpisode:
    """One MCP session: a corral session whose environment the agent's tools act on.

    Its link runs ``reset`` and the action through the server as any client's requests.
    """

    id: str
    link: LockstepLink
    protocol_version: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def session(self) -> Any:
        """The corral session."""
        return self.link.session

    @property
    def alive(self) -> bool:
        """False once the corral session was closed (reaped, timed out, shut down)."""
        session = self.link.session
        return (
            session is not None
            and session.machine.phase is not Phase.CLOSED
            and not session.runner.closed
        )


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


@dataclass(frozen=True)
class PlayTools:
    """``reset`` and the action tool of an environment: their descriptors, and the
    observation model their results are read into.

    Args:
        action: the action tool's name.
        descriptors: their ``tools/list`` entries (``reset`` first).
        observation: the Observation model.
    """

    action: str
    descriptors: tuple[dict[str, Any], ...]
    observation: type[BaseModel]

    @classmethod
    def of(cls, service: EnvService, name: str | None = None) -> PlayTools:
        """The play tools of ``service``'s environment (the action tool named ``name``,
        else after the Action model).

        Raises:
            ValueError: the name is reserved or not an identifier.
        """
        contract = service.contract
        schemas = contract.schemas
        action_schema = dict(schemas["action"])
        tool_name = action_tool_name(action_schema, name)
        observation_schema = readable_schema(schemas["observation"])
        action = {
            "name": tool_name,
            "description": f"{action_summary(action_schema)} Returns the next observation "
            "(done: true when the episode is over; then call reset).",
            "inputSchema": action_schema,
            "outputSchema": observation_schema,
        }
        reset = {
            "name": RESET_TOOL,
            "description": f"Start a new episode of {contract.name} (the current one is "
            f"abandoned) and return its first observation. Then call {tool_name} to act.",
            "inputSchema": _reset_schema(schemas.get("reset_options")),
            "outputSchema": observation_schema,
        }
        return cls(tool_name, (reset, action), contract.observation)

    @property
    def names(self) -> frozenset[str]:
        """``reset`` and the action tool's name."""
        return frozenset({RESET_TOOL, self.action})


def _reset_schema(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``reset`` tool's arguments: ``seed`` and the environment's reset options
    (any keyword when ``reset`` takes ``**options`` with no model)."""
    seed = {
        "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
        "default": None,
        "description": "Seeds the episode: the same seed gives the same episode.",
    }
    if options is None:
        return {
            "type": "object",
            "properties": {"seed": seed},
            "additionalProperties": True,
            "description": "Other arguments are the environment's reset options.",
        }
    schema = {k: v for k, v in options.items() if k != "title"}
    properties = {"seed": seed, **dict(options.get("properties", {}))}
    return {**schema, "type": "object", "properties": properties}


class McpSessions:
    """MCP sessions of one environment service, independent of the transport.

    Args:
        service: the environment service.
        action_tool: the action tool's name (default: after the Action model).

    Raises:
        TypeError: a tool's signature cannot be described, or a tool's name is taken
            by ``reset`` or the action tool.
    """

    def __init__(self, service: EnvService, *, action_tool: str | None = None) -> None:
        self.service = service
        self.tools = tools_of(service.env_type)
        for spec in self.tools.values():  # fail at mount time, not at the first tools/list
            _ = spec.input_schema, spec.output_schema
        # An OpenEnv MCPEnvironment brings its own tools (FastMCP), run by the adapter.
        self.openenv = getattr(service.env_type, "openenv_runtime", None) is not None
        self.play: PlayTools | None = None
        if not self.openenv:
            try:
                self.play = PlayTools.of(service, action_tool)
            except ValueError as exc:
                raise TypeError(str(exc)) from None
            taken = sorted(self.play.names & set(self.tools))
            if taken:
                raise TypeError(
                    f"the environment's tool(s) {taken} take the name of reset or of the "
                    f"action tool; rename them with @tool(name=...) or choose another "
                    "action tool name"
                )
        # What each tool's result looks like once readable (arrays as numbers), and
        # whether it is wrapped as {"result": ...} (MCP's structured content is an object).
        self._outputs = {name: _readable_output(spec) for name, spec in self.tools.items()}
        self._listing = self._tools_list() if not self.openenv else None
        self.episodes: dict[str, McpEpisode] = {}
        # The links' own registry: an MCP session is addressed by its Mcp-Session-Id,
        # never by an OpenEnv session id, so the OpenEnv routes' registry need not know it.
        self.links: LinkRegistry[LockstepLink] = LinkRegistry(
            service, lambda registry: LockstepLink(service, self.tools, registry)
        )

    def _tools_list(self) -> dict[str, Any]:
        listed: list[dict[str, Any]] = list(self.play.descriptors) if self.play else []
        for name, spec in self.tools.items():
            descriptor = tool_descriptor(spec)
            descriptor.pop("outputSchema", None)
            schema, _ = self._outputs[name]
            if schema is not None:
                descriptor["outputSchema"] = schema
            listed.append(descriptor)
        return {"tools": listed}

    def live(self, episode_id: str) -> McpEpisode | None:
        """The session ``episode_id`` while its corral session lives."""
        episode = self.episodes.get(episode_id)
        if episode is not None and not episode.alive:
            del self.episodes[episode_id]
            return None
        return episode

    async def initialize(
        self, rpc_id: RpcId, params: dict[str, Any], seed: int | None, options: dict[str, Any]
    ) -> tuple[McpEpisode, dict[str, Any]]:
        """Open a session and reset it; return it and the ``initialize`` response.

        Raises:
            RpcError: the server is full (SERVER_ERROR, ``data.corral_code``) or the
                environment failed to reset.
        """
        wanted = params.get("protocolVersion")
        version = wanted if wanted in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        link = self.links.new_link()
        try:
            await link.open()
        except CorralError as exc:
            raise RpcError(
                RpcCode.SERVER_ERROR,
                exc.message,
                request_id=rpc_id,
                data={"corral_code": str(exc.code)},
            ) from None
        episode = McpEpisode(secrets.token_urlsafe(24), link, version)
        try:
            first = await self._request(episode, RESET_TOOL, {"seed": seed, **options})
        except CorralError as exc:
            await link.close("the MCP session failed to reset")
            message = f"the environment failed to reset: {exc}"
            raise RpcError(RpcCode.SERVER_ERROR, message, request_id=rpc_id) from None
        self.episodes[episode.id] = episode
        name = self.service.contract.name
        about = self.service.env_type.description or f"The {name} environment."
        if self.play is not None:
            about += (
                f"\nAn episode has started; its first observation: {observation_text(first)}"
                f"\nAct with the {self.play.action} tool; reset starts a new episode."
            )
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": name, "version": __version__},
            "instructions": about,
        }
        return episode, rpc_result(rpc_id, result)

    async def answer(self, episode: McpEpisode, rpc_id: RpcId, method: str, params: Any) -> Any:
        """The JSON-RPC response to a request of an initialized session."""
        try:
            return rpc_result(rpc_id, await self._dispatch(episode, method, params))
        except RpcError as exc:
            exc.request_id = rpc_id
            return exc.response()

    async def end(self, episode: McpEpisode, reason: str) -> None:
        """End the session and free its slot."""
        self.episodes.pop(episode.id, None)
        await episode.link.close(reason)

    async def _dispatch(self, episode: McpEpisode, method: str, params: dict[str, Any]) -> Any:
        episode.session.touch()
        if method == "ping":
            return {}
        if method in ("tools/list", "tools/call") and self.openenv:
            return await self._openenv_tools(episode, method, params)
        if method == "tools/list":
            return self._listing
        if method == "tools/call":
            name = params.get("name")
            if self.play is not None and name in self.play.names:
                return await self._play(episode, str(name), params.get("arguments") or {})
            return await self._call(episode, params)
        raise RpcError(
            RpcCode.METHOD_NOT_FOUND,
            f"Method not found: {method!r}; this endpoint answers initialize, ping, "
            "tools/list and tools/call",
        )

    async def _play(self, episode: McpEpisode, name: str, arguments: Any) -> dict[str, Any]:
        """``reset`` or the action tool: the observation, or the refusal as a tool error."""
        if not isinstance(arguments, dict):
            raise RpcError(RpcCode.INVALID_PARAMS, "'arguments' must be an object")
        try:
            observation = await self._request(episode, name, arguments)
        except CorralError as exc:
            return tool_error(str(exc))
        return _structured_result(readable(observation), wrapped=False)

    async def _request(
        self, episode: McpEpisode, name: str, arguments: dict[str, Any]
    ) -> BaseModel:
        """Run ``reset`` (``arguments``: seed and options) or a step (``arguments``: the
        action) through the server; the observation.

        Raises:
            CorralError: the server's refusal (invalid action, episode over, ...) or the
                environment's failure, as the client would get it.
        """
        session = episode.session
        request: m.Request
        if name == RESET_TOOL:
            options = dict(arguments)
            seed = options.pop("seed", None)
            if seed is not None and (
                isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63
            ):
                raise InvalidArgument(f"seed must be an integer from 0 to 2**63-1, got {seed!r}")
            request = m.Reset(next(episode.ids), session.id, seed, options)
        else:
            request = m.Step(next(episode.ids), session.id, dict(arguments))
        async with episode.lock:
            reply = m.parse_reply(await episode.link.run(request))
        if isinstance(reply, m.ErrorReply):
            raise reply.exception()
        assert isinstance(reply, m.Result)
        observation: BaseModel = self.service.contract.observation.model_validate(reply.observation)
        return observation

    async def _openenv_tools(self, episode: McpEpisode, method: str, params: dict[str, Any]) -> Any:
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

    async def _call(self, episode: McpEpisode, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        spec = self.tools.get(name) if isinstance(name, str) else None
        if spec is None:
            available = sorted(self.tools) + sorted(self.play.names if self.play else ())
            raise RpcError(
                RpcCode.INVALID_PARAMS, f"Unknown tool: {name!r}; available: {available}"
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
                    spec.method, *args, timeout=self.service.config.step_timeout_s, kwargs=kwargs
                )
            except StepTimeout as exc:
                await self.end(episode, "a tool call overran")
                raise RpcError(RpcCode.SERVER_ERROR, exc.message) from None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the tool's own failure is a result, as MCP specifies
                return tool_error(f"{type(exc).__name__}: {exc}")
        schema, wrapped = self._outputs[spec.name]
        shown = readable(_dumped(spec, value))
        if schema is None:  # no annotation: no structured content, as tool_result does
            return tool_result(spec, shown)
        return _structured_result(shown, wrapped=wrapped)


def _readable_output(spec: Tool) -> tuple[dict[str, Any] | None, bool]:
    """A tool's ``outputSchema`` for its readable results (None without an annotation),
    and whether results are wrapped as ``{"result": value}`` (MCP wants an object)."""
    if spec.output_schema is None:
        return None, False
    schema = readable_schema(spec.output_schema)
    if schema.get("type") == "object":
        return schema, False
    return {"type": "object", "properties": {"result": schema}, "required": ["result"]}, True


def _structured_result(value: Any, *, wrapped: bool) -> dict[str, Any]:
    """A ``tools/call`` result with ``value`` as structured content and as its JSON text
    (MCP's advice for clients that read text only); ``data`` keeps the bare value."""
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"result": value} if wrapped else value,
        "isError": False,
        "data": value,
    }


def _dumped(spec: Tool, value: Any) -> Any:
    """A tool's return value in its JSON form (validated by its annotation).

    Raises:
        RpcError: the value does not match the annotation.
    """
    try:
        return spec.dump_result(value)
    except Exception as exc:
        raise RpcError(
            RpcCode.INTERNAL_ERROR,
            f"tool {spec.name!r} returned a value that does not match its annotation: {exc}",
        ) from None


class McpEndpoint:
    """The streamable HTTP MCP endpoint of one environment service (see module docstring).

    Args:
        service: the app's environment service (``app.state.service``).
        loopback_only: refuse ``Origin`` headers that are not loopback origins.
        action_tool: the action tool's name (default: after the Action model).
    """

    def __init__(
        self, service: EnvService, *, loopback_only: bool = True, action_tool: str | None = None
    ) -> None:
        self.service = service
        self.sessions = McpSessions(service, action_tool=action_tool)
        self.loopback_only = loopback_only

    @property
    def episodes(self) -> dict[str, McpEpisode]:
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


def mount_mcp(
    app: FastAPI,
    path: str = DEFAULT_PATH,
    *,
    loopback_only: bool = True,
    action_tool: str | None = None,
) -> McpEndpoint:
    """Serve the MCP endpoint of ``app``'s environment at ``path``; return the endpoint.

    ``app.state.mcp`` is set to it, so OpenEnv's ``/mcp`` route hands MCP-transport
    requests (``initialize``, ``Mcp-Session-Id``) over to it.

    Raises:
        TypeError: a tool's signature cannot be described (see :func:`tools_of`), or a
            tool name is taken twice (``action_tool`` names the action tool).
    """
    endpoint = McpEndpoint(app.state.service, loopback_only=loopback_only, action_tool=action_tool)
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
    action_tool: str | None = None,
) -> None:
    """Serve MCP over newline-delimited JSON-RPC until ``read_line`` returns ``b""``.

    One process, one client, one session (opened by ``initialize``). Every request gets
    exactly one response line; notifications and responses get none.

    Raises:
        TypeError: as :class:`McpSessions`.
    """
    sessions = McpSessions(service, action_tool=action_tool)
    episode: McpEpisode | None = None
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


class StdinLines:
    """This process's standard input, one line per ``await read()``, whatever it is.

    A daemon thread reads it with blocking reads, so a pipe, a terminal, a regular file
    (``corral mcp TARGET < requests.jsonl``) and ``/dev/null`` all work (an event loop's
    pipe transport takes pipes, sockets and character devices only, and uvloop's aborts
    the process on a regular file), and a process that exits while the client keeps its
    end open is not held by the reader. A line longer than ``limit`` bytes is cut there
    (the client gets a parse error for it) and the rest of it skipped.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)
        self._thread = threading.Thread(target=self._read, name="corral-mcp-stdin", daemon=True)
        self._thread.start()

    def _next_line(self) -> bytes:
        stream = sys.stdin.buffer
        try:
            line = stream.readline(self.limit + 1)
            if len(line) > self.limit and not line.endswith(b"\n"):
                rest = line
                while rest and not rest.endswith(b"\n"):
                    rest = stream.readline(self.limit)
                line = line[: self.limit] + b"\n"
        except (OSError, ValueError):  # closed under us: the input has ended
            line = b""
        return line

    def _read(self) -> None:
        while True:
            line = self._next_line()
            try:
                asyncio.run_coroutine_threadsafe(self._lines.put(line), self._loop).result()
            except (RuntimeError, asyncio.CancelledError):
                return  # the loop is gone: nobody reads any more
            if not line:
                return

    async def read(self) -> bytes:
        """The next line (``b""`` at the end of the input)."""
        return await self._lines.get()


async def run_stdio(
    service: EnvService,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    action_tool: str | None = None,
) -> None:
    """:func:`serve_stdio` on this process's stdin and stdout."""
    lines = StdinLines(service.config.max_frame_bytes)
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data + b"\n")
        out.flush()

    service.manager.start()
    try:
        await serve_stdio(
            service, lines.read, write, seed=seed, options=options, action_tool=action_tool
        )
    finally:
        await service.manager.shutdown()


__all__ = [
    "DEFAULT_PATH",
    "PROTOCOL_VERSIONS",
    "RESET_TOOL",
    "McpEndpoint",
    "McpEpisode",
    "McpSessions",
    "PlayTools",
    "StdinLines",
    "mount_mcp",
    "parse_options",
    "run_stdio",
    "serve_stdio",
]

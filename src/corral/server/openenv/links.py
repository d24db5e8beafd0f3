"""The OpenEnv lockstep link: one corral session driven one request at a time.

OpenEnv has no request ids and no multiplexing: a WebSocket on ``/ws`` (or ``/mcp``), a
stateful HTTP session (``openenv/session/create``, corral's ``X-Corral-Session``) and a
stateless HTTP call each drive exactly one session, one request at a time. The sockets
(:mod:`.sockets`) and the HTTP routes (:mod:`.routes`) share the links here and one
:class:`LinkRegistry`, which is what lets a WebSocket attach to a session created over
HTTP (``/ws?session_id=``, OpenEnv 0.10) and drive the *same* environment instance.

Two kinds of link, one per personality (:mod:`.personality`), which picks the kind once:

* :class:`LockstepLink` for a corral environment: frames are translated to ``corral/1``
  requests (:class:`~corral.protocol.openenv.ServerTranslator`) and run through the
  service exactly like a native request (corral's lifecycle, validation, timeouts).
* :class:`PeerLink` for an OpenEnv environment (served through
  :mod:`corral.adapters.openenv_env`): frames get OpenEnv's own semantics, computed by
  the installed OpenEnv release through the adapter's
  :class:`~corral.protocol.openenv.PeerRuntime`; corral still owns the session (capacity,
  idle reaping, the step timeout, the thread or loop each call runs on).

Both have the face of :class:`OpenEnvLink`: ``open``, ``begin``, ``frame`` (one WebSocket frame
in, at most one out), ``answer_rpc``, ``close``; nothing outside this module asks which.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from pydantic import ValidationError
from pydantic_core import to_jsonable_python
from starlette.requests import HTTPConnection

from corral.contract.options import accepted_reset_options
from corral.contract.tools import Tool
from corral.errors import CorralError, SessionElsewhere, SessionLost, StepTimeout, UnknownSession
from corral.protocol import messages as m
from corral.protocol.codecs import JsonCodec
from corral.protocol.handshake import Compat
from corral.protocol.jsonrpc import (
    CallTool,
    CloseRpcSession,
    CreateSession,
    ListTools,
    RpcCode,
    RpcError,
    parse_rpc,
    plan_rpc,
    rpc_error,
    rpc_result,
    tool_error,
    tool_result,
    tools_list_result,
)
from corral.protocol.openenv import (
    Inbound,
    McpMessage,
    OpenEnvClose,
    OpenEnvCode,
    PeerRuntime,
    ServerTranslator,
    ToolStep,
    envelope,
    error_frame,
    mcp_frame,
    peer_error,
)
from corral.protocol.position import Phase
from corral.server.runner import Running
from corral.server.service import Channel, EnvService
from corral.server.sessions import Session

SESSION_HEADER = "X-Corral-Session"
"""The header naming the stateful HTTP session a request addresses."""


def client_address(connection: HTTPConnection) -> str:
    """The peer address a session opened over HTTP or an OpenEnv WebSocket counts for
    (the per-client limits)."""
    return connection.client.host if connection.client is not None else ""


L = TypeVar("L", bound="OpenEnvLink")


class LinkRegistry(Generic[L]):
    """The sessions of one server that OpenEnv clients address by id.

    HTTP sessions live here between requests; a WebSocket may attach to one
    (``/ws?session_id=``), one WebSocket per session. A session closed over MCP while
    a WebSocket is attached closes when that WebSocket goes (OpenEnv's deferred close).

    Args:
        service: the environment service.
        make_link: builds an unopened link of the served environment's kind (the
            personality's choice, made once).
    """

    def __init__(self, service: EnvService, make_link: Callable[[LinkRegistry[L]], L]) -> None:
        self.service = service
        self._make_link = make_link
        self.links: dict[str, L] = {}
        self.attached: set[str] = set()
        self.pending_close: set[str] = set()
        self.clients: dict[str, str] = {}
        """The client address of each registered session: it counts in that client's limit."""

    def new_link(self) -> L:
        """A link of the served environment's kind (not opened yet)."""
        return self._make_link(self)

    async def start(self, address: str = "") -> L:
        """A link on a new session of its own (a WebSocket's: not registered), for the
        client at ``address`` (its sessions count in that client's limit).

        Raises:
            CapacityReached / TooManySessions / FactoryError: counted, and the half-made
                session closed.
        """
        link = self.new_link()
        link.channel.client = address
        try:
            await link.open()
            await link.begin()
        except CorralError as exc:
            link.count_error(str(exc.code))
            await link.close("the session could not start")
            raise
        return link

    async def create(self, address: str = "") -> L:
        """Open a session kept between requests, for the client at ``address``.

        Each such session counts as one of the client's connections
        (``ServerConfig.max_connections_per_client``), like a WebSocket holding it.

        Raises:
            TooManyConnections: the client holds its limit already.
            CapacityReached / FactoryError: as for any new session.
        """
        live = self.service.manager.sessions
        for sid in [sid for sid in self.links if sid not in live]:
            self._forget(sid)  # reaped since: forget it
        refusal = self.service.gate.enter(address)
        if refusal is not None:
            raise refusal
        link = self.new_link()
        link.channel.client = address
        try:
            session = await link.open()
            await link.begin()
        except BaseException:
            self.service.gate.leave(address)
            await link.close("the session could not start")
            raise
        self.links[session.id] = link
        self.clients[session.id] = address
        return link

    def _forget(self, session_id: str) -> None:
        """Drop a registered session and give its client's slot back."""
        self.links.pop(session_id, None)
        address = self.clients.pop(session_id, None)
        if address is not None:
            self.service.gate.leave(address)

    def find(self, session_id: str) -> L | None:
        """The live registered session ``session_id`` (marked active), else None."""
        link = self.links.get(session_id)
        if link is None:
            return None
        if link.session is None or link.session.id not in self.service.manager.sessions:
            self._forget(session_id)
            return None
        link.session.touch()
        return link

    def lookup(self, session_id: str) -> L:
        """The live HTTP session ``session_id``.

        Raises:
            SessionLost: it existed and was closed or reaped (with the reason).
            SessionElsewhere: another server of the fleet holds it (``details.server``).
            UnknownSession: no HTTP session has that id.
        """
        link = self.find(session_id)
        if link is not None:
            return link
        raise self.missing(session_id)

    def missing(self, session_id: str) -> CorralError:
        """Why ``session_id`` names no HTTP session here: the registry's answer (lost,
        or another server's), else ``UNKNOWN_SESSION`` saying how to open one. A live
        session of a ``corral/1`` connection is unknown here too: it is not this
        route's to drive."""
        error = self.service.manager.registry.missing(session_id, "")
        if isinstance(error, SessionLost | SessionElsewhere):
            return error
        return UnknownSession(
            f"no HTTP session {session_id!r}; open one with POST /sessions and send its "
            f"id in the {SESSION_HEADER} header",
            details={"session": session_id},
        )

    def unknown(self, session_id: str) -> str:
        """OpenEnv's text for a session id it cannot use (``Unknown session_id: ...``),
        naming the server that holds it when another server of the fleet does."""
        text = f"Unknown session_id: {session_id}"
        error = self.missing(session_id)
        return f"{text} ({error.message})" if isinstance(error, SessionElsewhere) else text

    async def close(self, session_id: str, reason: str) -> str:
        """Close ``session_id``: ``"closed"``, ``"closing"`` (a WebSocket is attached;
        it closes when that goes) or ``"unknown"``."""
        link = self.find(session_id)
        if link is None:
            return "unknown"
        if session_id in self.attached:
            self.pending_close.add(session_id)
            return "closing"
        async with link.lock:
            await link.close(reason)
        self._forget(session_id)
        return "closed"

    def attach(self, session_id: str) -> L:
        """Reserve ``session_id`` for one WebSocket.

        Raises:
            KeyError: no such session, or one is attached already (the message says).
        """
        link = self.find(session_id)
        if link is None:
            raise KeyError(self.unknown(session_id))
        if session_id in self.attached:
            raise KeyError(f"Session {session_id} already has an attached WebSocket")
        self.attached.add(session_id)
        return link

    async def detach(self, session_id: str) -> None:
        """The attached WebSocket went: run a close asked for meanwhile."""
        self.attached.discard(session_id)
        if session_id in self.pending_close:
            self.pending_close.discard(session_id)
            await self.close(session_id, "closed over MCP while a WebSocket was attached")


class OpenEnvLink(ABC):
    """One session driven by OpenEnv's lockstep requests: what both kinds share.

    The session, its owner channel, the lock serializing requests, closing, and the
    ``openenv/session/*`` methods; the kinds differ in how a frame or a JSON-RPC request
    is answered.
    """

    def __init__(self, service: EnvService, registry: LinkRegistry[Any]) -> None:
        self.service = service
        self.registry = registry
        self.lock = asyncio.Lock()
        self._replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        # OpenEnv has no handshake and no contract to negotiate: the channel starts out
        # greeted, unchecked (as a corral client that sends no contract).
        self.channel = Channel(
            codec=JsonCodec(), sender=self._replies.put_nowait, compat=Compat.UNCHECKED
        )
        self.session: Session | None = None

    async def open(self) -> Session:
        """Open the session.

        Raises:
            CapacityReached / FactoryError: the session could not be created.
        """
        session = await self.service.manager.open(self.channel, self.channel.owned)
        self.channel.owned += 1
        self.session = session
        return session

    @abstractmethod
    async def begin(self) -> None:
        """Prepare the opened session for its first request."""

    @abstractmethod
    def speak(self, *, nested_metadata: bool) -> None:
        """Choose the observation layout of this link's frames."""

    async def close(self, reason: str) -> None:
        """Close the session (idempotent) and free its slot."""
        if self.session is not None:
            await self.service.manager.close(self.session, reason)

    def count_error(self, code: str) -> None:
        """Count an error answered outside the service."""
        self.service.manager.stats.error(code)

    @abstractmethod
    async def frame(self, raw: str | bytes) -> dict[str, Any] | None:
        """The reply frame to one OpenEnv frame (None for ``close``, which has none)."""

    @abstractmethod
    async def answer_rpc(self, payload: Any) -> dict[str, Any]:
        """The JSON-RPC response to a decoded payload, run on this session."""

    def _ok(self, request_id: Any, result: Any) -> dict[str, Any]:
        return rpc_result(request_id, result)

    def _err(self, request_id: Any, code: int, message: str) -> dict[str, Any]:
        return rpc_error(request_id, code, message)

    async def _session_rpc(self, plan_id: Any, kind: str, target: str | None) -> dict[str, Any]:
        """``openenv/session/create|close`` on a link's own connection."""
        assert self.session is not None
        if kind == "create":
            return self._ok(plan_id, {"session_id": self.session.id})
        if target == self.session.id:
            message = "Cannot close active WebSocket-managed session via MCP method"
            return self._err(plan_id, RpcCode.INVALID_REQUEST, message)
        outcome = await self.registry.close(target or "", "closed over MCP")
        if outcome == "unknown":
            return self._err(plan_id, RpcCode.INVALID_PARAMS, f"Unknown session_id: {target}")
        return self._ok(plan_id, close_result(target or "", outcome))


def close_result(session_id: str, outcome: str) -> dict[str, Any]:
    """The result of ``openenv/session/close`` (or ``DELETE /sessions``) for an outcome
    of :meth:`LinkRegistry.close` other than ``"unknown"``."""
    result: dict[str, Any] = {"session_id": session_id, "closed": outcome == "closed"}
    if outcome == "closing":
        result["closing"] = True
    return result


class LockstepLink(OpenEnvLink):
    """A corral environment's session driven by OpenEnv frames, through the service.

    Args:
        service: the environment service.
        tools: the environment's tools (for ``mcp`` frames and ``POST /mcp``).
        registry: the server's registry (for ``openenv/session/close`` of others).
    """

    def __init__(
        self, service: EnvService, tools: Mapping[str, Tool], registry: LinkRegistry[Any]
    ) -> None:
        super().__init__(service, registry)
        self.tools = tools
        self._translator: ServerTranslator | None = None
        self.nested_metadata = False
        """Speak OpenEnv 0.10's observation layout (set per connection)."""

    async def begin(self) -> None:
        """Nothing to prepare: the service opened the session."""

    def speak(self, *, nested_metadata: bool) -> None:
        """Speak OpenEnv 0.10's layout (``metadata`` also nested) or 0.3's."""
        self.nested_metadata = nested_metadata

    @property
    def translator(self) -> ServerTranslator:
        """The frame translator of this link's session (after :meth:`open`)."""
        if self._translator is None:
            raise RuntimeError("LockstepLink.open() was not called")
        return self._translator

    async def open(self) -> Session:
        """Open the session (see :meth:`OpenEnvLink.open`)."""
        session = await super().open()
        self._translator = ServerTranslator(
            session.id,
            reset_options=accepted_reset_options(self.service.env_type.reset),
            action_fields=frozenset(self.service.contract.action.model_fields),
            max_frame_bytes=self.service.config.max_frame_bytes,
            # OpenEnv 0.3's MCPToolClient lists and calls tools as step actions.
            tool_actions=bool(self.tools)
            and "type" not in self.service.contract.action.model_fields,
        )
        return session

    async def run(self, request: m.Request) -> dict[str, Any]:
        """Run one corral request of this session and return its reply message."""
        session = self.session
        assert session is not None
        try:
            await self.service.handle(self.channel, request)
        except Exception as exc:  # a bug in corral must still produce exactly one reply
            self.service.internal_error(self.channel, exc)
        task = session.task
        if self._replies.empty() and task is not None:
            if isinstance(task, Running):
                await task.wait()
            else:
                await asyncio.wait({task})
        if self._replies.empty():
            # The request's task was cancelled without replying: the session was closed
            # under it (server shutdown).
            reason = session.machine.closed_reason or "the session ended"
            error = SessionLost(f"session is gone: {reason}", details={"reason": reason})
            return m.ErrorReply(request.id, str(error.code), error.message, error.details).to_wire()
        return self._replies.get_nowait()

    async def frame(self, raw: str | bytes) -> dict[str, Any] | None:
        """The reply frame to one OpenEnv frame (None for ``close``, which has none)."""
        try:
            inbound: Inbound = self.translator.read(raw)
        except CorralError as exc:
            self.count_error(str(exc.code))
            return error_frame(exc)
        if isinstance(inbound, OpenEnvClose):
            return None
        if isinstance(inbound, McpMessage):
            return mcp_frame(await self.answer_rpc(inbound.payload))
        if isinstance(inbound, ToolStep):
            response = await self.answer_rpc(inbound.rpc)
            return self.translator.tool_reply(
                inbound, response, nested_metadata=self.nested_metadata
            )
        reply = await self.run(inbound.request)
        return self.translator.reply(reply, nested_metadata=self.nested_metadata)

    async def answer_rpc(self, payload: Any) -> dict[str, Any]:
        """The JSON-RPC response to a payload, run on this session."""
        try:
            plan = plan_rpc(parse_rpc(payload), self.tools, self.service.contract.name)
        except RpcError as exc:
            return exc.response()
        if isinstance(plan, ListTools):
            return rpc_result(plan.id, tools_list_result(self.tools))
        if isinstance(plan, CallTool):
            return await self.call_tool(plan)
        if isinstance(plan, CreateSession):
            return await self._session_rpc(plan.id, "create", None)
        assert isinstance(plan, CloseRpcSession)
        return await self._session_rpc(plan.id, "close", plan.session_id)

    async def call_tool(self, plan: CallTool) -> dict[str, Any]:
        """Run a planned ``tools/call`` on the session's environment instance."""
        session = self.session
        assert session is not None
        if session.machine.phase is Phase.CLOSED:
            reason = session.machine.closed_reason
            return rpc_error(
                plan.id,
                RpcCode.SERVER_ERROR,
                f"session is gone: {reason}",
                {"corral_code": "SESSION_LOST", "reason": reason},
            )
        session.touch()
        try:
            value = await session.runner.call(
                plan.tool.method,
                *plan.args,
                timeout=self.service.config.step_timeout_s,
                kwargs=plan.kwargs,
            )
        except StepTimeout as exc:
            await self.service.manager.close(session, "a tool call overran the step timeout")
            return rpc_error(
                plan.id, RpcCode.SERVER_ERROR, exc.message, {"corral_code": str(exc.code)}
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the tool's own failure is a result, as MCP specifies
            return rpc_result(plan.id, tool_error(f"{type(exc).__name__}: {exc}"))
        try:
            dumped = plan.tool.dump_result(value)
        except Exception as exc:
            return rpc_error(
                plan.id,
                RpcCode.INTERNAL_ERROR,
                f"tool {plan.tool.name!r} returned a value that does not match its "
                f"return annotation: {exc}",
            )
        return rpc_result(plan.id, tool_result(plan.tool, dumped))


def to_json(value: Any) -> Any:
    """``value`` as OpenEnv's pydantic JSON dump gives it (exception objects as text)."""
    return to_jsonable_python(value, fallback=str)


class PeerLink(OpenEnvLink):
    """An OpenEnv environment's session, driven with OpenEnv's own semantics.

    Every frame is handled as OpenEnv's server handles it (message validation by the
    installed release's models, reset keywords filtered by the signature, no lifecycle
    rules, ``VALIDATION_ERROR`` with pydantic's errors, ``EXECUTION_ERROR`` with the
    exception's text); the environment's methods run through the session's runner.
    Where OpenEnv would end the session on a reply it cannot serialize (a custom
    validator's exception in ``errors``), the exception is sent as text and the
    session lives on.
    """

    def __init__(
        self, service: EnvService, runtime: PeerRuntime, registry: LinkRegistry[Any]
    ) -> None:
        super().__init__(service, registry)
        self.runtime = runtime

    async def begin(self) -> None:
        """Enter the environment's MCP session, as OpenEnv does when a session opens."""
        await self.call("openenv_enter_mcp")

    def speak(self, *, nested_metadata: bool) -> None:
        """No choice: an OpenEnv environment speaks its installed release's layout."""

    def _ok(self, request_id: Any, result: Any) -> dict[str, Any]:
        return self.runtime.rpc_success(request_id, result)

    def _err(self, request_id: Any, code: int, message: str) -> dict[str, Any]:
        return self.runtime.rpc_error(code, message, request_id)

    async def call(self, method: str, *args: Any) -> Any:
        """Run ``adapter.<method>(*args)`` on the session's instance."""
        session = self.session
        assert session is not None
        if session.machine.phase is Phase.CLOSED:
            reason = session.machine.closed_reason
            raise SessionLost(f"session is gone: {reason}", details={"reason": reason})
        session.touch()
        return await session.runner.call(method, *args, timeout=self.service.config.step_timeout_s)

    async def frame(self, raw: str | bytes) -> dict[str, Any] | None:
        """The reply frame to one OpenEnv frame (None for ``close``)."""
        runtime = self.runtime
        try:
            message = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self.count_error(OpenEnvCode.INVALID_JSON)
            return peer_error(f"Invalid JSON: {exc}", OpenEnvCode.INVALID_JSON)
        if not isinstance(message, dict):
            self.count_error(OpenEnvCode.VALIDATION_ERROR)
            return peer_error(
                "Invalid message: a message must be a JSON object",
                OpenEnvCode.VALIDATION_ERROR,
                errors=[],
            )
        kind = message.get("type", "")
        model = runtime.ws_models.get(kind) if isinstance(kind, str) else None
        if model is None:
            self.count_error(OpenEnvCode.UNKNOWN_TYPE)
            return peer_error(f"Unknown message type: {kind}", OpenEnvCode.UNKNOWN_TYPE)
        try:
            msg = model(**message)
            if kind == "close":
                return None
            if kind == "mcp":
                return mcp_frame(await self.answer_rpc(msg.data))  # type: ignore[attr-defined]
            if kind == "state":
                return envelope("state", to_json(await self.call("openenv_state")))
            if kind == "reset":
                data = await self.call("openenv_reset", msg.data)  # type: ignore[attr-defined]
            else:
                action = runtime.deserialize_action(msg.data)  # type: ignore[attr-defined]
                data = await self.call("openenv_step", action)
            return envelope("observation", to_json(data))
        except ValidationError as exc:
            self.count_error(OpenEnvCode.VALIDATION_ERROR)
            return peer_error(
                "Invalid message", OpenEnvCode.VALIDATION_ERROR, errors=to_json(exc.errors())
            )
        except (StepTimeout, SessionLost) as exc:
            self.count_error(str(exc.code))
            if isinstance(exc, StepTimeout) and self.session is not None:
                await self.service.manager.close(self.session, "a call overran the step timeout")
            return peer_error(exc.message, OpenEnvCode.SESSION_ERROR)
        except Exception as exc:
            self.count_error(OpenEnvCode.EXECUTION_ERROR)
            return peer_error(str(exc), OpenEnvCode.EXECUTION_ERROR)

    async def answer_rpc(self, payload: Any) -> dict[str, Any]:
        """OpenEnv's JSON-RPC answer to ``payload`` on this session."""
        runtime = self.runtime
        try:
            request = runtime.rpc_request(payload)
        except Exception as exc:
            return runtime.rpc_error(RpcCode.INVALID_REQUEST, f"Invalid request: {exc}")
        return await self.rpc(request.method, request.params, request.id)

    async def rpc(self, method: str, params: Any, request_id: Any) -> dict[str, Any]:
        """OpenEnv's ``mcp_handler`` with this link's session as the session."""
        runtime = self.runtime
        if not isinstance(params, dict):
            return runtime.rpc_error(RpcCode.INVALID_PARAMS, "Params must be an object", request_id)
        if method in ("openenv/session/create", "openenv/session/close"):
            if method == "openenv/session/close" and not params.get("session_id"):
                message = "Invalid params - 'session_id' is required"
                return runtime.rpc_error(RpcCode.INVALID_PARAMS, message, request_id)
            kind = "create" if method.endswith("create") else "close"
            return await self._session_rpc(request_id, kind, params.get("session_id"))
        try:
            result = await self.call("openenv_mcp", method, params)
        except StepTimeout as exc:
            if self.session is not None:
                await self.service.manager.close(self.session, "a tool call overran")
            return runtime.rpc_error(RpcCode.SERVER_ERROR, exc.message, request_id)
        except Exception as exc:
            code = getattr(exc, "code", RpcCode.INTERNAL_ERROR)
            return runtime.rpc_error(int(code), str(exc), request_id)
        return runtime.rpc_success(request_id, to_json(result))


def capacity_message(exc: CorralError) -> str:
    """OpenEnv's text for a full server."""
    active = exc.details.get("active_sessions")
    limit = exc.details.get("max_sessions", exc.details.get("limit"))
    return f"Server at capacity: {active}/{limit} sessions active. Cannot accept new connections."


__all__ = [
    "SESSION_HEADER",
    "LinkRegistry",
    "LockstepLink",
    "OpenEnvLink",
    "PeerLink",
    "capacity_message",
    "client_address",
    "close_result",
    "to_json",
]

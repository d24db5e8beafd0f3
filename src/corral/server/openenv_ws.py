"""OpenEnv clients on ``/ws``: a WebSocket that asks for no corral subprotocol.

One connection is one corral session, opened through the session manager (so it counts
against capacity, is reaped when idle and is closed when the socket goes). Frames are
handled in strict request/reply order, since OpenEnv has no request ids: each frame is
translated by :class:`~corral.protocol.openenv.ServerTranslator`, run through
:class:`~corral.server.service.EnvService` exactly like a native request (same
lifecycle, validation, runner and timeouts), and its one reply translated back.

Lifecycle: corral is strict where OpenEnv is lax. A ``step`` before the first ``reset``
or after the episode ended (unless the environment auto-resets) is refused with
``EXECUTION_ERROR`` (``corral_code`` ``RESET_REQUIRED`` / ``EPISODE_ENDED``) and the
session stays usable; OpenEnv clients that reset first, as they all do, never see it.

:class:`LockstepLink` is shared with the OpenEnv HTTP routes (stateless calls and
stateful HTTP sessions drive a session the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.contract.options import accepted_reset_options
from corral.contract.tools import Tool, tools_of
from corral.errors import CorralError, SessionLost, StepTimeout
from corral.protocol import messages as m
from corral.protocol.codecs import JsonCodec
from corral.protocol.handshake import Compat
from corral.protocol.openenv import (
    CallTool,
    CloseSession,
    CreateSession,
    Inbound,
    ListTools,
    McpMessage,
    RpcCode,
    RpcError,
    ServerTranslator,
    error_frame,
    is_fatal,
    mcp_frame,
    parse_rpc,
    plan_rpc,
    rpc_error,
    rpc_result,
    tool_call_result,
    tool_error_result,
    tools_list_result,
)
from corral.protocol.session import Phase
from corral.server.service import Channel, EnvService
from corral.server.sessions import Session
from corral.server.ws import FallbackHandler

log = logging.getLogger("corral.server")

_CLOSE_NORMAL = 1000


def reset_options(service: EnvService) -> frozenset[str] | None:
    """Reset keywords the served environment accepts besides ``seed`` (None: any)."""
    return accepted_reset_options(service.env_type.reset)


class LockstepLink:
    """One corral session driven one request at a time, OpenEnv style.

    Args:
        service: the environment service.
        tools: the environment's tools (for ``mcp`` frames and ``POST /mcp``).

    Use :meth:`open` first; :attr:`lock` serializes callers that share the link (the
    HTTP session routes); :meth:`close` frees the slot.
    """

    def __init__(self, service: EnvService, tools: Mapping[str, Tool]) -> None:
        self.service = service
        self.tools = tools
        self.lock = asyncio.Lock()
        self._replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        # OpenEnv has no handshake and no contract to negotiate: the channel starts out
        # greeted, unchecked (as a corral client that sends no contract).
        self.channel = Channel(
            codec=JsonCodec(), sender=self._replies.put_nowait, compat=Compat.UNCHECKED
        )
        self.session: Session | None = None
        self._translator: ServerTranslator | None = None

    @property
    def translator(self) -> ServerTranslator:
        """The frame translator of this link's session (after :meth:`open`)."""
        if self._translator is None:
            raise RuntimeError("LockstepLink.open() was not called")
        return self._translator

    async def open(self) -> Session:
        """Open the session.

        Raises:
            CapacityReached / FactoryError: the session could not be created.
        """
        session = await self.service.manager.open(self.channel, self.channel.owned)
        self.channel.owned += 1
        self.session = session
        self._translator = ServerTranslator(
            session.id,
            reset_options=reset_options(self.service),
            action_fields=frozenset(self.service.contract.action.model_fields),
            max_frame_bytes=self.service.config.max_frame_bytes,
        )
        return session

    def count_error(self, exc: CorralError) -> None:
        """Count an error answered outside the service (a frame that did not parse)."""
        self.service.manager.stats.error(str(exc.code))

    async def run(self, request: m.Request) -> dict[str, Any]:
        """Run one corral request of this session and return its reply message."""
        session = self.session
        assert session is not None
        try:
            await self.service.handle(self.channel, request)
        except Exception as exc:  # a bug in corral must still produce exactly one reply
            self.service.internal_error(self.channel, exc)
        if self._replies.empty() and session.task is not None:
            await asyncio.wait({session.task})
        if self._replies.empty():
            # The request's task was cancelled without replying: the session was closed
            # under it (server shutdown).
            reason = session.machine.closed_reason or "the session ended"
            error = SessionLost(f"session is gone: {reason}", details={"reason": reason})
            return m.ErrorReply(request.id, str(error.code), error.message, error.details).to_wire()
        return self._replies.get_nowait()

    async def answer_rpc(self, payload: Any) -> dict[str, Any]:
        """The JSON-RPC response to an ``mcp`` frame's payload, run on this session.

        ``openenv/session/create`` answers with this connection's own session (as
        OpenEnv does); closing that session over MCP is refused (send ``close``).
        """
        try:
            plan = plan_rpc(parse_rpc(payload), self.tools, self.service.contract.name)
        except RpcError as exc:
            return exc.response()
        if isinstance(plan, ListTools):
            return rpc_result(plan.id, tools_list_result(self.tools))
        if isinstance(plan, CallTool):
            return await self.call_tool(plan)
        assert self.session is not None
        if isinstance(plan, CreateSession):
            return rpc_result(plan.id, {"session_id": self.session.id})
        if plan.session_id == self.session.id:
            message = "this connection's own session cannot be closed over MCP; send 'close'"
            return rpc_error(plan.id, RpcCode.INVALID_REQUEST, message)
        return rpc_error(plan.id, RpcCode.INVALID_PARAMS, f"Unknown session_id: {plan.session_id}")

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
                **plan.kwargs,
            )
        except StepTimeout as exc:
            await self.service.manager.close(session, "a tool call overran the step timeout")
            return rpc_error(
                plan.id, RpcCode.SERVER_ERROR, exc.message, {"corral_code": str(exc.code)}
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the tool's own failure is a result, as MCP specifies
            return rpc_result(plan.id, tool_error_result(f"{type(exc).__name__}: {exc}"))
        try:
            dumped = plan.tool.dump_result(value)
        except Exception as exc:
            return rpc_error(
                plan.id,
                RpcCode.INTERNAL_ERROR,
                f"tool {plan.tool.name!r} returned a value that does not match its "
                f"return annotation: {exc}",
            )
        return rpc_result(plan.id, tool_call_result(dumped))

    async def close(self, reason: str) -> None:
        """Close the session (idempotent) and free its slot."""
        if self.session is not None:
            await self.service.manager.close(self.session, reason)


async def _send(websocket: WebSocket, frame: dict[str, Any], codec: JsonCodec) -> None:
    await websocket.send_text(codec.encode(frame))


async def handle_frame(link: LockstepLink, frame: str | bytes) -> dict[str, Any] | None:
    """The reply frame to one OpenEnv frame (None for ``close``, which has none)."""
    try:
        inbound: Inbound = link.translator.read(frame)
    except CorralError as exc:
        link.count_error(exc)
        return error_frame(exc)
    if isinstance(inbound, CloseSession):
        return None
    if isinstance(inbound, McpMessage):
        return mcp_frame(await link.answer_rpc(inbound.payload))
    reply = await link.run(inbound.request)
    return link.translator.reply(reply)


async def serve_openenv(
    websocket: WebSocket, service: EnvService, tools: Mapping[str, Tool]
) -> None:
    """Run one OpenEnv connection until the client closes or the session ends."""
    await websocket.accept()
    codec = JsonCodec()
    link = LockstepLink(service, tools)
    try:
        await link.open()
    except CorralError as exc:
        # OpenEnv reports a full server (or a failing factory) after accepting: one
        # error frame, then close 1000.
        service.manager.stats.error(str(exc.code))
        with contextlib.suppress(Exception):
            await _send(websocket, error_frame(exc), codec)
            await websocket.close(_CLOSE_NORMAL)
        return
    reason = "the OpenEnv client disconnected"
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            text = message.get("text")
            frame: str | bytes = text if text is not None else message.get("bytes") or b""
            out = await handle_frame(link, frame)
            if out is None:
                reason = "closed by the OpenEnv client"
                break
            await _send(websocket, out, codec)
            if is_fatal(out):
                reason = f"ended after {out['data'].get('corral_code')}"
                break
    except WebSocketDisconnect:
        pass
    finally:
        await link.close(reason)
    with contextlib.suppress(Exception):
        await websocket.close(_CLOSE_NORMAL)


def openenv_fallback(service: EnvService) -> FallbackHandler:
    """The ``/ws`` fallback handler speaking OpenEnv for ``service``.

    The environment's tools are collected here, so a tool whose signature cannot be
    described fails when the app is built, not at the first ``tools/call``.
    """
    tools = tools_of(service.env_type)

    async def handler(websocket: WebSocket) -> None:
        await serve_openenv(websocket, service, tools)

    return handler

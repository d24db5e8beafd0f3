"""OpenEnv clients on WebSockets: ``/ws`` without a corral subprotocol, and ``/mcp``.

One connection drives one session through a link of :mod:`corral.server.openenv_link`
(frames in strict request/reply order, since OpenEnv has no request ids). The session
is opened through the session manager (so it counts against capacity, is reaped when
idle and is closed when the socket goes) unless the client attaches to a session it
created over HTTP with ``/ws?session_id=<id>`` (OpenEnv 0.10's ``MCPToolClient`` does):
the WebSocket then drives that same environment instance, one WebSocket per session,
and the session outlives the socket (an ``openenv/session/close`` meanwhile takes effect
when the socket goes).

Lifecycle and envelope:

* a corral environment keeps corral's rules: a ``step`` before the first ``reset`` or
  after the episode ended (unless it auto-resets) is refused with ``EXECUTION_ERROR``
  (``corral_code`` ``RESET_REQUIRED`` / ``EPISODE_ENDED``) and the session stays usable.
  Observations use OpenEnv 0.3's layout plus a top-level ``metadata`` (which OpenEnv 0.10
  clients read); a client that sends ``X-OpenEnv-Version: 0.10`` (``EnvClient(...,
  headers=...)``) or attaches by ``session_id`` (only 0.10 does) also gets ``metadata``
  nested in ``observation``, as 0.10's server sends it;
* an OpenEnv environment gets OpenEnv's semantics and the envelope of the installed
  OpenEnv release, frame for frame (see :class:`~corral.server.openenv_link.PeerLink`).

``/mcp`` as a WebSocket is OpenEnv's raw JSON-RPC channel: one session per connection,
JSON-RPC objects in and out without the ``{"type": ...}`` envelope.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.contract.tools import tools_of
from corral.errors import CorralError, ErrorCode
from corral.protocol.codecs import JsonCodec
from corral.protocol.jsonrpc import RpcCode, rpc_error
from corral.protocol.openenv import OpenEnvCode, error_frame, is_fatal, peer_error
from corral.server.openenv_link import (
    LinkRegistry,
    LockstepLink,
    capacity_message,
)
from corral.server.service import EnvService
from corral.server.ws import FallbackHandler

VERSION_HEADER = "X-OpenEnv-Version"
"""A client naming OpenEnv 0.10 or later here gets 0.10's observation layout."""

_CLOSE_NORMAL = 1000
_REGISTRIES: weakref.WeakKeyDictionary[EnvService, LinkRegistry] = weakref.WeakKeyDictionary()


def registry_of(service: EnvService) -> LinkRegistry:
    """The one :class:`LinkRegistry` of ``service`` (shared by the WS and HTTP routes).

    The environment's tools are collected here, so a tool whose signature cannot be
    described fails when the app is built, not at the first ``tools/call``.
    """
    registry = _REGISTRIES.get(service)
    if registry is None:
        registry = _REGISTRIES[service] = LinkRegistry(service, tools_of(service.env_type))
    return registry


def wants_nested_metadata(websocket: WebSocket) -> bool:
    """True when the client asked for OpenEnv 0.10's observation layout."""
    version = websocket.headers.get(VERSION_HEADER, "")
    parts = version.strip().split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (0, 4)
    except (ValueError, IndexError):
        return False


def open_failure(registry: LinkRegistry, exc: CorralError) -> dict[str, Any]:
    """The frame reporting that a session could not be opened."""
    if registry.runtime is None:
        return error_frame(exc)
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


async def serve_openenv(websocket: WebSocket, registry: LinkRegistry) -> None:
    """Run one OpenEnv ``/ws`` connection until the client closes or the session ends."""
    await websocket.accept()
    codec = JsonCodec()
    wanted = websocket.query_params.get("session_id")
    attached: str | None = None
    if wanted:
        try:
            link = registry.attach(wanted)
        except KeyError as exc:
            problem = str(exc.args[0])
            frame = (
                peer_error(problem, OpenEnvCode.SESSION_ERROR)
                if registry.runtime is not None
                else error_frame(_session_error(problem))
            )
            await _finish(websocket, codec, frame)
            return
        attached = wanted
    else:
        try:
            link = await registry.start(_address(websocket))
        except CorralError as exc:
            # OpenEnv reports a full server (or a failing factory) after accepting: one
            # error frame, then close 1000.
            await _finish(websocket, codec, open_failure(registry, exc))
            return
    if isinstance(link, LockstepLink):
        link.nested_metadata = attached is not None or wants_nested_metadata(websocket)
    reason = "the OpenEnv client disconnected"
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            text = message.get("text")
            raw: str | bytes = text if text is not None else message.get("bytes") or b""
            async with link.lock:
                out = await link.frame(raw)
            if out is None:
                reason = "closed by the OpenEnv client"
                break
            await websocket.send_text(codec.encode(out))
            if is_fatal(out):
                reason = f"ended after {out['data'].get('corral_code', out['data']['code'])}"
                break
    except WebSocketDisconnect:
        pass
    finally:
        if attached is not None:
            await registry.detach(attached)
        else:
            await link.close(reason)
    with contextlib.suppress(Exception):
        await websocket.close(_CLOSE_NORMAL)


def _address(websocket: WebSocket) -> str:
    """The client address a WebSocket's session counts for (the per-client limit)."""
    return websocket.client.host if websocket.client is not None else ""


def _session_error(text: str) -> CorralError:
    from corral.errors import UnknownSession

    return UnknownSession(text)


async def _finish(websocket: WebSocket, codec: JsonCodec, frame: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_text(codec.encode(frame))
        await websocket.close(_CLOSE_NORMAL)


async def serve_mcp_socket(websocket: WebSocket, registry: LinkRegistry) -> None:
    """Run one ``/mcp`` WebSocket: raw JSON-RPC on a session of its own."""
    await websocket.accept()
    codec = JsonCodec()
    try:
        link = await registry.start(_address(websocket))
    except CorralError as exc:
        data = {k: v for k, v in exc.details.items() if k in ("active_sessions", "max_sessions")}
        reason = capacity_message(exc) if data else exc.message
        body = _rpc_error(registry, RpcCode.SERVER_ERROR, reason, data or None)
        await _finish(websocket, codec, body)
        return
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            text = message.get("text")
            raw: str | bytes = text if text is not None else message.get("bytes") or b""
            try:
                payload = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                out = _rpc_error(registry, RpcCode.PARSE_ERROR, f"Parse error: {exc}")
            else:
                async with link.lock:
                    out = await link.answer_rpc(payload)
            await websocket.send_text(codec.encode(out))
    except WebSocketDisconnect:
        pass
    finally:
        await link.close("the MCP WebSocket closed")
    with contextlib.suppress(Exception):
        await websocket.close(_CLOSE_NORMAL)


def _rpc_error(
    registry: LinkRegistry, code: RpcCode, message: str, data: Any = None
) -> dict[str, Any]:
    if registry.runtime is not None:
        return registry.runtime.rpc_error(code, message, None, data)
    return rpc_error(None, code, message, data)


def openenv_fallback(service: EnvService) -> FallbackHandler:
    """The ``/ws`` fallback handler speaking OpenEnv for ``service``."""
    registry = registry_of(service)

    async def handler(websocket: WebSocket) -> None:
        await serve_openenv(websocket, registry)

    return handler


__all__ = [
    "VERSION_HEADER",
    "openenv_fallback",
    "registry_of",
    "serve_mcp_socket",
    "serve_openenv",
    "wants_nested_metadata",
]

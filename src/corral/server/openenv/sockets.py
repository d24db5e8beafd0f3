"""OpenEnv clients on WebSockets: ``/ws`` without a corral subprotocol, and ``/mcp``.

One connection drives one session through a link (:mod:`.links`; frames in strict
request/reply order, since OpenEnv has no request ids). The session is opened through
the session manager (so it counts against capacity, is reaped when idle and is closed
when the socket goes) unless the client attaches to a session it created over HTTP with
``/ws?session_id=<id>`` (OpenEnv 0.10's ``MCPToolClient`` does): the WebSocket then
drives that same environment instance, one WebSocket per session, and the session
outlives the socket (an ``openenv/session/close`` meanwhile takes effect when the socket
goes).

Lifecycle and envelope:

* a corral environment keeps corral's rules: a ``step`` before the first ``reset`` or
  after the episode ended (unless it auto-resets) is refused with ``EXECUTION_ERROR``
  (``corral_code`` ``RESET_REQUIRED`` / ``EPISODE_ENDED``) and the session stays usable.
  Observations use OpenEnv 0.3's layout plus a top-level ``metadata`` (which OpenEnv 0.10
  clients read); a client that sends ``X-OpenEnv-Version: 0.10`` (``EnvClient(...,
  headers=...)``) or attaches by ``session_id`` (only 0.10 does) also gets ``metadata``
  nested in ``observation``, as 0.10's server sends it;
* an OpenEnv environment gets OpenEnv's semantics and the envelope of the installed
  OpenEnv release, frame for frame (see :class:`~corral.server.openenv.links.PeerLink`).

``/mcp`` as a WebSocket is OpenEnv's raw JSON-RPC channel: one session per connection,
JSON-RPC objects in and out without the ``{"type": ...}`` envelope.

OpenEnv knows no ``going_away`` notice: when the server drains, these sockets keep
working until the drain's deadline and are then closed normally (1000), as OpenEnv's own
server closes them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.errors import CorralError
from corral.protocol.codecs import JsonCodec
from corral.protocol.jsonrpc import RpcCode
from corral.protocol.openenv import is_fatal
from corral.server.openenv.links import OpenEnvLink, capacity_message, client_address
from corral.server.openenv.personality import Personality

VERSION_HEADER = "X-OpenEnv-Version"
"""A client naming OpenEnv 0.10 or later here gets 0.10's observation layout."""

_CLOSE_NORMAL = 1000


def wants_nested_metadata(websocket: WebSocket) -> bool:
    """True when the client asked for OpenEnv 0.10's observation layout."""
    version = websocket.headers.get(VERSION_HEADER, "")
    parts = version.strip().split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (0, 4)
    except (ValueError, IndexError):
        return False


async def serve_openenv(websocket: WebSocket, personality: Personality) -> None:
    """Run one OpenEnv ``/ws`` connection until the client closes or the session ends."""
    registry = personality.registry
    await websocket.accept()
    codec = JsonCodec()
    wanted = websocket.query_params.get("session_id")
    attached: str | None = None
    link: OpenEnvLink
    if wanted:
        try:
            link = registry.attach(wanted)
        except KeyError as exc:
            await _finish(websocket, codec, personality.attach_failure(str(exc.args[0])))
            return
        attached = wanted
    else:
        try:
            link = await registry.start(client_address(websocket))
        except CorralError as exc:
            # OpenEnv reports a full server (or a failing factory) after accepting: one
            # error frame, then close 1000.
            await _finish(websocket, codec, personality.open_failure(exc))
            return
    link.speak(nested_metadata=attached is not None or wants_nested_metadata(websocket))
    reason = "the OpenEnv client disconnected"
    try:
        async with _carrying(websocket, personality):
            while (raw := await _receive(websocket)) is not None:
                async with link.lock:
                    out = await link.frame(raw)
                if out is None:
                    reason = "closed by the OpenEnv client"
                    break
                await websocket.send_text(codec.encode(out))
                if is_fatal(out):
                    reason = f"ended after {out['data'].get('corral_code', out['data']['code'])}"
                    break
    finally:
        if attached is not None:
            await registry.detach(attached)
        else:
            await link.close(reason)
    with contextlib.suppress(Exception):
        await websocket.close(_CLOSE_NORMAL)


async def _receive(websocket: WebSocket) -> str | bytes | None:
    """The next frame's payload as sent (text or bytes), or None once the client is gone."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    text = message.get("text")
    return text if text is not None else message.get("bytes") or b""


@contextlib.asynccontextmanager
async def _carrying(websocket: WebSocket, personality: Personality) -> AsyncIterator[None]:
    """The span in which a socket carries a session: the drain may close it (1000) at its
    deadline, and the client's going away ends the span quietly, as does our own close."""
    closers = personality.service.drainer.closers
    closer = _Closer(websocket)
    closers.add(closer)
    try:
        yield
    except WebSocketDisconnect:
        pass
    except RuntimeError:
        if not closer.closed:  # Starlette's "send after close": ours, at the deadline
            raise
    finally:
        closers.discard(closer)


class _Closer:
    """Closes one socket with 1000 at the drain's deadline; its loop then ends (a reply
    it was about to send is dropped: its session is closed already)."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.closed = False

    async def __call__(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self.websocket.close(_CLOSE_NORMAL)


async def _finish(websocket: WebSocket, codec: JsonCodec, frame: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_text(codec.encode(frame))
        await websocket.close(_CLOSE_NORMAL)


async def serve_mcp_socket(websocket: WebSocket, personality: Personality) -> None:
    """Run one ``/mcp`` WebSocket: raw JSON-RPC on a session of its own."""
    await websocket.accept()
    codec = JsonCodec()
    try:
        link = await personality.registry.start(client_address(websocket))
    except CorralError as exc:
        data = {k: v for k, v in exc.details.items() if k in ("active_sessions", "max_sessions")}
        reason = capacity_message(exc) if data else exc.message
        body = personality.rpc_error(RpcCode.SERVER_ERROR, reason, data or None)
        await _finish(websocket, codec, body)
        return
    try:
        async with _carrying(websocket, personality):
            while (raw := await _receive(websocket)) is not None:
                try:
                    payload = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    out = personality.rpc_error(RpcCode.PARSE_ERROR, f"Parse error: {exc}")
                else:
                    async with link.lock:
                        out = await link.answer_rpc(payload)
                await websocket.send_text(codec.encode(out))
    finally:
        await link.close("the MCP WebSocket closed")
    with contextlib.suppress(Exception):
        await websocket.close(_CLOSE_NORMAL)


__all__ = ["VERSION_HEADER", "serve_mcp_socket", "serve_openenv", "wants_nested_metadata"]

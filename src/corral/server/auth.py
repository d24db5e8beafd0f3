"""Bearer-token authentication for every route and the WebSocket handshake.

A pure ASGI middleware, so it guards whatever the app mounts (the corral routes, the
OpenEnv routes, the docs) without each route having to remember it. A WebSocket without
the right token is refused at the handshake with HTTP 401, before it is accepted, so an
unauthenticated peer never reaches the protocol.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from corral.auth import bearer_matches
from corral.errors import Unauthorized
from corral.protocol.messages import ErrorReply


class BearerAuth:
    """Require ``Authorization: Bearer <token>`` on every HTTP request and WebSocket."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass authorised requests to the app; answer the others with 401."""
        if scope["type"] not in ("http", "websocket") or self._authorised(scope):
            await self.app(scope, receive, send)
            return
        response = _denial(scope)
        if scope["type"] == "http":
            await response(scope, receive, send)
            return
        websocket = WebSocket(scope, receive, send)
        if "websocket.http.response" in scope.get("extensions", {}):
            await websocket.send_denial_response(response)
        else:  # the server cannot send an HTTP response: refuse the handshake with a close
            await websocket.close(code=1008, reason="unauthorized")

    def _authorised(self, scope: Scope) -> bool:
        header = _header(scope, b"authorization")
        return bearer_matches(header, self._token)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            decoded: str = value.decode("latin-1")
            return decoded
    return None


def _denial(scope: Scope) -> JSONResponse:
    given = _header(scope, b"authorization") is not None
    error = Unauthorized(
        "wrong bearer token" if given else "this server requires a bearer token",
        details={
            "fix": "send 'Authorization: Bearer <token>' (corral clients: token= or $CORRAL_TOKEN)"
        },
    )
    return JSONResponse(
        ErrorReply.of(error).to_wire(),
        status_code=401,
        headers={"WWW-Authenticate": 'Bearer realm="corral"'},
    )

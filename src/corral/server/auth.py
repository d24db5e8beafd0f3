"""Access to every route and WebSocket: the bearer token, the browser's Origin, the Host.

:class:`AccessGuard` is a pure ASGI middleware in front of everything the app mounts (the
corral routes, the OpenEnv routes, the docs, the web UI), so no route has to remember
it. It applies the rules of :mod:`corral.protocol.access` — the same function the
WebSocket transports call in their upgrade decision — to every request:

* **Host** (DNS rebinding): on a loopback connection, an IP address, ``localhost`` or a
  name of ``ServerConfig.allowed_hosts``; else 403 ``FORBIDDEN``;
* **Origin**: a WebSocket, or a state-changing request (POST, PUT, PATCH, DELETE), sent
  by a browser page must come from the server's own origin or one of
  ``ServerConfig.allowed_origins``; else 403 ``FORBIDDEN``. Non-browser clients send no
  ``Origin`` and pass;
* **credentials** (with a token): exactly one ``Authorization: Bearer <token>``, or the
  web UI's cookie from the server's own origin (browsers cannot set ``Authorization`` on
  a WebSocket: the UI exchanges the token once, ``POST /auth``, for an HttpOnly,
  SameSite=Strict, short-lived cookie; see :func:`corral.auth.issue_cookie`); else 401;
* **content type**: a state-changing request with a body must declare JSON (415
  ``BAD_FRAME``) — the types a page can post cross-origin without a preflight never are.

A refused WebSocket is refused at the handshake, before it is accepted, so an
unauthenticated or foreign peer never reaches the protocol.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from corral.auth import COOKIE_NAME, COOKIE_TTL_S, bearer_matches, issue_cookie
from corral.protocol.access import (
    AccessPolicy,
    Refusal,
    RequestHead,
    check_access,
    check_content_type,
    check_credentials,
)
from corral.server.http_errors import error_response


def request_head(scope: Scope) -> RequestHead:
    """The head of an HTTP request or WebSocket upgrade, as the access rules read it."""
    client, server = scope.get("client"), scope.get("server")
    websocket = scope["type"] == "websocket"
    return RequestHead.of(
        "GET" if websocket else scope.get("method", "GET"),
        scope.get("path", ""),
        scope.get("headers", []),
        client=client[0] if client else "",
        local=server[0] if server else None,
        websocket=websocket,
    )


async def refuse(websocket: WebSocket, refusal: Refusal) -> None:
    """Refuse a WebSocket at the handshake: the refusal's status, headers and body, or
    (when the server cannot send an HTTP answer) a close with its code."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        response = JSONResponse(
            refusal.wire(), status_code=refusal.status, headers=dict(refusal.headers)
        )
        await websocket.send_denial_response(response)
    else:
        await websocket.close(code=refusal.close_code, reason=refusal.error.message[:120])


class AccessGuard:
    """The access rules on every HTTP request and WebSocket (see the module docstring).

    Args:
        app: the application to guard.
        policy: the rules (``ServerConfig.access()``).
        public: paths served without credentials (the web UI's static files, which hold
            no data and must load before the UI can ask for the token); Host and Origin
            still apply.
        count: told the code of every refusal (the server's metrics).
    """

    def __init__(
        self,
        app: ASGIApp,
        policy: AccessPolicy,
        public: Callable[[str], bool] | None = None,
        count: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.policy = policy
        self._public = public
        self._count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass allowed requests to the app; answer the others with their refusal."""
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        head = request_head(scope)
        public = kind == "http" and self._public is not None and self._public(head.path)
        refusal = check_access(head, self.policy, public=public)
        if refusal is None and kind == "http":
            refusal = check_content_type(head)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        if self._count is not None:
            self._count(str(refusal.error.code))
        if kind == "http":
            response = error_response(refusal.error, refusal.status, headers=dict(refusal.headers))
            await response(scope, receive, send)
        else:
            await refuse(WebSocket(scope, receive, send), refusal)


def auth_router(token: str) -> APIRouter:
    """``POST /auth`` (bearer token → browser cookie) and ``DELETE /auth`` (forget it)."""
    router = APIRouter(tags=["auth"])

    @router.post(
        "/auth",
        status_code=204,
        summary="Exchange the bearer token for a browser cookie",
        description="Send the token once in 'Authorization: Bearer <token>'; the reply sets "
        f"an HttpOnly, SameSite=Strict cookie valid {COOKIE_TTL_S} s, accepted by every "
        "route and the WebSocket from this origin.",
    )
    async def exchange(request: Request) -> Response:
        # The header itself, not a cookie: a cookie must not renew itself forever.
        if not bearer_matches(request.headers.get("authorization"), token):
            refusal = check_credentials(request_head(request.scope), AccessPolicy(token))
            assert refusal is not None  # no (or a wrong) bearer header: refused
            return error_response(refusal.error, refusal.status, headers=dict(refusal.headers))
        response = Response(status_code=204, headers={"Cache-Control": "no-store"})
        response.set_cookie(
            COOKIE_NAME,
            issue_cookie(token),
            max_age=COOKIE_TTL_S,
            path="/",
            httponly=True,
            samesite="strict",
            secure=_https(request),
        )
        return response

    @router.delete("/auth", status_code=204, summary="Forget the browser cookie")
    async def forget() -> Response:
        response = Response(status_code=204)
        response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
        return response

    return router


def _https(request: Request) -> bool:
    """The browser reached us over TLS (directly, or through a proxy that says so)."""
    forwarded = request.headers.get("x-forwarded-proto", "")
    return request.url.scheme == "https" or forwarded.split(",")[0].strip() == "https"

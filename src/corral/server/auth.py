"""Bearer-token authentication for every route and the WebSocket handshake.

A pure ASGI middleware, so it guards whatever the app mounts (the corral routes, the
OpenEnv routes, the docs) without each route having to remember it. A WebSocket without
the right token is refused at the handshake with HTTP 401, before it is accepted, so an
unauthenticated peer never reaches the protocol.

Browsers cannot set ``Authorization`` on a WebSocket, so with the web UI on the server
also accepts the cookie a browser gets from ``POST /auth`` (the token sent once, in the
header; see :func:`corral.auth.issue_cookie`): HttpOnly, SameSite=Strict, short-lived,
and only from the server's own origin. :func:`authorised` is the one check; any
transport (this middleware, a WebSocket server outside ASGI) calls it with the
request's headers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from corral.auth import COOKIE_NAME, COOKIE_TTL_S, bearer_matches, cookie_matches, issue_cookie
from corral.errors import Unauthorized
from corral.protocol.messages import ErrorReply

Headers = Iterable[tuple[bytes, bytes]]


def authorised(headers: Headers, token: str, *, cookies: bool = False) -> bool:
    """True when a request with ``headers`` may proceed on a server requiring ``token``.

    It carries ``Authorization: Bearer <token>``, or, when ``cookies`` is on, a valid
    browser cookie sent from the server's own origin (a page elsewhere cannot use it).
    """
    found = dict(_pick(headers, (b"authorization", b"cookie", b"origin", b"host")))
    if bearer_matches(found.get(b"authorization"), token):
        return True
    if not cookies or not _same_origin(found.get(b"origin"), found.get(b"host")):
        return False
    return cookie_matches(_cookie(found.get(b"cookie"), COOKIE_NAME), token)


def _pick(headers: Headers, names: tuple[bytes, ...]) -> Iterable[tuple[bytes, str]]:
    for key, value in headers:
        lowered = key.lower()
        if lowered in names:
            yield lowered, value.decode("latin-1")


def _same_origin(origin: str | None, host: str | None) -> bool:
    """No Origin (a same-origin GET) or an Origin naming this very host."""
    if origin is None:
        return True
    return host is not None and urlsplit(origin).netloc.lower() == host.lower()


def _cookie(header: str | None, name: str) -> str | None:
    if not header:
        return None
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


class BearerAuth:
    """Require ``Authorization: Bearer <token>`` on every HTTP request and WebSocket.

    Args:
        app: the application to guard.
        token: the bearer token.
        cookies: also accept the browser cookie issued by ``POST /auth``.
        public: paths served without authentication (the web UI's static files, which
            hold no data and must load before the UI can ask for the token).
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        *,
        cookies: bool = False,
        public: Callable[[str], bool] | None = None,
    ) -> None:
        self.app = app
        self._token = token
        self._cookies = cookies
        self._public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass authorised requests to the app; answer the others with 401."""
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
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

    def _allowed(self, scope: Scope) -> bool:
        if self._public is not None and scope["type"] == "http" and self._public(scope["path"]):
            return True
        return authorised(scope.get("headers", []), self._token, cookies=self._cookies)


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
            return _denial(request.scope)
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

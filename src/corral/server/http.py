"""Plain HTTP routes (liveness, readiness, schema, metadata) and how every HTTP error reads.

Every HTTP error of a corral server is JSON ``{"detail", "code", "message", "details"}``
with a stable ``code`` (:class:`~corral.errors.ErrorCode`): the routes' own errors, the
access and body refusals of the middlewares, and what the framework raises on its own —
an unknown route or method (404/405, ``UNKNOWN_TYPE``), a body that fails the route's
model (422, ``BAD_MESSAGE``; ``detail`` is the list of field errors, as FastAPI's), any
other ``HTTPException``, and an unexpected exception (500, ``INTERNAL_ERROR``, logged,
nothing of it sent). :func:`error_response` is the one renderer: it bounds what an error
echoes of its request as the protocol does (:meth:`~corral.protocol.messages.ErrorReply.of`:
messages to 2,048 characters, strings in details to 256, lists and maps to 64 entries) and
encodes whatever the details hold (bytes, NaN) without failing.
:func:`install_errors` puts the framework's handlers on an app.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from corral.errors import (
    BadFrame,
    BadMessage,
    CorralError,
    Forbidden,
    FrameTooLarge,
    InternalError,
    NotReady,
    RequestTimeout,
    TooManyConnections,
    Unauthorized,
    UnknownType,
    bounded_input,
)
from corral.protocol.fields import clip, echo
from corral.protocol.messages import ErrorReply
from corral.server.service import EnvService

log = logging.getLogger("corral.server")

_ERROR_BY_STATUS: dict[int, type[CorralError]] = {
    400: BadMessage,
    401: Unauthorized,
    403: Forbidden,
    404: UnknownType,
    405: UnknownType,
    408: RequestTimeout,
    413: FrameTooLarge,
    415: BadFrame,
    422: BadMessage,
    429: TooManyConnections,
    501: UnknownType,
    503: NotReady,
}
"""The error class of an ``HTTPException`` by its status (other 4xx: ``BAD_MESSAGE``,
other 5xx: ``INTERNAL_ERROR``)."""


def error_body(error: CorralError, detail: Any = None) -> dict[str, Any]:
    """The JSON body of an HTTP error, with what it echoes bounded.

    ``detail`` replaces the message in ``detail`` (FastAPI's list of field errors for 422).
    """
    reply = ErrorReply.of(error)
    return {
        "detail": reply.message if detail is None else echo(detail),
        "code": reply.code,
        "message": reply.message,
        "details": reply.details,
    }


class ErrorResponse(JSONResponse):
    """A JSON error answer whose body encodes whatever its details hold (bytes, NaN,
    objects: as bounded reprs or null) instead of failing the answer."""

    def render(self, content: Any) -> bytes:
        """``content`` as JSON bytes."""
        return orjson.dumps(content, default=_plain)


def error_response(
    error: CorralError,
    status: int,
    *,
    detail: Any = None,
    headers: Mapping[str, str] | None = None,
) -> ErrorResponse:
    """The HTTP answer carrying ``error`` with ``status`` (see the module docstring)."""
    return ErrorResponse(error_body(error, detail), status_code=status, headers=headers)


def _plain(value: Any) -> Any:
    """What orjson cannot encode, as an error echoes it (a bounded repr)."""
    return clip(repr(value)) if isinstance(value, bytes | bytearray) else bounded_input(value)


def http_exception_response(exc: HTTPException) -> Response:
    """The answer to an ``HTTPException`` (the framework's 404/405, a route's own)."""
    status = exc.status_code
    default = BadMessage if status < 500 else InternalError
    cls = _ERROR_BY_STATUS.get(status, default)
    message = exc.detail if isinstance(exc.detail, str) else f"HTTP {status}"
    if status in (404, 405) and message in ("Not Found", "Method Not Allowed"):
        message = f"{message}: no route for this method and path"
    return error_response(cls(message), status, detail=exc.detail, headers=exc.headers)


def validation_response(exc: RequestValidationError) -> Response:
    """The 422 answer to a body or parameter that fails the route's model."""
    items = []
    for err in list(exc.errors())[:64]:
        item: dict[str, Any] = {
            "type": str(err.get("type", "")),
            "loc": [str(part) for part in err.get("loc", ())][:16],
            "msg": clip(str(err.get("msg", "")), 512),
        }
        if "input" in err:
            item["input"] = bounded_input(err["input"])
        items.append(item)
    first = items[0] if items else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"]) or "request"
    error = BadMessage(f"invalid request: {where}: {first['msg']}", details={"errors": items})
    return error_response(error, 422, detail=items)


def install_errors(app: FastAPI) -> None:
    """Render the framework's own errors (and any unexpected exception) as structured
    JSON on ``app`` (see the module docstring)."""

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return http_exception_response(exc)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return validation_response(exc)

    async def on_crash(request: Request, exc: Exception) -> Response:
        # Logged with its traceback by the server; the client learns only that it happened.
        log.error("unexpected error answering %s %s", request.method, request.url.path)
        error = InternalError(
            "the server failed answering this request (see its log)",
            details={"exception": type(exc).__name__},
        )
        return error_response(error, 500)

    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(Exception, on_crash)


def info_router(service: EnvService) -> APIRouter:
    """``/health``, ``/ready``, ``/schema`` and ``/metadata`` for ``service``."""
    router = APIRouter()

    @router.get("/health")
    async def health() -> dict[str, str]:
        """Liveness: the process serves requests."""
        return {"status": "healthy"}

    @router.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 while a new session can be accepted now, else 503."""
        manager = service.manager
        ready, reason = service.readiness()
        body: dict[str, Any] = {
            "ready": ready,
            "reason": reason,
            "active_sessions": manager.active,
            "max_sessions": service.config.max_sessions,
            "instance": service.instance,
            "server_id": service.server_id,
        }
        headers = {} if body["ready"] else {"Retry-After": "1"}
        return JSONResponse(body, status_code=200 if body["ready"] else 503, headers=headers)

    @router.get("/schema")
    async def schema() -> dict[str, Any]:
        """The JSON Schemas of Action, Observation and the environment's real State."""
        return {
            **service.contract.schemas,
            "contract_version": service.contract.version,
            "fingerprint": service.fingerprint,
        }

    @router.get("/metadata")
    async def metadata() -> dict[str, Any]:
        """The environment's name, description, version and contract."""
        env = service.env_type
        return {
            "name": service.contract.name,
            "description": env.description,
            "readme_content": getattr(env, "readme", None),
            "version": service.contract.version,
            "author": getattr(env, "author", None),
            "documentation_url": getattr(env, "documentation_url", None),
            "contract_version": service.contract.version,
            "fingerprint": service.fingerprint,
            "auto_reset": env.auto_reset,
        }

    return router


__all__ = [
    "ErrorResponse",
    "error_body",
    "error_response",
    "http_exception_response",
    "info_router",
    "install_errors",
    "validation_response",
]

"""corral's HTTP error answer: the body, the status each error code gets, and the one
renderer every HTTP error goes through.

Every HTTP error of a corral server is JSON ``{"detail", "code", "message", "details"}``
with ``code`` corral's stable error code (:mod:`corral.errors`): the routes' own errors
(``422`` for invalid input, ``detail`` then being the validation error list, as
FastAPI's; ``409`` for lifecycle errors; ``404``/``410`` for unknown/lost sessions;
``421`` (Misdirected Request) for a session another server of the fleet holds
(``details.server`` names it); ``413`` for an oversized request; ``429``/``503`` +
``Retry-After`` when a limit is reached or the server drains; ``504`` for a step
timeout; ``500`` when the environment raised), the access and
body refusals of the middlewares, and what the framework raises on its own — an unknown
route or method (404/405, ``UNKNOWN_TYPE``), a body that fails the route's model (422,
``BAD_MESSAGE``), any other ``HTTPException``, and an unexpected exception (500,
``INTERNAL_ERROR``, logged, nothing of it sent). One exception: on OpenEnv's own routes
(``/reset``, ``/step``, ...) a body that fails the route's model is answered with
OpenEnv's 422 body, FastAPI's ``{"detail": [...]}`` alone, bounded the same way, because
OpenEnv's clients read exactly that.

:func:`error_response` is the one renderer: it bounds what an error echoes of its request
as the protocol does (:meth:`corral.protocol.messages.ErrorReply.of`: messages to 2,048
characters, strings in details to 256, lists and maps to 64 entries) and encodes whatever
the details hold (bytes, NaN) without failing. :func:`install_errors` puts the
framework's handlers on an app.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from corral.errors import (
    BadFrame,
    BadMessage,
    CorralError,
    ErrorCode,
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
from corral.protocol import messages
from corral.protocol.fields import clip, echo

log = logging.getLogger("corral.server")

HTTP_STATUS: dict[str, int] = {
    ErrorCode.BAD_FRAME: 400,
    ErrorCode.BAD_MESSAGE: 422,
    ErrorCode.INVALID_ACTION: 422,
    ErrorCode.INVALID_ARGUMENT: 422,
    ErrorCode.FRAME_TOO_LARGE: 413,
    ErrorCode.RESET_REQUIRED: 409,
    ErrorCode.EPISODE_ENDED: 409,
    ErrorCode.SESSION_BUSY: 409,
    ErrorCode.UNKNOWN_SESSION: 404,
    ErrorCode.SESSION_LOST: 410,
    ErrorCode.SESSION_ELSEWHERE: 421,
    ErrorCode.NOT_READY: 503,
    ErrorCode.CAPACITY_REACHED: 503,
    ErrorCode.TOO_MANY_SESSIONS: 503,
    ErrorCode.TOO_MANY_CONNECTIONS: 429,
    ErrorCode.STEP_TIMEOUT: 504,
}
"""The status of each error code when the caller names none; any other is 500."""

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


class ErrorBody(BaseModel):
    """An error answer of corral's routes, for the OpenAPI document; ``code`` is corral's
    stable error code."""

    detail: Any = Field(description="The message, or the validation errors for a 422.")
    code: str | None = None
    message: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in [
        (400, "The request could not be read."),
        (404, "No such session."),
        (409, "The session's lifecycle does not allow this now (e.g. step before reset)."),
        (410, "The session is gone (reaped, timed out); the reason is in the message."),
        (413, "The request is larger than the server's frame limit."),
        (421, "The session lives on another server of the fleet (details.server)."),
        (500, "The environment raised; the session stays usable."),
        (503, "The server is at capacity or draining; retry after Retry-After seconds."),
        (504, "The environment overran the step timeout; the session was closed."),
    ]
}
"""Every status :func:`error_response` can answer with, for the OpenAPI document."""


def error_body(error: CorralError, detail: Any = None) -> dict[str, Any]:
    """The JSON body of an HTTP error, with what it echoes bounded.

    ``detail`` replaces the message in ``detail`` (FastAPI's list of field errors for 422).
    """
    reply = messages.ErrorReply.of(error)
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
    status: int | None = None,
    *,
    detail: Any = None,
    headers: Mapping[str, str] | None = None,
) -> ErrorResponse:
    """The HTTP answer carrying ``error`` (see the module docstring).

    Args:
        status: the HTTP status (default: :data:`HTTP_STATUS` by the error's code).
        detail: what ``detail`` says instead of the message; a 422 without one lists
            the error's ``details["errors"]`` (or the error itself) as FastAPI does.
        headers: the answer's headers (default: ``Retry-After: 1`` on a 429 or 503).
    """
    if status is None:
        status = HTTP_STATUS.get(str(error.code), 500)
    if status == 422 and detail is None:
        errors = error.details.get("errors")
        detail = (
            errors
            if isinstance(errors, list)
            else [{"type": str(error.code), "loc": ["body"], "msg": error.message}]
        )
    if headers is None and status in (429, 503):
        headers = {"Retry-After": "1"}
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


OPENENV_TAG = "OpenEnv"
"""The tag of OpenEnv's routes (:mod:`corral.server.openenv.routes`): their 422 is
OpenEnv's own body, ``{"detail": [...]}``, which its clients read."""


def validation_response(exc: RequestValidationError, *, openenv: bool = False) -> Response:
    """The 422 answer to a body or parameter that fails the route's model: FastAPI's list
    of errors, each item's ``input`` and ``ctx`` bounded; on OpenEnv's routes that list
    alone, as OpenEnv answers, elsewhere in corral's error body."""
    items = []
    for err in list(exc.errors())[:64]:
        item: dict[str, Any] = {
            "type": str(err.get("type", "")),
            "loc": [str(part) for part in err.get("loc", ())][:16],
            "msg": clip(str(err.get("msg", "")), 512),
        }
        if "input" in err:
            item["input"] = bounded_input(err["input"])
        if "ctx" in err:
            # As FastAPI encodes it (an exception in the context becomes its text).
            item["ctx"] = bounded_input(jsonable_encoder(err["ctx"]))
        items.append(item)
    if openenv:
        return JSONResponse({"detail": items}, 422)
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
        route = request.scope.get("route")
        tags = getattr(route, "tags", None) or ()
        return validation_response(exc, openenv=OPENENV_TAG in tags)

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


__all__ = [
    "ERROR_RESPONSES",
    "HTTP_STATUS",
    "OPENENV_TAG",
    "ErrorBody",
    "ErrorResponse",
    "error_body",
    "error_response",
    "http_exception_response",
    "install_errors",
    "validation_response",
]

"""corral's HTTP error answer: the body, and the status each error code gets.

Every HTTP route corral defines answers an error as JSON ``{"detail", "code", "message",
"details"}`` with ``code`` corral's stable error code (:mod:`corral.errors`): ``422`` for
invalid input (``detail`` is then the validation error list, as FastAPI's), ``409`` for
lifecycle errors, ``404``/``410`` for unknown/lost sessions, ``413`` for an oversized
request, ``429``/``503`` + ``Retry-After`` when a limit is reached, ``504`` for a step
timeout and ``500`` when the environment raised.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from corral.errors import CorralError, ErrorCode

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
    ErrorCode.CAPACITY_REACHED: 503,
    ErrorCode.TOO_MANY_SESSIONS: 503,
    ErrorCode.TOO_MANY_CONNECTIONS: 429,
    ErrorCode.STEP_TIMEOUT: 504,
}
"""The status of each error code; any other is 500."""


class ErrorReply(BaseModel):
    """An error answer of corral's routes; ``code`` is corral's stable error code.

    A body the web framework cannot even parse gets its plain ``{"detail"}`` (400).
    """

    detail: Any = Field(description="The message, or the validation errors for a 422.")
    code: str | None = None
    message: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorReply, "description": description}
    for status, description in [
        (400, "The request could not be read."),
        (404, "No such session."),
        (409, "The session's lifecycle does not allow this now (e.g. step before reset)."),
        (410, "The session is gone (reaped, timed out); the reason is in the message."),
        (413, "The request is larger than the server's frame limit."),
        (500, "The environment raised; the session stays usable."),
        (503, "The server is at capacity; retry after Retry-After seconds."),
        (504, "The environment overran the step timeout; the session was closed."),
    ]
}
"""Every status :func:`error_response` can answer with, for the OpenAPI document."""


def error_response(exc: CorralError) -> JSONResponse:
    """The HTTP error response for ``exc`` (status by code, see the module docstring)."""
    status = HTTP_STATUS.get(str(exc.code), 500)
    details = dict(exc.details)
    detail: Any = exc.message
    if status == 422:
        # A 422's detail is always FastAPI's list of errors, as the OpenAPI document says.
        errors = details.get("errors")
        detail = (
            errors
            if isinstance(errors, list)
            else [{"type": str(exc.code), "loc": ["body"], "msg": exc.message}]
        )
    body = {"detail": detail, "code": str(exc.code), "message": exc.message, "details": details}
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(body, status_code=status, headers=headers)


__all__ = ["ERROR_RESPONSES", "HTTP_STATUS", "ErrorReply", "error_response"]

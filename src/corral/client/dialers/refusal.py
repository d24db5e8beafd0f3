"""The error for a WebSocket handshake the server refused, whichever transport saw it."""

from __future__ import annotations

import contextlib

import orjson

from corral.errors import (
    CapacityReached,
    ConnectionLost,
    CorralError,
    Unauthorized,
    error_from_wire,
)


def refusal(status: int, body: bytes, retry_after: str | None) -> CorralError:
    """The error for a WebSocket handshake the server answered with HTTP ``status``.

    A structured body (``{code, message, details}``) becomes its own error class; the
    ``Retry-After`` header lands in ``details["retry_after_s"]``.
    """
    with contextlib.suppress(Exception):
        payload = orjson.loads(body)
        if isinstance(payload, dict) and "code" in payload:
            error = error_from_wire(payload)
            if retry_after is not None:
                error.details["retry_after_s"] = float(retry_after)
            return error
    if status == 503:
        return CapacityReached("server refused the connection: at capacity (HTTP 503)")
    if status == 401:
        return Unauthorized("server refused the connection: a bearer token is required (HTTP 401)")
    return ConnectionLost(
        f"server refused the WebSocket handshake with HTTP {status}",
        details={"status": status, "body": body[:500].decode(errors="replace")},
    )


__all__ = ["refusal"]

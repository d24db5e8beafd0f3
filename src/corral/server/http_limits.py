"""Limits on HTTP request bodies, for every route (issue 11.7, 11.12).

:class:`HttpLimits` is a pure ASGI middleware in front of every HTTP route (the OpenEnv
routes, ``/sessions``, ``/mcp``, the web UI):

* **size**: a body over ``max_frame_bytes`` is refused with 413 ``FRAME_TOO_LARGE`` as
  soon as its ``Content-Length`` says so, or — for a chunked body — as soon as the bytes
  read pass the limit. Up to ``DRAIN_BYTES`` more are read and dropped first, so that a
  client that writes its whole body before reading gets the answer rather than a reset
  connection; a body larger than that is answered at once and never read (the connection
  is then closed);
* **time**: the body must arrive within ``http_body_timeout_s`` (408), so a peer
  dribbling a body cannot hold a request open;
* **JSON**: a JSON body (or one with no content type, which FastAPI reads as JSON) must
  be strict UTF-8 JSON: ``NaN``, ``Infinity``, ``1e400`` (infinite as a double) — which
  Python's parser would let through to fail later as a 500 — and non-UTF-8 bytes get 400
  ``BAD_FRAME``. Plain invalid JSON is left to the route's own answer (422), and ``/mcp``
  keeps its JSON-RPC parse errors.

Error bodies are every HTTP error's (:func:`corral.server.http_errors.error_response`):
``detail``, ``code``, ``message``, ``details``.
"""

from __future__ import annotations

import asyncio
import json

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import runtime
from corral.errors import BadFrame, CorralError, FrameTooLarge, RequestTimeout
from corral.server.http_errors import error_response

_JSON_METHODS = frozenset({"POST", "PUT", "PATCH"})
DRAIN_BYTES = 1024 * 1024
"""How much of a refused body is read and dropped before the 413 (see the module docstring)."""


class HttpLimits:
    """Size, time and JSON checks on HTTP request bodies (see the module docstring).

    Args:
        app: the application behind.
        max_body_bytes: the longest body read.
        body_timeout_s: the time a whole body may take to arrive.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the body of an HTTP request while passing it on."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _Body(self, scope, receive, send)
        declared = body.header(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            if declared.isdigit() and int(declared) <= self.max_body_bytes + DRAIN_BYTES:
                await body.drain()
            await body.refuse(body.too_large(declared))
            return
        inner: Receive = body.receive
        if (
            scope["method"] in _JSON_METHODS
            and body.is_json()
            and not scope["path"].endswith("/mcp")
        ):
            data = await body.read_all()
            if body.answered:
                return
            error = _json_error(data)
            if error is not None:
                await body.refuse(error)
                return
            inner = body.replay(data)
        try:
            await self.app(scope, inner, body.send)
        except Exception:
            if not body.answered:
                raise
            # The app failed reading a body this middleware already refused: answered.


class _Body:
    """One request's body as the app reads it, with the limits applied."""

    def __init__(self, limits: HttpLimits, scope: Scope, receive: Receive, send: Send) -> None:
        self.limits = limits
        self.scope = scope
        self._receive = receive
        self._send = send
        self.read = 0
        self.answered = False
        """This middleware answered the request; the app's own answer is dropped."""
        self._started = False
        self._deadline: float | None = None

    def header(self, name: bytes) -> str | None:
        for key, value in self.scope.get("headers", []):
            if key.lower() == name:
                text: str = value.decode("latin-1").strip()
                return text
        return None

    def is_json(self) -> bool:
        kind = self.header(b"content-type")
        return kind is None or "json" in kind.split(";", 1)[0].lower()

    def too_large(self, size: str | int) -> FrameTooLarge:
        limit = self.limits.max_body_bytes
        return FrameTooLarge(
            f"request body of {size} bytes exceeds the limit of {limit}",
            details={"size": size, "limit": limit},
        )

    async def receive(self) -> Message:
        """The next body message; past the limit or the deadline, the answer is sent."""
        if self.answered:
            return {"type": "http.disconnect"}
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self.limits.body_timeout_s
        try:
            message = await runtime.wait_for(self._receive(), self._deadline - loop.time())
        except TimeoutError:
            await self.refuse(
                RequestTimeout(
                    f"the request body did not arrive within {self.limits.body_timeout_s} s",
                    details={"timeout_s": self.limits.body_timeout_s},
                ),
                408,
            )
            return {"type": "http.disconnect"}
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.limits.max_body_bytes:
                if message.get("more_body", False):
                    await self.drain()
                await self.refuse(self.too_large(f"more than {self.limits.max_body_bytes}"))
                return {"type": "http.disconnect"}
        return message

    async def drain(self) -> None:
        """Read and drop the rest of the body, up to ``DRAIN_BYTES`` and the deadline."""
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self.limits.body_timeout_s
        dropped = 0
        while dropped <= DRAIN_BYTES:
            try:
                message = await runtime.wait_for(self._receive(), self._deadline - loop.time())
            except TimeoutError:
                return
            if message["type"] != "http.request":
                return
            dropped += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    async def read_all(self) -> bytes:
        """The whole body (empty if refused meanwhile)."""
        parts: list[bytes] = []
        while True:
            message = await self.receive()
            if message["type"] != "http.request":
                return b""
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(parts)

    def replay(self, data: bytes) -> Receive:
        """A ``receive`` giving the app ``data`` (already read), then the real stream."""
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await self._receive()

        return receive

    async def send(self, message: Message) -> None:
        """The app's answer, unless this middleware answered already."""
        if self.answered:
            return
        if message["type"] == "http.response.start":
            self._started = True
        await self._send(message)

    async def refuse(self, error: CorralError, status: int | None = None) -> None:
        """Answer with ``error`` (once, if the app has not started its answer)."""
        if self.answered or self._started:
            self.answered = True
            return
        self.answered = True
        code = status or (413 if isinstance(error, FrameTooLarge) else 400)
        # The unread rest of the body makes the connection unusable for another request.
        response = error_response(error, code, headers={"connection": "close"})
        await response(self.scope, self._receive, self._send)


def _json_error(data: bytes) -> BadFrame | None:
    """The error for a body Python's lenient parser would take but strict JSON refuses.

    Plain invalid JSON is left to the route, which answers it in its own way.
    """
    if not data.strip():
        return None
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            return BadFrame(
                f"the request body is not UTF-8: {bad}", details={"fix": "send UTF-8 JSON"}
            )
        try:
            json.loads(data)  # accepts NaN, Infinity and numbers beyond a double
        except ValueError:
            return None
        return BadFrame(
            f"the request body is not strict JSON: {exc}",
            details={"fix": "send JSON without NaN, Infinity or numbers beyond a double"},
        )
    return None

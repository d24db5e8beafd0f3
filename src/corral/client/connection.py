"""One WebSocket connection to a corral server, carrying any number of sessions.

The connection owns the socket, the codec and the request tracker. ``request`` sends a
message with a fresh id and waits for the reply with that id; replies are matched by id,
so many requests (of many sessions) can be in flight at once, and a reply that arrives
after its caller timed out is dropped rather than handed to the next caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from corral import __version__
from corral.errors import (
    CapacityReached,
    ClientClosed,
    ConnectionLost,
    CorralError,
    FrameTooLarge,
    RequestTimeout,
    UnsupportedProtocol,
    error_from_wire,
)
from corral.protocol.client import RequestTracker
from corral.protocol.codecs import PROTOCOL, Codec, get_codec
from corral.protocol.messages import ContractRef

log = logging.getLogger("corral.client")


def ws_url(url: str) -> str:
    """Normalise a server URL to its WebSocket endpoint (``http`` → ``ws``, adds ``/ws``)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"unsupported URL scheme in {url!r}; use http(s):// or ws(s)://")
    path = parts.path.rstrip("/")
    if not path.endswith("/ws"):
        path = f"{path}/ws"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def http_url(url: str) -> str:
    """The HTTP base URL of a server given any of its URLs."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    path = path.removesuffix("/ws")
    return urlunsplit((scheme, parts.netloc, path, "", ""))


class Connection:
    """A ``corral/1`` connection: handshake, request/reply matching, clean shutdown."""

    def __init__(
        self,
        url: str,
        *,
        codec: str = "msgpack",
        connect_timeout: float = 10.0,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        max_frame_bytes: int = 64 * 1024 * 1024,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = ws_url(url)
        self.codec: Codec = get_codec(codec)
        self.connect_timeout = connect_timeout
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.max_frame_bytes = max_frame_bytes
        self.headers = headers or {}
        self.tracker = RequestTracker()
        self.welcome: dict[str, Any] = {}
        self._ws: ClientConnection | None = None
        self._waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self._lost: CorralError | None = None

    @property
    def connected(self) -> bool:
        """True while the socket is open and the handshake done."""
        return self._ws is not None and self._lost is None and not self._closed

    async def connect(
        self, contract: ContractRef | None = None, *, want_schemas: bool = False
    ) -> dict[str, Any]:
        """Open the socket and complete the handshake; return the ``welcome``.

        Raises:
            CapacityReached: the server refused the connection because it is full.
            ConnectionLost: the server could not be reached.
            ContractMismatch / UnsupportedProtocol: the handshake was refused.
        """
        if self._closed:
            raise ClientClosed("this connection was closed")
        try:
            self._ws = await connect(
                self.url,
                subprotocols=[self.codec.subprotocol],  # type: ignore[list-item]
                open_timeout=self.connect_timeout,
                ping_interval=self.ping_interval,
                ping_timeout=self.ping_timeout,
                max_size=self.max_frame_bytes,
                additional_headers=self.headers,
                compression=None,
                user_agent_header=f"corral/{__version__}",
            )
        except InvalidStatus as exc:
            raise _refusal(exc) from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise ConnectionLost(f"cannot connect to {self.url}: {exc}") from None
        if self._ws.subprotocol != self.codec.subprotocol:
            await self._ws.close()
            raise UnsupportedProtocol(
                f"{self.url} did not accept subprotocol {self.codec.subprotocol}",
                details={"accepted": self._ws.subprotocol},
            )
        self._lost = None
        self._reader = asyncio.create_task(self._read(self._ws), name="corral-client-reader")
        hello: dict[str, Any] = {
            "type": "hello",
            "protocol": PROTOCOL,
            "client": f"corral/{__version__}",
            "schemas": want_schemas,
        }
        if contract is not None:
            hello["contract"] = {"version": contract.version, "fingerprint": contract.fingerprint}
        self.welcome = await self.request(hello, timeout=self.connect_timeout)
        return self.welcome

    async def request(self, message: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Send ``message`` with a fresh id and return its reply.

        Raises:
            CorralError: the server's error reply, as its exception class.
            RequestTimeout: no reply within ``timeout`` (a late reply is then dropped).
            ConnectionLost: the connection failed before the reply came.
        """
        request_id = self.tracker.new(str(message.get("type")))
        message["id"] = request_id
        future = await self.send(message)
        try:
            reply = await _wait(future, timeout)
        except TimeoutError:
            self.forget(request_id)
            raise RequestTimeout(
                f"no reply to {message.get('type')!r} within {timeout:g} s",
                details={"timeout_s": timeout},
                request_id=request_id,
            ) from None
        if reply.get("type") == "error":
            raise error_from_wire(reply, request_id)
        return reply

    async def send(self, message: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """Send a message that already has its ``id``; return the future of its reply."""
        if self._closed:
            raise ClientClosed("this connection was closed")
        if self._lost is not None or self._ws is None:
            raise self._lost or ConnectionLost("not connected")
        request_id = message["id"]
        frame = self.codec.encode(message)
        limit = self.welcome.get("limits", {}).get("max_frame_bytes")
        if isinstance(limit, int) and len(frame) > limit:
            self.tracker.forget(request_id)
            raise FrameTooLarge(
                f"{message.get('type')!r} message of {len(frame)} bytes exceeds the server's "
                f"frame limit of {limit} bytes",
                details={"size": len(frame), "limit": limit},
                request_id=request_id,
            )
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = future
        try:
            await self._ws.send(frame)
        except ConnectionClosed as exc:
            self._waiters.pop(request_id, None)
            self.tracker.forget(request_id)
            raise ConnectionLost(f"connection closed: {exc}") from None
        return future

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id``; its reply, if it comes, is dropped."""
        self.tracker.forget(request_id)
        future = self._waiters.pop(request_id, None)
        if future is not None and not future.done():
            future.cancel()

    async def _read(self, ws: ClientConnection) -> None:
        try:
            async for frame in ws:
                try:
                    message = self.codec.decode(frame)
                    reply = self.tracker.match(message)
                except CorralError as exc:
                    log.warning("dropping an unreadable frame from the server: %s", exc)
                    continue
                if reply is None:
                    if message.get("type") == "error" and message.get("id") is None:
                        log.warning("server reported: %s", message.get("message"))
                    continue
                future = self._waiters.pop(reply.request_id, None)
                if future is not None and not future.done():
                    future.set_result(message)
            reason = f"closed by the server (code {ws.close_code})"
        except ConnectionClosed as exc:
            reason = f"connection lost: {exc}"
        except Exception as exc:  # the reader must fail every waiter, whatever happened
            reason = f"connection failed: {exc!r}"
        self._fail_all(ConnectionLost(reason))

    def _fail_all(self, error: CorralError) -> None:
        self._lost = error
        waiters, self._waiters = self._waiters, {}
        for request_id, future in waiters.items():
            self.tracker.forget(request_id)
            if not future.done():
                future.set_exception(
                    type(error)(error.message, details=error.details, request_id=request_id)
                )

    async def close(self) -> None:
        """Close the socket (idempotent); waiting requests fail with ``ClientClosed``."""
        if self._closed:
            return
        self._closed = True
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(), 2.0)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        self._fail_all(ClientClosed("the client was closed"))


async def _wait(future: asyncio.Future[dict[str, Any]], timeout: float | None) -> dict[str, Any]:
    """Await a reply future for at most ``timeout`` seconds (``TimeoutError`` after).

    One timer handle instead of ``asyncio.wait_for``'s extra future and callbacks: this
    runs once per request.
    """
    if timeout is None:
        return await future
    timer = asyncio.get_running_loop().call_later(timeout, _expire, future)
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[dict[str, Any]]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _refusal(exc: InvalidStatus) -> CorralError:
    response = exc.response
    body = bytes(response.body or b"")
    with contextlib.suppress(Exception):
        import orjson

        payload = orjson.loads(body)
        if isinstance(payload, dict) and "code" in payload:
            error = error_from_wire(payload)
            retry = response.headers.get("Retry-After")
            if retry is not None:
                error.details["retry_after_s"] = float(retry)
            return error
    if response.status_code == 503:
        return CapacityReached("server refused the connection: at capacity (HTTP 503)")
    return ConnectionLost(
        f"server refused the WebSocket handshake with HTTP {response.status_code}",
        details={"status": response.status_code, "body": body[:500].decode(errors="replace")},
    )

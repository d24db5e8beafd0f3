"""Server settings, with defaults a demanding user can leave alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from corral.auth import check_token


@dataclass(frozen=True)
class ServerConfig:
    """Limits and timers of a corral server.

    Attributes:
        max_sessions: sessions the server holds at once; more are refused with
            ``CAPACITY_REACHED`` (at the WebSocket handshake when already full).
        max_sessions_per_connection: sessions one connection may multiplex.
        max_connections_per_client: WebSocket connections one client address may hold
            at once; more are refused at the handshake with HTTP 429 and
            ``TOO_MANY_CONNECTIONS`` (None: no limit; set None behind a reverse proxy,
            where every client shares the proxy's address).
        idle_timeout_s: a session with no request for this long is reaped (None: never).
        resume_window_s: how long a session whose connection dropped waits to be
            re-attached before it is closed.
        step_timeout_s: a reset/step/state overrunning this is abandoned with
            ``STEP_TIMEOUT`` and its session closed (None: no limit).
        max_frame_bytes: larger frames get ``FRAME_TOO_LARGE`` (the session lives on).
        max_batch: items in one batch message.
        ping_interval_s / ping_timeout_s: WebSocket keepalive; a peer that does not
            answer a ping within the timeout is disconnected, freeing its slot.
        executor_threads: threads running sync environments' calls (per worker).
        reply_cache: replies remembered per session for at-most-once retries.
        token: the bearer token every route and the WebSocket require (None: no
            authentication). Never shown in the handshake's limits or in ``repr``.
        workers: worker processes holding the environments (0: in this process); see
            :mod:`corral.server.workers`.
        web: serve the web UI at ``/web`` (``/`` redirects there), with the routes it
            reads (``/render``, ``/status``) and, with a token, the browser cookie
            exchange ``POST /auth``; see :mod:`corral.server.webui`.
    """

    max_sessions: int = 1024
    max_sessions_per_connection: int = 1024
    max_connections_per_client: int | None = 1024
    idle_timeout_s: float | None = 600.0
    resume_window_s: float = 30.0
    step_timeout_s: float | None = 300.0
    max_frame_bytes: int = 16 * 1024 * 1024
    max_batch: int = 1024
    ping_interval_s: float | None = 20.0
    ping_timeout_s: float | None = 20.0
    executor_threads: int = 32
    reply_cache: int = 64
    token: str | None = field(default=None, repr=False)
    workers: int = 0
    web: bool = False

    def __post_init__(self) -> None:
        for name in (
            "max_sessions",
            "max_sessions_per_connection",
            "max_frame_bytes",
            "executor_threads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "step_timeout_s", "ping_interval_s", "ping_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"ServerConfig.{name} must be > 0 or None, got {value}")
        limit = self.max_connections_per_client
        if limit is not None and limit < 1:
            raise ValueError(f"ServerConfig.max_connections_per_client must be >= 1, got {limit}")
        if self.token is not None:
            object.__setattr__(self, "token", check_token(self.token, "ServerConfig.token"))
        if self.workers < 0:
            raise ValueError(f"ServerConfig.workers must be >= 0, got {self.workers}")

    def limits(self) -> dict[str, Any]:
        """The limits a client is told in the handshake."""
        data = asdict(self)
        data.pop("executor_threads")
        data.pop("token")
        data.pop("workers")
        data.pop("web")
        return data

"""Server settings, with defaults a demanding user can leave alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from corral.auth import check_fleet_key, check_token
from corral.protocol.access import AccessPolicy
from corral.protocol.identity import SERVER_ID
from corral.protocol.inflow import InflowLimits

TRANSPORTS = frozenset({"auto", "native", "asgi"})
"""The values of :attr:`ServerConfig.transport`."""

AUTO = -1
"""``max_sessions_per_client``'s default: derived from ``max_sessions`` (see
:func:`client_share`)."""

RESERVED_SHARE = 8
"""One slot in this many is kept from any single client (the per-client default)."""


def client_share(max_sessions: int) -> int:
    """The sessions one client address may hold by default: all of ``max_sessions`` but
    one in :data:`RESERVED_SHARE` (rounded down), so one client cannot fill the server.
    A server of fewer than 8 sessions serves one user: it keeps none back."""
    return max_sessions - max_sessions // RESERVED_SHARE


SERVER_ONLY = (
    "executor_threads",
    "token",
    "workers",
    "transport",
    "handshake_timeout_s",
    "max_pending_handshakes",
    "http_body_timeout_s",
    "max_outgoing_bytes",
    "deflate",
    "web",
    "max_hung_calls",
    "inline_step_s",
    "debug",
    "fleet_key",
    "server_id",
    # The edge (corral.protocol.access / inflow), grouped:
    "allowed_origins",
    "allowed_hosts",
    "frame_timeout_s",
    "message_timeout_s",
    "max_partial_bytes",
)
"""Settings the handshake does not tell clients (the server id travels in ``server``)."""

SNAPSHOT_MARGIN = 4096
"""Bytes of a ``restore`` frame besides its snapshot envelope (the message's own fields,
and the binary codec's framing of them), kept free by the default snapshot limit."""


@dataclass(frozen=True)
class ServerConfig:
    """Limits and timers of a corral server.

    Attributes:
        max_sessions: sessions the server holds at once; more are refused with
            ``CAPACITY_REACHED`` (at the WebSocket handshake when already full).
        max_sessions_per_connection: sessions one connection may multiplex.
        max_sessions_per_client: sessions one client address may hold, however it opens
            them (corral/1 ``open``, OpenEnv's WebSocket, HTTP ``POST /sessions`` and
            ``openenv/session/create``); more are refused with ``TOO_MANY_SESSIONS``
            (OpenEnv clients: ``CAPACITY_REACHED``). The default, :data:`AUTO`, is
            :func:`client_share`: an eighth of the slots stays for other clients. None: no
            limit (behind a reverse proxy, where every client shares its address; a
            server a single trainer owns). Peers without an address (the in-process
            transport) are not limited.
        max_connections_per_client: WebSocket connections (and HTTP sessions) one
            client address may hold at once; more are refused at the handshake with
            HTTP 429 and ``TOO_MANY_CONNECTIONS``. 256 by default: a pool carries 256
            sessions per connection, and one address cannot take every file descriptor
            of a server with the usual limit of 1,024. None: no limit — set it (or raise
            it) behind a reverse proxy, where every client shares the proxy's address.
        idle_timeout_s: a session with no request for this long is reaped (None: never).
        resume_window_s: how long a session whose connection dropped waits to be
            re-attached before it is closed.
        step_timeout_s: a reset/step/state overrunning this is abandoned with
            ``STEP_TIMEOUT`` and its session closed (None: no limit).
        max_frame_bytes: larger frames get ``FRAME_TOO_LARGE`` (the session lives on).
        max_batch: items in one batch message.
        ping_interval_s / ping_timeout_s: WebSocket keepalive; a peer that does not
            answer a ping within the timeout is disconnected, freeing its slot (the
            native transport pings no more often than the timeout).
        executor_threads: threads running sync environments' calls (per worker).
        reply_cache: replies remembered per session for at-most-once retries. A
            session runs one request at a time and a client re-sends only the ones it
            has no reply to, so a few suffice; each holds an observation (an image
            env's can be large), which is why it is not 64 (issue 10's profile: the
            eviction of a 64-batch-old reply was a cache-cold share of every item).
        token: the bearer token every route and the WebSocket require (None: no
            authentication). Never shown in the handshake's limits or in ``repr``.
        workers: worker processes holding the environments (0: in this process); see
            :mod:`corral.server.workers`.
        transport: what serves ``corral/1`` WebSockets: ``"native"`` (picows, outside
            ASGI, on the same port as the HTTP routes), ``"asgi"`` (uvicorn and the
            Starlette route), or ``"auto"``: native when picows is installed.
        handshake_timeout_s: a new connection's request head (an HTTP request or a
            WebSocket upgrade) must arrive within this; slower ones get 408 and are
            closed (slowloris).
        max_pending_handshakes: connections waiting for their request head at once;
            past it the one waiting longest is dropped, so slow peers cannot starve
            healthy clients of file descriptors.
        http_body_timeout_s: an HTTP request body must arrive within this (408).
        max_outgoing_bytes: unread reply bytes a native connection may hold; past it
            the connection is closed (1008). Long before, at 1 MiB, the server stops
            reading from that peer until it reads its replies (back-pressure).
        deflate: accept permessage-deflate when a native client asks for it
            (inflated messages are bounded like frames).
        web: serve the web UI at ``/web`` (``/`` redirects there), with the routes it
            reads (``/render``, ``/status``) and, with a token, the browser cookie
            exchange ``POST /auth``; see :mod:`corral.server.webui`.
        max_hung_calls: environment calls abandoned after the step timeout whose
            threads have not returned yet (each holds a thread and whatever the env
            holds) that the server tolerates; at the bound ``/ready`` answers 503 and
            new sessions are refused with ``NOT_READY`` until some return; with
            ``workers`` a worker reaching it is replaced instead.
        inline_step_s: a sync environment's calls run inline on the event loop while
            their moving average stays under this many seconds (saving the thread hop,
            ~100 µs of CPU), or under what a hop measures now, up to 1 ms (a loaded
            machine's hops cost more); slower ones, and classes with ``blocking =
            True``, run on the executor, under the step timeout. 0 runs every sync call
            off the loop.
        server_id: this server's routable id (the ``corral-server`` a front door routes
            by, see :mod:`corral.providers.frontdoor`): in every ``welcome`` and in
            ``/ready``. None: ``<hostname>-<port>`` once bound (:func:`default_server_id`),
            stable across restarts on the same port.
        debug: send the formatted traceback of an exception the environment raised in
            the ``ENV_ERROR``'s ``details["traceback"]`` (bounded). Off by default: a
            traceback shows the server's code and paths. The server logs every such
            exception with its traceback either way.
        max_snapshot_bytes: the largest session snapshot the server takes or restores
            (its envelope, as JSON); a larger one is ``SNAPSHOT_TOO_LARGE``. None (the
            default): the frame limit less :data:`SNAPSHOT_MARGIN` (at most half of it
            for tiny frame limits), so that a snapshot this server takes always fits
            the frame of the ``restore`` that brings it back. The handshake states the
            effective limit.
        fleet_key: the secret every server of a fleet shares (at least 32 bytes;
            ``corral serve --fleet-key-file`` or ``$CORRAL_FLEET_KEY``). With it, session
            snapshots are signed and only signed ones are restored; without, they are
            unsigned and the snapshot model's validation is the only guard (see
            :mod:`corral.protocol.snapshot`). Never shown in the handshake or ``repr``.
        allowed_origins: browser origins (``scheme://host[:port]``) allowed to open a
            WebSocket or send a state-changing HTTP request, besides the server's own
            (``"*"``: any page — only with a token). Clients that send no ``Origin``
            (every non-browser client) are always allowed.
        allowed_hosts: host names a request may name in ``Host`` besides IP addresses
            and ``localhost`` (``"*"``: any). Without it a connection that arrives on a
            loopback address must name one of those (DNS rebinding); with it, every
            connection must. Behind a proxy on the same host that keeps the public
            ``Host``, list that name here.
        frame_timeout_s: a WebSocket that completes no frame for half of this is pinged;
            if still none completes in the other half it is closed (1008). A frame
            dribbled byte by byte cannot hold a connection longer (None: no deadline).
        message_timeout_s: a fragmented WebSocket message must be whole within this of
            its first fragment, else the connection is closed (1008; None: no deadline).
        max_partial_bytes: bytes of unfinished fragmented WebSocket messages the server
            holds across all connections (at least one message of the largest size); a
            fragment past it closes its connection with 1013 (try again later).

    The last five are the edge's (:mod:`corral.protocol.access`,
    :mod:`corral.protocol.inflow`).
    """

    max_sessions: int = 1024
    max_sessions_per_connection: int = 1024
    max_sessions_per_client: int | None = AUTO
    max_connections_per_client: int | None = 256
    idle_timeout_s: float | None = 600.0
    resume_window_s: float = 30.0
    step_timeout_s: float | None = 300.0
    max_frame_bytes: int = 16 * 1024 * 1024
    max_batch: int = 1024
    ping_interval_s: float | None = 20.0
    ping_timeout_s: float | None = 20.0
    executor_threads: int = 32
    reply_cache: int = 8
    token: str | None = field(default=None, repr=False)
    workers: int = 0
    transport: str = "auto"
    handshake_timeout_s: float = 10.0
    max_pending_handshakes: int = 256
    http_body_timeout_s: float = 30.0
    max_outgoing_bytes: int = 64 * 1024 * 1024
    deflate: bool = True
    max_hung_calls: int = 16
    inline_step_s: float = 100e-6
    web: bool = False
    debug: bool = False
    max_snapshot_bytes: int | None = None
    fleet_key: bytes | None = field(default=None, repr=False)
    server_id: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    frame_timeout_s: float | None = 30.0
    message_timeout_s: float | None = 60.0
    max_partial_bytes: int = 128 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "max_sessions",
            "max_sessions_per_connection",
            "max_frame_bytes",
            "executor_threads",
            "max_pending_handshakes",
            "max_outgoing_bytes",
            "max_hung_calls",
            "max_partial_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("handshake_timeout_s", "http_body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ServerConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.server_id is not None and not SERVER_ID.fullmatch(self.server_id):
            raise ValueError(
                f"ServerConfig.server_id {self.server_id!r} must match {SERVER_ID.pattern} "
                "(letters, digits, '.', '_', '-'; at most 63 characters)"
            )
        if self.transport not in TRANSPORTS:
            choices = sorted(TRANSPORTS)
            raise ValueError(f"ServerConfig.transport must be one of {choices}: {self.transport!r}")
        for name in (
            "idle_timeout_s",
            "step_timeout_s",
            "ping_interval_s",
            "ping_timeout_s",
            "frame_timeout_s",
            "message_timeout_s",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"ServerConfig.{name} must be > 0 or None, got {value}")
        limit = self.max_connections_per_client
        if limit is not None and limit < 1:
            raise ValueError(f"ServerConfig.max_connections_per_client must be >= 1, got {limit}")
        share = self.max_sessions_per_client
        if share is not None and share != AUTO and share < 1:
            raise ValueError(
                f"ServerConfig.max_sessions_per_client must be >= 1, None or AUTO, got {share}"
            )
        if self.token is not None:
            object.__setattr__(self, "token", check_token(self.token, "ServerConfig.token"))
        if self.inline_step_s < 0:
            raise ValueError(f"ServerConfig.inline_step_s must be >= 0, got {self.inline_step_s}")
        if self.workers < 0:
            raise ValueError(f"ServerConfig.workers must be >= 0, got {self.workers}")
        if self.max_snapshot_bytes is not None and self.max_snapshot_bytes < 1:
            raise ValueError(
                f"ServerConfig.max_snapshot_bytes must be >= 1 or None, got "
                f"{self.max_snapshot_bytes}"
            )
        if self.fleet_key is not None:
            key = check_fleet_key(self.fleet_key, "ServerConfig.fleet_key")
            object.__setattr__(self, "fleet_key", key)
        # The edge's lists: one origin or host string is a common slip for a tuple of them.
        for name in ("allowed_origins", "allowed_hosts"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"ServerConfig.{name} is a list of strings, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        self.access()  # the origins and hosts parse

    @property
    def snapshot_limit(self) -> int:
        """The effective :attr:`max_snapshot_bytes`."""
        if self.max_snapshot_bytes is not None:
            return self.max_snapshot_bytes
        frame = self.max_frame_bytes
        return max(frame // 2, frame - SNAPSHOT_MARGIN)

    @property
    def client_sessions(self) -> int | None:
        """The sessions one client address may hold (``max_sessions_per_client`` with
        :data:`AUTO` worked out); None: no limit."""
        share = self.max_sessions_per_client
        return client_share(self.max_sessions) if share == AUTO else share

    def access(self) -> AccessPolicy:
        """The access rules of a server with this configuration.

        Raises:
            ValueError: an allowed origin or host is malformed.
        """
        return AccessPolicy.of(
            self.token, cookies=self.web, origins=self.allowed_origins, hosts=self.allowed_hosts
        )

    def inflow(self) -> InflowLimits:
        """The deadlines of incoming WebSocket frames and messages."""
        return InflowLimits(self.frame_timeout_s, self.message_timeout_s)

    def limits(self) -> dict[str, Any]:
        """The limits a client is told in the handshake."""
        data = asdict(self)
        for name in SERVER_ONLY:
            data.pop(name)
        data["max_sessions_per_client"] = self.client_sessions
        data["max_snapshot_bytes"] = self.snapshot_limit
        return data

"""Running a corral app under uvicorn, on a port chosen without races.

The server binds the socket itself (port 0 lets the OS pick a free port) before uvicorn
starts, then announces the bound address: on stdout as ``CORRAL_LISTENING <url>`` and,
if asked, in a file written atomically. A launcher reads that instead of guessing a port.

One port serves everything. Each connection starts on the front door
(:mod:`corral.server.front`), which reads the request head under a deadline and hands
the socket to the native ``corral/1`` transport (:mod:`corral.server.native`, on picows,
outside ASGI) or to uvicorn's HTTP protocol (every HTTP route, OpenEnv's ``/ws``
envelope, ``/mcp``). ``ServerConfig.transport`` picks the native path (``"auto"``: when
picows is installed) or the ASGI one (uvicorn serves ``corral/1`` too).

It binds 127.0.0.1 unless told otherwise; binding any other interface without a bearer
token prints a warning, since anyone who can reach the port could then run the
environment.

A launcher may also bind the socket and hand it over as an inherited file descriptor
(``fd``, as systemd's socket activation does): the server then accepts on a socket of the
launcher's network namespace, which is how a server in a sandbox without network is still
reachable on the host's 127.0.0.1.

**Draining** (for rolling updates and scale-down on Kubernetes): with ``drain_timeout`` set
(or ``$CORRAL_DRAIN_SECONDS``), SIGTERM does not stop the server at once: it drains
(:meth:`~corral.server.service.EnvService.drain`). ``/ready`` answers 503 from then on,
so the orchestrator routes no new clients here, and new sessions are ``NOT_READY``;
clients that read notices are told ``going_away`` with the deadline and move their
sessions; the sessions still open keep working. The server stops once none is left, or
at the deadline (closing what is left), whichever comes first. A second SIGTERM, or
SIGINT, stops it at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
import uvicorn.config
import uvicorn.importer

from corral import runtime
from corral.auth import TOKEN_ENV, TOKEN_FILE_ENV, resolve_fleet_key, resolve_token
from corral.protocol.identity import default_server_id
from corral.server import logs
from corral.server.app import create_app
from corral.server.config import ServerConfig
from corral.server.edge import hard_frame_limit
from corral.server.front import HandshakeGuard, front_factory
from corral.server.gc_pacer import GcPacer
from corral.server.service import EnvService
from corral.server.uvicorn_ws import protocol_factory

LISTENING = "CORRAL_LISTENING"
"""The stdout line prefix a server prints once it is bound."""

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}

DRAIN_ENV = "CORRAL_DRAIN_SECONDS"
"""Environment variable: seconds a SIGTERM'd server keeps serving its open sessions."""


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket (IPv6 when ``host`` contains a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _announce(url: str, port_file: str | Path | None) -> None:
    print(f"{LISTENING} {url}", flush=True)
    if port_file is not None:
        path = Path(port_file)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(url)
        os.replace(tmp, path)


def exposure_warning(host: str, token: str | None) -> str | None:
    """The warning to print before binding ``host``, or None when it is safe enough."""
    if host in _LOOPBACK:
        return None
    if token is None:
        return (
            f"WARNING: binding {host} without authentication: anyone who can reach this "
            "port can open sessions and run the environment. Set a bearer token with "
            f"--token-file, ${TOKEN_ENV} or ${TOKEN_FILE_ENV}, or bind 127.0.0.1."
        )
    return None


def uvicorn_config(app: Any, config: ServerConfig, log_level: str) -> uvicorn.Config:
    """The uvicorn settings matching ``config`` (keepalive pings, frame cap)."""
    return uvicorn.Config(
        app,
        log_level=log_level,
        ws="websockets-sansio",  # install_front replaces it with corral's subclass
        ws_ping_interval=config.ping_interval_s,
        ws_ping_timeout=config.ping_timeout_s,
        # The transport's cap sits above the protocol limit so that an oversized frame
        # gets a structured FRAME_TOO_LARGE reply instead of a dropped connection.
        ws_max_size=hard_frame_limit(config),
        ws_per_message_deflate=config.deflate,
        loop="auto",
        http="auto",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


def native_available() -> bool:
    """Whether the native transport can run here (picows is installed)."""
    try:
        import picows  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_transport(config: ServerConfig) -> str:
    """``"native"`` or ``"asgi"``: what serves ``corral/1`` for ``config``.

    Raises:
        ValueError: the native transport was asked for and picows is not installed.
    """
    if config.transport == "asgi":
        return "asgi"
    if native_available():
        return "native"
    if config.transport == "native":
        raise ValueError(
            "the native transport needs picows (pip install picows), or use transport='asgi'"
        )
    return "asgi"


def build_server(app: Any, log_level: str = "warning") -> uvicorn.Server:
    """The uvicorn server for ``app`` (from :func:`create_app`) behind the front door."""
    server = uvicorn.Server(uvicorn_config(app, app.state.service.config, log_level))
    install_front(server, app)
    return server


def install_front(server: uvicorn.Server, app: Any) -> HandshakeGuard:
    """Put the front door before ``server``'s HTTP protocol (before it starts).

    Every connection then gets the handshake deadline and bound, and native upgrades go
    to the native transport when it is the one in use. ``app`` is the app from
    :func:`create_app` (its ``state.service``); the guard is also ``app.state.handshakes``.
    """
    service = app.state.service
    cfg: ServerConfig = service.config
    http_class = uvicorn.importer.import_from_string(
        uvicorn.config.HTTP_PROTOCOLS[str(server.config.http)]
    )
    guard = HandshakeGuard(cfg.max_pending_handshakes, cfg.handshake_timeout_s)
    edge = app.state.edge
    adopt = None
    if resolve_transport(cfg) == "native":
        from corral.server.native import NativeDoor

        adopt = NativeDoor(edge, server.server_state.connections).adopt
    server.config.http = front_factory(http_class, guard, adopt)  # type: ignore[assignment]
    # Every WebSocket uvicorn serves gets the edge's reassembly bounds and deadlines.
    server.config.ws = protocol_factory(edge)  # type: ignore[assignment]
    app.state.handshakes = guard
    return guard


def inherited_socket(fd: int) -> socket.socket:
    """The listening TCP socket a launcher passed as file descriptor ``fd``.

    Raises:
        ValueError: ``fd`` is not open, not a TCP socket, or not listening.
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ValueError(f"file descriptor {fd} is not an open socket ({exc})") from None
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.detach()
        raise ValueError(f"file descriptor {fd} is not a TCP socket")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ValueError(f"socket {fd} is not listening; call listen() before passing it")
    return sock


def drain_seconds(value: float | None = None) -> float | None:
    """The drain deadline to use: ``value``, else ``$CORRAL_DRAIN_SECONDS``, else None (off).

    Raises:
        ValueError: the variable is not a non-negative number.
    """
    if value is None:
        raw = os.environ.get(DRAIN_ENV, "").strip()
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"${DRAIN_ENV} must be a number of seconds, not {raw!r}") from None
    if value < 0:
        raise ValueError(f"the drain deadline must be >= 0 seconds, not {value:g}")
    return value or None


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, where the first SIGTERM drains the service before stopping
    (:meth:`~corral.server.service.EnvService.drain`)."""

    def __init__(self, config: uvicorn.Config, service: EnvService, deadline: float) -> None:
        super().__init__(config)
        self.service = service
        self.deadline = deadline
        self.loop: asyncio.AbstractEventLoop | None = None
        self.draining = False
        self._drain: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.draining or self.loop is None:
            super().handle_exit(sig, frame)
            return
        self.draining = True
        self.loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.ensure_future(self._drain_then_stop())

    async def _drain_then_stop(self) -> None:
        try:
            await self.service.drain(self.deadline, "draining on SIGTERM")
        finally:
            super().handle_exit(signal.SIGTERM, None)


def serve(
    env: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: str | Path | None = None,
    log_level: str = "info",
    config: ServerConfig | None = None,
    sock: socket.socket | None = None,
    log_format: str = "text",
    drain_timeout: float | None = None,
    customize: Callable[[Any], None] | None = None,
) -> None:
    """Serve ``env`` until interrupted (blocking). Binds 127.0.0.1 by default.

    Without ``config.token``, the token is taken from ``$CORRAL_TOKEN`` or the file named
    by ``$CORRAL_TOKEN_FILE`` when either is set; without ``config.fleet_key``, the fleet
    key from ``$CORRAL_FLEET_KEY`` when it is set.

    Args:
        env: what :func:`~corral.server.app.create_app` takes.
        host / port: where to bind (port 0: a free port, announced once listening).
        port_file: write the bound URL to this file once listening.
        log_level: corral's log level (uvicorn's own lines show at ``debug`` only).
        config: the server's limits and timeouts.
        sock: accept on this listening socket (e.g. :func:`inherited_socket`) instead of
            binding ``host:port``.
        log_format: ``"text"`` or ``"json"`` (one object per line; see
            :mod:`corral.server.logs`).
        drain_timeout: on SIGTERM, answer ``/ready`` with 503 and keep serving the open
            sessions for up to this many seconds (default: ``$CORRAL_DRAIN_SECONDS``;
            unset or 0: stop at once).
        customize: called with the app before it serves (e.g. to mount more routes).

    The calling process becomes the server: it runs on uvloop when installed, and its
    garbage collector runs between pieces of work, with what start-up and reset waves
    built frozen (see :mod:`corral.server.gc_pacer`).
    """
    cfg = config or ServerConfig()
    if cfg.token is None:
        token = resolve_token()
        if token is not None:
            cfg = ServerConfig(**{**cfg.__dict__, "token": token})
    if cfg.fleet_key is None:
        key = resolve_fleet_key()
        if key is not None:
            cfg = ServerConfig(**{**cfg.__dict__, "fleet_key": key})
    if sock is not None:
        host = sock.getsockname()[0]
    warning = exposure_warning(host, cfg.token)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    if sock is None:
        sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    if cfg.server_id is None:
        cfg = dataclasses.replace(cfg, server_id=default_server_id(bound_port))
    app = create_app(env, cfg)
    deadline = drain_seconds(drain_timeout)
    if customize is not None:
        customize(app)
    shown = f"[{host}]" if ":" in host else host
    server: uvicorn.Server
    if deadline is None:
        server = build_server(app, log_level)
    else:
        settings = uvicorn_config(app, cfg, log_level)
        server = _DrainingServer(settings, app.state.service, deadline)
        install_front(server, app)
    logs.configure(log_format, log_level)  # after uvicorn's own logging set-up, replacing it
    runtime.tune_gc()

    async def main() -> None:
        if isinstance(server, _DrainingServer):
            server.loop = asyncio.get_running_loop()
        startup = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not startup.done():
            await asyncio.sleep(0.01)
        pacer = GcPacer(app.state.service.manager.stats) if GcPacer.wanted() else None
        if server.started:
            if pacer is not None:
                pacer.start()
            _announce(f"http://{shown}:{bound_port}", port_file)
            logs.log_banner(app, f"http://{shown}:{bound_port}")
        try:
            await startup
        finally:
            if pacer is not None:
                pacer.stop()

    try:
        runtime.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        sys.stdout.flush()

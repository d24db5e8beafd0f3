"""Running a corral app under uvicorn, on a port chosen without races.

The server binds the socket itself (port 0 lets the OS pick a free port) before uvicorn
starts, then announces the bound address: on stdout as ``CORRAL_LISTENING <url>`` and,
if asked, in a file written atomically. A launcher reads that instead of guessing a port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import uvicorn

from corral import runtime
from corral.server.app import create_app
from corral.server.config import ServerConfig

LISTENING = "CORRAL_LISTENING"
"""The stdout line prefix a server prints once it is bound."""

log = logging.getLogger("corral.server")

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


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


def uvicorn_config(app: Any, config: ServerConfig, log_level: str) -> uvicorn.Config:
    """The uvicorn settings matching ``config`` (keepalive pings, frame cap)."""
    return uvicorn.Config(
        app,
        log_level=log_level,
        ws="websockets-sansio" if _has_sansio() else "websockets",
        ws_ping_interval=config.ping_interval_s,
        ws_ping_timeout=config.ping_timeout_s,
        # The transport's cap sits above the protocol limit so that an oversized frame
        # gets a structured FRAME_TOO_LARGE reply instead of a dropped connection.
        ws_max_size=config.max_frame_bytes * 2 + 65536,
        loop="auto",
        http="auto",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


def _has_sansio() -> bool:
    with contextlib.suppress(ImportError):
        import uvicorn.protocols.websockets.websockets_sansio_impl  # noqa: F401

        return True
    return False


def serve(
    env: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: str | Path | None = None,
    log_level: str = "warning",
    config: ServerConfig | None = None,
) -> None:
    """Serve ``env`` until interrupted (blocking). Binds 127.0.0.1 by default.

    The calling process becomes the server: it runs on uvloop when installed and with
    the garbage collector tuned for many sessions (see :mod:`corral.runtime`).
    """
    cfg = config or ServerConfig()
    if host not in _LOOPBACK:
        log.warning("binding %s: the server is reachable from other machines", host)
    app = create_app(env, cfg)
    sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    server = uvicorn.Server(uvicorn_config(app, cfg, log_level))
    runtime.tune_gc()

    async def main() -> None:
        startup = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not startup.done():
            await asyncio.sleep(0.01)
        if server.started:
            _announce(f"http://{shown}:{bound_port}", port_file)
        await startup

    try:
        runtime.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        sys.stdout.flush()

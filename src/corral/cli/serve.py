"""``corral serve``: run an environment server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from corral.server.config import ServerConfig
from corral.server.serve import serve
from corral.server.target import load_target


def resolve_serve_target(target: str) -> Any:
    """Turn ``corral serve``'s TARGET (``module:Class``) into what ``create_app`` takes."""
    try:
        return load_target(target, search_path=Path.cwd())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="TARGET") from None


def serve_command(
    target: Annotated[str, typer.Argument(help="The environment: 'package.module:ClassName'.")],
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one and prints it.")] = 8000,
    port_file: Annotated[
        Path | None, typer.Option(help="Write the bound URL to this file once listening.")
    ] = None,
    max_sessions: Annotated[int, typer.Option(help="Sessions held at once.")] = 1024,
    idle_timeout: Annotated[
        float, typer.Option(help="Reap sessions idle this many seconds (0: never).")
    ] = 600.0,
    step_timeout: Annotated[
        float, typer.Option(help="Abandon a reset/step/state after this many seconds (0: never).")
    ] = 300.0,
    resume_window: Annotated[
        float, typer.Option(help="Keep a dropped connection's sessions this long for resume.")
    ] = 30.0,
    workers: Annotated[
        int,
        typer.Option(help="Worker processes holding the environments (0: in the server)."),
    ] = 0,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
) -> None:
    """Serve an environment over WebSocket and HTTP (loopback by default)."""
    env = resolve_serve_target(target)
    config = ServerConfig(
        max_sessions=max_sessions,
        idle_timeout_s=idle_timeout or None,
        step_timeout_s=step_timeout or None,
        resume_window_s=resume_window,
        workers=workers,
    )
    serve(env, host=host, port=port, port_file=port_file, log_level=log_level, config=config)

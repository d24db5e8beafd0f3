"""``corral serve``: run an environment server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from corral.adapters.openenv_env import from_openenv, is_openenv_environment
from corral.server.config import ServerConfig
from corral.server.serve import serve
from corral.server.target import load_target


def resolve_serve_target(target: str) -> Any:
    """Turn ``corral serve``'s TARGET (``module:Class`` or ``gym:ENV_ID``) into what
    ``create_app`` takes.

    An OpenEnv environment class is wrapped by :func:`corral.adapters.openenv_env.from_openenv`;
    ``gym:ENV_ID`` serves a registered Gymnasium environment
    (:func:`corral.adapters.gymnasium.serve_target`).
    """
    try:
        if target.startswith("gym:"):
            from corral.adapters.gymnasium import serve_target

            return serve_target(target, search_path=Path.cwd())
        obj = load_target(target, search_path=Path.cwd())
    except (ValueError, ImportError) as exc:
        raise typer.BadParameter(str(exc), param_hint="TARGET") from None
    if is_openenv_environment(obj):
        try:
            return from_openenv(obj)
        except (TypeError, ImportError) as exc:
            raise typer.BadParameter(str(exc), param_hint="TARGET") from None
    return obj


def serve_command(
    target: Annotated[
        str,
        typer.Argument(help="The environment: 'package.module:ClassName' or 'gym:CartPole-v1'."),
    ],
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
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
) -> None:
    """Serve an environment over WebSocket and HTTP (loopback by default)."""
    env = resolve_serve_target(target)
    config = ServerConfig(
        max_sessions=max_sessions,
        idle_timeout_s=idle_timeout or None,
        step_timeout_s=step_timeout or None,
        resume_window_s=resume_window,
    )
    serve(env, host=host, port=port, port_file=port_file, log_level=log_level, config=config)

"""``corral mcp TARGET``: an environment's tools over MCP's stdio transport.

An MCP client (an IDE, an agent framework) launches this command and speaks JSON-RPC on
its stdin/stdout; the environment runs in this process, one episode per ``initialize``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from corral import runtime
from corral.cli.serve import resolve_serve_target
from corral.server.config import ServerConfig
from corral.server.service import EnvService


def mcp_command(
    target: Annotated[
        str,
        typer.Argument(
            help="The environment: a directory with corral.yaml / openenv.yaml, "
            "'package.module:ClassName' or an OpenEnv app."
        ),
    ] = ".",
    seed: Annotated[int | None, typer.Option(help="The episode's seed.")] = None,
    options: Annotated[
        str | None, typer.Option(help="The episode's reset options, as a JSON object.")
    ] = None,
    step_timeout: Annotated[
        float, typer.Option(help="Abandon a tool call after this many seconds (0: never).")
    ] = 300.0,
) -> None:
    """Serve an environment's tools to an MCP client over stdin/stdout."""
    from corral.adapters.mcp import parse_options, run_stdio

    env = resolve_serve_target(target)
    try:
        reset_options = parse_options(options) if options else {}
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--options") from None
    config = ServerConfig(max_sessions=4, step_timeout_s=step_timeout or None)
    try:
        service = EnvService(env, config)
    except TypeError as exc:
        raise typer.BadParameter(str(exc), param_hint="TARGET") from None
    runtime.run(run_stdio(service, seed=seed, options=reset_options))

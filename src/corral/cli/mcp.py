"""``corral mcp TARGET``: an environment over MCP's stdio transport.

An MCP client (an IDE, an agent framework) launches this command and speaks JSON-RPC on
its stdin/stdout; the environment runs in this process, one session per ``initialize``.
Its tools are ``reset``, the action (named after the Action model, or ``--tool-name``)
and the environment's own ``@tool`` methods (see :mod:`corral.adapters.mcp`). Standard
input may be a pipe, a terminal or a file (``corral mcp TARGET < requests.jsonl``).
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
    tool_name: Annotated[
        str | None,
        typer.Option(help="The action tool's name (default: the Action model's, in snake case)."),
    ] = None,
) -> None:
    """Serve an environment to an MCP client over stdin/stdout: reset, its action and its
    tools."""
    from corral.adapters.mcp import McpSessions, parse_options, run_stdio

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
    try:
        McpSessions(service, action_tool=tool_name)  # a clash of tool names fails here
    except TypeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tool-name") from None
    runtime.run(run_stdio(service, seed=seed, options=reset_options, action_tool=tool_name))

"""``corral validate``: an environment directory (``PATH``) or a running server (``--url``).

    corral validate                                      # the environment in the current directory
    corral validate path/to/env --static                 # static checks only
    corral validate --url http://127.0.0.1:8000          # a table; exit 1 on failure
    corral validate --url http://127.0.0.1:8000 --json   # the report as JSON

``PATH`` runs :func:`~corral.cli.validate.local.validate_environment`; ``--url`` runs
:func:`~corral.cli.validate.remote.validate_url`. Both produce a
:class:`~corral.cli.validate.report.Report`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli.validate.report import print_report


def _parse_action(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--action") from None
    if not isinstance(value, dict):
        raise typer.BadParameter("the action must be a JSON object", param_hint="--action")
    return value


def validate_command(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="An environment directory to validate (default: the current one, unless "
            "--url is given)."
        ),
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="Check the running server at this base URL.")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds to wait for any single reply.")
    ] = 5.0,
    action: Annotated[
        str | None,
        typer.Option(help="A valid action as JSON, when one cannot be synthesized."),
    ] = None,
    capacity_probe: Annotated[
        int,
        typer.Option(
            min=0, help="Check capacity when the server holds at most this many sessions."
        ),
    ] = 8,
    static: Annotated[
        bool, typer.Option("--static", help="PATH: static checks only, start no server.")
    ] = False,
    docker: Annotated[
        bool,
        typer.Option("--docker", help="PATH: run the image 'corral build' made, in Docker."),
    ] = False,
    image: Annotated[
        str | None, typer.Option(help="PATH: run this image of the environment, in Docker.")
    ] = None,
    venv: Annotated[
        bool,
        typer.Option(
            "--venv", help="PATH: run the local server in a virtualenv from pyproject.toml."
        ),
    ] = False,
    sandbox: Annotated[
        str,
        typer.Option(help="PATH: run the local server in a sandbox: none, auto, bwrap, unshare."),
    ] = "none",
    network: Annotated[
        str, typer.Option(help="PATH: Docker networking for --docker/--image: bridge, host.")
    ] = "bridge",
    seed: Annotated[int, typer.Option(help="PATH: the seed of every episode.")] = 0,
    steps: Annotated[int, typer.Option(min=1, help="PATH: the most steps per episode.")] = 20,
) -> None:
    """Validate an environment (PATH: static checks and a runtime smoke test) or a running
    server (--url: corral/1 and OpenEnv conformance); exit 1 on failure."""
    if url is not None and path is not None:
        raise typer.BadParameter("give either PATH or --url, not both", param_hint="PATH")
    local_only = {
        "--static": static,
        "--docker": docker,
        "--image": image is not None,
        "--venv": venv,
        "--sandbox": sandbox != "none",
    }
    if url is not None and any(local_only.values()):
        given = ", ".join(name for name, used in local_only.items() if used)
        raise typer.BadParameter(f"{given} apply to PATH, not to --url", param_hint="--url")
    # The checks are imported when they run: every ``corral`` process (each server a test
    # or a provider starts) would otherwise pay ~0.15 s of CPU for them.
    if url is not None:
        from corral.cli.validate.remote import validate_url

        report = asyncio.run(
            validate_url(
                url, timeout=timeout, action=_parse_action(action), capacity_probe=capacity_probe
            )
        )
    else:
        if sandbox not in ("none", "auto", "bwrap", "unshare"):
            raise typer.BadParameter(
                f"{sandbox!r} is not a sandbox; use none, auto, bwrap or unshare",
                param_hint="--sandbox",
            )
        if network not in ("bridge", "host"):
            raise typer.BadParameter(
                f"{network!r} is not a Docker network mode; use bridge or host",
                param_hint="--network",
            )
        from corral.cli.validate.local import LocalOptions, validate_environment

        options = LocalOptions(
            runtime=not static,
            docker=docker,
            image=image,
            venv=venv,
            sandbox=sandbox,  # type: ignore[arg-type]  # checked above
            network=network,
            action=_parse_action(action),
            seed=seed,
            steps=steps,
            timeout=timeout,
        )
        report = validate_environment(path or Path("."), options)
    if json_output:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        print_report(report)
    if not report.passed:
        raise typer.Exit(1)

"""``corral serve``: run an environment server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from corral.auth import read_fleet_key_file, read_token_file
from corral.cli.target import Target, read_target
from corral.protocol.identity import SERVER_ID
from corral.providers.manifest import Manifest
from corral.server.config import AUTO, TRANSPORTS, ServerConfig
from corral.server.logs import FORMATS
from corral.server.serve import inherited_socket, serve
from corral.server.service import PreflightError
from corral.server.target import TargetError

T = TypeVar("T")


def parse_make_kwargs(pairs: list[str]) -> dict[str, Any]:
    """``--kwarg key=value`` pairs as ``gymnasium.make`` keyword arguments: a value that
    reads as JSON (``3``, ``0.5``, ``true``, ``null``, ``[1, 2]``) is that value, any other
    is a string (``render_mode=rgb_array``).

    Raises:
        typer.BadParameter: a pair has no ``=`` or an empty key.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise typer.BadParameter(f"expected key=value, got {pair!r}", param_hint="--kwarg")
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out


def read_serve_target(target: str) -> Target:
    """``corral serve``'s TARGET, read by the one rule of :mod:`corral.cli.target`.

    Raises:
        typer.BadParameter: TARGET fits no form (the message says which forms work).
    """
    try:
        return read_target(target)
    except TargetError as exc:
        raise typer.BadParameter(str(exc), param_hint="TARGET") from None


def load_serve_target(chosen: Target, *, make_kwargs: dict[str, Any] | None = None) -> Any:
    """What ``create_app`` serves for ``chosen``.

    Raises:
        typer.BadParameter: it cannot be loaded or adapted, or ``--kwarg`` was given for a
            target other than ``gym:ID``; the message says how to fix it.
    """
    try:
        return chosen.load(make_kwargs=make_kwargs)
    except TargetError as exc:
        hint = "--kwarg" if "--kwarg" in str(exc) else "TARGET"
        raise typer.BadParameter(str(exc), param_hint=hint) from None


def resolve_serve_target(target: str, *, make_kwargs: dict[str, Any] | None = None) -> Any:
    """What ``corral serve TARGET`` serves (:func:`read_serve_target`, then
    :func:`load_serve_target`)."""
    return load_serve_target(read_serve_target(target), make_kwargs=make_kwargs)


def serve_command(
    target: Annotated[
        str,
        typer.Argument(
            help="The environment: a directory with corral.yaml or openenv.yaml (default: "
            "the current one), 'package.module:ClassName', 'package.server.app:app' (an "
            "OpenEnv app), 'gym:CartPole-v1' or an installed OpenEnv environment package."
        ),
    ] = ".",
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[
        int | None,
        typer.Option(
            help="Port; 0 picks a free one and prints it (default: the manifest's, else 8000)."
        ),
    ] = None,
    port_file: Annotated[
        Path | None, typer.Option(help="Write the bound URL to this file once listening.")
    ] = None,
    fd: Annotated[
        int | None,
        typer.Option(
            help="Accept on this inherited, listening socket instead of binding HOST:PORT "
            "(set by launchers such as corral's sandboxed local provider)."
        ),
    ] = None,
    max_sessions: Annotated[
        int | None,
        typer.Option(help="Sessions held at once (default: the manifest's, else 1024)."),
    ] = None,
    idle_timeout: Annotated[
        float | None,
        typer.Option(
            help="Reap sessions idle this many seconds; 0: never (default: the manifest's, "
            "else 600)."
        ),
    ] = None,
    step_timeout: Annotated[
        float, typer.Option(help="Abandon a reset/step/state after this many seconds (0: never).")
    ] = 300.0,
    resume_window: Annotated[
        float, typer.Option(help="Keep a dropped connection's sessions this long for resume.")
    ] = 30.0,
    ping_interval: Annotated[
        float, typer.Option(help="Send a WebSocket keepalive ping this often, seconds (0: off).")
    ] = 20.0,
    ping_timeout: Annotated[
        float,
        typer.Option(help="Drop a connection whose pong is this late, seconds (0: never)."),
    ] = 20.0,
    max_sessions_per_client: Annotated[
        int,
        typer.Option(
            help="Sessions one client address may hold, however opened (0: any; default: "
            "all of --max-sessions but an eighth, kept for other clients)."
        ),
    ] = AUTO,
    max_connections_per_client: Annotated[
        int,
        typer.Option(
            help="WebSocket connections (and HTTP sessions) one client address may hold; "
            "0: any (behind a reverse proxy every client shares its address)."
        ),
    ] = 256,
    max_frame_bytes: Annotated[
        int, typer.Option(help="Larger frames get FRAME_TOO_LARGE (the session lives on).")
    ] = 16 * 1024 * 1024,
    executor_threads: Annotated[
        int, typer.Option(help="Threads running sync environments' calls.")
    ] = 32,
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="Require 'Authorization: Bearer <token>' with the token in this file "
            "(default: $CORRAL_TOKEN or $CORRAL_TOKEN_FILE if set)."
        ),
    ] = None,
    fleet_key_file: Annotated[
        Path | None,
        typer.Option(
            help="The fleet key, shared by every server of a fleet, in this file: session "
            "snapshots are signed with it and only signed ones restored (default: "
            "$CORRAL_FLEET_KEY if set)."
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(help="Worker processes holding the environments (0: in the server)."),
    ] = 0,
    max_hung_calls: Annotated[
        int,
        typer.Option(
            help="Timed-out calls still holding threads before /ready says 503 and new "
            "sessions are refused (NOT_READY); a worker reaching it is replaced."
        ),
    ] = 16,
    inline_step: Annotated[
        float,
        typer.Option(
            help="Run a sync env's calls on the event loop while they average under this "
            "many seconds, or under a measured thread hop up to 1 ms (0: never; envs "
            "with blocking = True never)."
        ),
    ] = 100e-6,
    web: Annotated[
        bool,
        typer.Option(
            "--web/--no-web",
            # OpenEnv's switch of its web interface turns on corral's.
            envvar="ENABLE_WEB_INTERFACE",
            help="Serve the web UI at /web (/ redirects there); with a token, browsers "
            "exchange it once for a short-lived cookie. Default: $ENABLE_WEB_INTERFACE "
            "(OpenEnv's switch), else off.",
        ),
    ] = False,
    kwarg: Annotated[
        list[str] | None,
        typer.Option(
            "--kwarg",
            help="key=value passed to gymnasium.make for a gym:ENV_ID target (repeatable; "
            "JSON values are parsed: --kwarg render_mode=rgb_array --kwarg max_episode_steps=50).",
        ),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option(
            help="debug, info (the banner and a line per session event), warning or error; "
            "uvicorn's own lines show at debug."
        ),
    ] = "info",
    log_format: Annotated[
        str,
        typer.Option(help="text, or json: one object per line, session ids as fields."),
    ] = "text",
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Send the traceback of an exception the environment raised to the client "
            "(in the ENV_ERROR's details); never use it on a public server.",
        ),
    ] = False,
    mcp: Annotated[
        bool,
        typer.Option(
            "--mcp",
            help="Also serve the MCP specification's streamable HTTP transport at "
            "/mcp/stream (an MCP client's initialize on /mcp is answered there too).",
        ),
    ] = False,
    transport: Annotated[
        str,
        typer.Option(
            help="What serves corral/1 WebSockets: native (picows, on the same port), asgi "
            "(uvicorn), or auto (native when picows is installed)."
        ),
    ] = "auto",
    handshake_timeout: Annotated[
        float, typer.Option(help="A connection's request head must arrive within this (s).")
    ] = 10.0,
    server_id: Annotated[
        str | None,
        typer.Option(
            envvar="CORRAL_SERVER_ID",
            help="This server's id, the corral-server header a front door routes by "
            "(default: HOSTNAME-PORT).",
        ),
    ] = None,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-origin",
            help="A browser origin (scheme://host[:port]) allowed to open WebSockets and "
            "send state-changing requests besides the server's own (repeatable; * any).",
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="A Host name requests may use besides IP addresses and localhost "
            "(repeatable; * any): the public name of a proxy on this host that keeps it.",
        ),
    ] = None,
    frame_timeout: Annotated[
        float,
        typer.Option(help="A WebSocket frame must arrive whole within this (s; 0: never)."),
    ] = 30.0,
    message_timeout: Annotated[
        float,
        typer.Option(
            help="A fragmented WebSocket message must be whole within this (s; 0: never)."
        ),
    ] = 60.0,
) -> None:
    """Serve an environment over WebSocket and HTTP (loopback by default)."""
    if log_format not in FORMATS:
        raise typer.BadParameter(
            f"{log_format!r} is not a log format; use {' or '.join(FORMATS)}",
            param_hint="--log-format",
        )
    chosen = read_serve_target(target)
    env = load_serve_target(chosen, make_kwargs=parse_make_kwargs(kwarg or []))
    manifest = chosen.manifest
    if manifest is not None:
        warn_if_unlocked(manifest)
    if max_sessions is None:
        max_sessions = manifest.concurrency.max_sessions if manifest else 1024
    if idle_timeout is None:
        idle_timeout = manifest.concurrency.idle_timeout_s if manifest else 600.0
    if port is None:
        port = manifest.port if manifest else 8000
    token = _secret(read_token_file, token_file, "--token-file")
    fleet_key = _secret(read_fleet_key_file, fleet_key_file, "--fleet-key-file")
    if transport not in TRANSPORTS:
        raise typer.BadParameter(f"choose one of {sorted(TRANSPORTS)}", param_hint="--transport")
    if server_id is not None and not SERVER_ID.fullmatch(server_id):
        raise typer.BadParameter(
            f"{server_id!r} must match {SERVER_ID.pattern} (letters, digits, '.', '_', '-')",
            param_hint="--server-id",
        )
    try:
        config = ServerConfig(
            max_sessions=max_sessions,
            idle_timeout_s=idle_timeout or None,
            step_timeout_s=step_timeout or None,
            resume_window_s=resume_window,
            ping_interval_s=ping_interval or None,
            ping_timeout_s=ping_timeout or None,
            max_sessions_per_client=max_sessions_per_client or None,
            max_connections_per_client=max_connections_per_client or None,
            max_frame_bytes=max_frame_bytes,
            executor_threads=executor_threads,
            token=token,
            workers=workers,
            transport=transport,
            handshake_timeout_s=handshake_timeout,
            web=web,
            max_hung_calls=max_hung_calls,
            inline_step_s=inline_step,
            debug=debug,
            allowed_origins=tuple(allow_origin or ()),
            allowed_hosts=tuple(allow_host or ()),
            frame_timeout_s=frame_timeout or None,
            message_timeout_s=message_timeout or None,
            fleet_key=fleet_key,
            server_id=server_id,
        )
    except ValueError as exc:  # a malformed --allow-origin / --allow-host, a bad limit
        raise typer.BadParameter(str(exc)) from None
    sock = None
    if fd is not None:
        try:
            sock = inherited_socket(fd)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--fd") from None
    try:
        serve(
            env,
            host=host,
            port=port,
            port_file=port_file,
            log_level=log_level,
            config=config,
            sock=sock,
            log_format=log_format,
            customize=_mount_mcp if mcp else None,
        )
    except PreflightError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _secret(read: Callable[[Path], T], path: Path | None, option: str) -> T | None:
    """The secret ``read`` finds in the file ``option`` names (None without the option).

    Raises:
        typer.BadParameter: the file cannot be read or holds no usable secret.
    """
    if path is None:
        return None
    try:
        return read(path)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def warn_if_unlocked(manifest: Manifest) -> None:
    """Warn on stderr when the models differ from the schema lock file (breaking changes
    named), or the class's contract version from the manifest's: clients built from the
    lock would be refused, or fail."""
    if not manifest.lock_path.is_file():
        return
    from corral.contract.lock import LockError, check_lock, read_lock
    from corral.providers.manifest import load_contract

    try:
        contract = load_contract(manifest)
        result = check_lock(read_lock(manifest.lock_path), contract)
    except (LockError, ImportError, TypeError) as exc:
        typer.echo(f"warning: cannot compare the models with the schema lock: {exc}", err=True)
        return
    if "contract_version" in manifest.model_fields_set and (
        manifest.contract_version != contract.version
    ):
        typer.echo(
            f"warning: the environment's contract_version is {contract.version} but the "
            f"manifest says {manifest.contract_version}",
            err=True,
        )
    if not result.stale:
        return
    name = manifest.lock_path.name
    if result.breaking:
        named = "; ".join(f"{c.path}: {c.message}" for c in result.breaking[:3])
        bumped = " (the major version was bumped)" if result.major_bumped else ""
        typer.echo(
            f"warning: the models differ from {name} by {len(result.breaking)} breaking "
            f"change(s){bumped}: {named}; clients built from the lock will be refused. "
            "Run 'corral schema check'.",
            err=True,
        )
    else:
        typer.echo(
            f"warning: the models differ from {name} (compatible changes only, contract "
            f"{result.lock.contract_version} -> {contract.version}); run 'corral schema lock'.",
            err=True,
        )


def _mount_mcp(app: Any) -> None:
    from corral.adapters.mcp import mount_mcp

    try:
        mount_mcp(app)
    except TypeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--mcp") from None

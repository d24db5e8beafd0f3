"""``corral serve``: run an environment server."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.adapters.openenv_env import load_openenv, openenv_target
from corral.auth import read_token_file
from corral.protocol.identity import SERVER_ID
from corral.providers.manifest import Manifest, ManifestError, load_manifest
from corral.server.config import AUTO, TRANSPORTS, ServerConfig
from corral.server.logs import FORMATS
from corral.server.serve import inherited_socket, serve
from corral.server.target import TargetError, load_target


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


def resolve_serve_target(
    target: str, *, search_path: Path | None = None, make_kwargs: dict[str, Any] | None = None
) -> Any:
    """Turn ``corral serve``'s TARGET (``module:Class`` or ``gym:ENV_ID``) into what
    ``create_app`` takes.

    An OpenEnv environment class or app (``create_app(...)``'s result) is wrapped by
    :func:`corral.adapters.openenv_env.from_openenv`, with what the app was built with;
    ``gym:ENV_ID`` serves a registered Gymnasium environment
    (:func:`corral.adapters.gymnasium.serve_target`).

    Args:
        target: the reference.
        search_path: put first on ``sys.path`` (default: the working directory).
        make_kwargs: ``gymnasium.make`` keyword arguments of a ``gym:ENV_ID`` target.
    """
    where = search_path or Path.cwd()
    if make_kwargs and not target.startswith("gym:"):
        raise typer.BadParameter(
            "--kwarg passes gymnasium.make keyword arguments: only a 'gym:ENV_ID' target "
            "takes them",
            param_hint="--kwarg",
        )
    try:
        if target.startswith("gym:"):
            from corral.adapters.gymnasium import serve_target

            return serve_target(target, search_path=where, make_kwargs=make_kwargs)
        obj = load_target(target, search_path=where)
    except (TargetError, ValueError, ImportError) as exc:
        raise typer.BadParameter(str(exc), param_hint="TARGET") from None
    try:
        return openenv_target(obj)
    except (TypeError, ImportError) as exc:
        raise typer.BadParameter(str(exc), param_hint="TARGET") from None


@dataclass(frozen=True)
class ServeTarget:
    """What ``corral serve TARGET`` serves and the defaults its manifest gives.

    Attributes:
        reference: the entry point (``module:Class``, ``module:factory`` or ``gym:ID``).
        search_path: the directory its modules are imported from.
        manifest: the environment's manifest, when TARGET named a directory or file.
    """

    reference: str
    search_path: Path
    manifest: Manifest | None = None


def is_manifest_path(target: str) -> bool:
    """TARGET names an environment directory or manifest file rather than a reference."""
    path = Path(target)
    return path.is_dir() or (path.suffix in (".yaml", ".yml") and path.is_file())


def parse_serve_target(target: str) -> ServeTarget:
    """Interpret TARGET: an environment directory / manifest file, or a reference.

    Raises:
        typer.BadParameter: the manifest is invalid, or TARGET is neither a path nor a
            reference; the message says how to fix it.
    """
    if is_manifest_path(target):
        try:
            manifest = load_manifest(target)
        except ManifestError as exc:
            raise typer.BadParameter(str(exc), param_hint="TARGET") from None
        return ServeTarget(manifest.entry_point, manifest.root, manifest)
    if ":" not in target and target.isidentifier():
        try:
            found = load_openenv(target)
        except (TypeError, ImportError) as exc:
            raise typer.BadParameter(str(exc), param_hint="TARGET") from None
        if found is not None:  # an installed OpenEnv environment package
            return ServeTarget(f"{target}.server.app:app", Path.cwd())
    if ":" not in target:
        raise typer.BadParameter(
            f"{target!r} is neither a directory with corral.yaml / openenv.yaml nor an "
            "entry point; pass the environment's directory, 'package.module:ClassName' "
            "or 'gym:CartPole-v1'",
            param_hint="TARGET",
        )
    return ServeTarget(target, Path.cwd())


def serve_command(
    target: Annotated[
        str,
        typer.Argument(
            help="The environment: a directory with corral.yaml (default: the current one), "
            "'package.module:ClassName' or 'gym:CartPole-v1'."
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
        int, typer.Option(help="WebSocket connections one client address may hold (0: any).")
    ] = 1024,
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
            "many seconds (0: never; envs with blocking = True never)."
        ),
    ] = 100e-6,
    web: Annotated[
        bool,
        typer.Option(
            "--web/--no-web",
            help="Serve the web UI at /web (/ redirects there); with a token, browsers "
            "exchange it once for a short-lived cookie.",
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
) -> None:
    """Serve an environment over WebSocket and HTTP (loopback by default)."""
    if log_format not in FORMATS:
        raise typer.BadParameter(
            f"{log_format!r} is not a log format; use {' or '.join(FORMATS)}",
            param_hint="--log-format",
        )
    chosen = parse_serve_target(target)
    env = resolve_serve_target(
        chosen.reference,
        search_path=chosen.search_path,
        make_kwargs=parse_make_kwargs(kwarg or []),
    )
    manifest = chosen.manifest
    if manifest is not None:
        warn_if_unlocked(manifest)
    if max_sessions is None:
        max_sessions = manifest.concurrency.max_sessions if manifest else 1024
    if idle_timeout is None:
        idle_timeout = manifest.concurrency.idle_timeout_s if manifest else 600.0
    if port is None:
        port = manifest.port if manifest else 8000
    token = None
    if token_file is not None:
        try:
            token = read_token_file(token_file)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--token-file") from None
    if transport not in TRANSPORTS:
        raise typer.BadParameter(f"choose one of {sorted(TRANSPORTS)}", param_hint="--transport")
    if server_id is not None and not SERVER_ID.fullmatch(server_id):
        raise typer.BadParameter(
            f"{server_id!r} must match {SERVER_ID.pattern} (letters, digits, '.', '_', '-')",
            param_hint="--server-id",
        )
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
        server_id=server_id,
    )
    sock = None
    if fd is not None:
        try:
            sock = inherited_socket(fd)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--fd") from None
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

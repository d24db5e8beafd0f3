"""Server logs a person can read: a start-up banner, an access log of sessions, text or JSON.

    corral serve ... [--log-level info] [--log-format text|json]

* :func:`configure` sends corral's loggers to stderr in the chosen format. uvicorn's own
  lines (its start-up chatter, one line per HTTP request) only show at ``debug``: the banner
  says what they would.
* :func:`banner` / :func:`log_banner`: what is being served and how: the URL, the
  environment, its contract version and fingerprint, the protocols and codecs, the limits,
  whether authentication and the web UI are on.
* The access log (logger ``corral.access``) has one line per session event: opened,
  detached (its connection dropped; resumable for a while), resumed, closed with the reason
  (closed by the client, the client disconnected, idle, not resumed in time, timed out,
  server shutting down), with the session's episode and step counts.

Every record can carry fields (``session``, ``episode``, ``steps``, ``reason`` ...): the
text format appends them where the message does not already say them, and the JSON format
(one object per line) has them as keys, so that a log pipeline can filter by session.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Protocol

FIELDS = "corral"
"""The attribute of a log record holding its fields (pass ``extra={FIELDS: {...}}``)."""

FORMATS = ("text", "json")

access = logging.getLogger("corral.access")
"""The session access log."""

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class _Machine(Protocol):
    @property
    def episodes(self) -> int: ...

    @property
    def steps(self) -> int: ...


class _Session(Protocol):
    """What the access log reads of a session (:class:`corral.server.sessions.Session`)."""

    @property
    def id(self) -> str: ...

    @property
    def machine(self) -> _Machine: ...


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The fields of ``record``: its ``extra={FIELDS: ...}`` plus any other extra keys."""
    found: dict[str, Any] = dict(getattr(record, FIELDS, None) or {})
    for key, value in record.__dict__.items():
        if key not in _RESERVED and key != FIELDS and not key.startswith("_"):
            found.setdefault(key, value)
    return found


class TextFormatter(logging.Formatter):
    """``2025-06-01 12:00:00.123 INFO  corral.access  session 3f2a9c1b closed: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        message = record.getMessage()
        fields = fields_of(record)
        extra = " ".join(
            f"{key}={value}"
            for key, value in fields.items()
            if key not in _SHOWN_IN_TEXT and value is not None and not fields.get("banner")
        )
        line = f"{stamp}.{int(record.msecs):03d} {record.levelname:<7} {record.name}  {message}"
        if extra:
            line += f"  [{extra}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


# Fields the access log's text messages spell out already.
_SHOWN_IN_TEXT = frozenset({"event", "session", "reason", "episodes", "steps", "banner"})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message`` and the fields."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        data: dict[str, Any] = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in fields_of(record).items():
            data.setdefault(key, value)
        if record.exc_info:
            data["traceback"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


def configure(fmt: str = "text", level: str | int = "info", stream: Any = None) -> None:
    """Send corral's logs (and uvicorn's) to ``stream`` (stderr) in format ``fmt``.

    Raises:
        ValueError: an unknown format or level.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; use one of {', '.join(FORMATS)}")
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    corral_log = logging.getLogger("corral")
    corral_log.handlers = [handler]
    corral_log.setLevel(numeric)
    corral_log.propagate = False
    # uvicorn's start-up lines repeat the banner and its access lines are per HTTP request:
    # shown at debug only, through the same handler.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = [handler] if name == "uvicorn" else []
        logger.propagate = name != "uvicorn"
        logger.setLevel(logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING)
    # picows logs every connection's end ("Disconnected") on the native transport's logger;
    # the access log already says when a session closes and why: at debug only, like uvicorn.
    native = logging.getLogger("corral.server.native")
    native.setLevel(logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING)


def _mib(size: int) -> str:
    return f"{size / 2**20:g} MiB" if size >= 2**20 else f"{size} bytes"


def _seconds(value: float | None, never: str = "never") -> str:
    return never if value is None else f"{value:g} s"


def banner(
    *,
    url: str,
    env: Mapping[str, Any],
    limits: Mapping[str, Any],
    auth: bool,
    ui: str | None,
    openenv: bool,
    workers: int,
) -> list[str]:
    """The start-up banner's lines.

    Args:
        url: where the server listens.
        env: ``name``, ``cls`` (``module:Class``), ``contract_version``, ``fingerprint``.
        limits: the server's :meth:`~corral.server.config.ServerConfig.limits`.
        auth: a bearer token is required.
        ui: the web UI's path when it is served, else None.
        openenv: OpenEnv's envelope and HTTP routes are served too.
        workers: worker processes holding the environments (0: in the server).
    """
    protocols = "corral/1 on /ws (msgpack, json)"
    if openenv:
        protocols += "; OpenEnv on /ws and HTTP /reset /step /state /mcp (json)"
    per_connection = limits.get("max_sessions_per_connection")
    per_client = limits.get("max_sessions_per_client") or "any"
    return [
        f"corral serving {env['name']} ({env['cls']}) at {url}",
        f"  contract  {env['contract_version']}, fingerprint {str(env['fingerprint'])[:23]}",
        f"  protocols {protocols}",
        f"  limits    {limits['max_sessions']} sessions ({per_connection} per connection, "
        f"{per_client} per client), "
        f"idle {_seconds(limits.get('idle_timeout_s'))}, step timeout "
        f"{_seconds(limits.get('step_timeout_s'), 'none')}, resume window "
        f"{_seconds(limits.get('resume_window_s'))}, frames {_mib(limits['max_frame_bytes'])}, "
        f"batches {limits.get('max_batch')}",
        f"  auth      {'on (bearer token)' if auth else 'off'}",
        f"  web UI    {f'on at {ui}' if ui else 'off'}",
        f"  workers   {workers or 'none (environments run in the server process)'}",
    ]


def _paths(routes: Any, depth: int = 0) -> set[str]:
    """The paths of ``routes``, including those of included routers and mounts."""
    found: set[str] = set()
    for route in routes:
        path = getattr(route, "path", None)
        if isinstance(path, str):
            found.add(path)
        inner = getattr(route, "original_router", None) or getattr(route, "app", None)
        nested = getattr(inner, "routes", None)
        if nested is not None and depth < 4:
            found |= {(path or "") + p for p in _paths(nested, depth + 1)}
    return found


def log_banner(app: Any, url: str) -> None:
    """Log the banner of ``app`` (made by :func:`~corral.server.app.create_app`) at ``url``."""
    log = logging.getLogger("corral.server")
    if not log.isEnabledFor(logging.INFO):
        return
    service = app.state.service
    config = service.config
    paths = _paths(app.routes)
    ui = next((p for p in ("/web", "/ui") if any(x.startswith(p) for x in paths)), None)
    env = {
        "name": service.contract.name,
        "cls": f"{service.env_type.__module__}:{service.env_type.__qualname__}",
        "contract_version": service.contract.version,
        "fingerprint": service.fingerprint,
    }
    limits = config.limits()
    lines = banner(
        url=url,
        env=env,
        limits=limits,
        auth=config.token is not None,
        ui=ui,
        openenv="/reset" in paths,
        workers=config.workers,
    )
    fields = {
        "event": "started",
        "banner": True,
        "url": url,
        "env": env["name"],
        "env_class": env["cls"],
        "contract_version": env["contract_version"],
        "fingerprint": env["fingerprint"],
        "codecs": ["msgpack", "json"],
        "limits": limits,
        "auth": config.token is not None,
        "ui": ui,
        "workers": config.workers,
    }
    log.info("\n".join(lines), extra={FIELDS: fields})


def _session_event(session: _Session, event: str, message: str, **more: Any) -> None:
    fields = {
        "event": event,
        "session": session.id,
        "episodes": session.machine.episodes,
        "steps": session.machine.steps,
        **more,
    }
    access.info(message, extra={FIELDS: fields})


def session_opened(session: _Session) -> None:
    """Access log: ``session`` was opened."""
    if access.isEnabledFor(logging.INFO):
        _session_event(session, "opened", f"session {session.id} opened")


def session_closed(session: _Session, reason: str) -> None:
    """Access log: ``session`` was closed, and why."""
    if access.isEnabledFor(logging.INFO):
        machine = session.machine
        _session_event(
            session,
            "closed",
            f"session {session.id} closed: {reason} "
            f"({machine.episodes} episodes, {machine.steps} steps)",
            reason=reason,
        )


def session_detached(session: _Session, resume_window_s: float) -> None:
    """Access log: the connection of ``session`` dropped; it waits to be resumed."""
    if access.isEnabledFor(logging.INFO):
        _session_event(
            session,
            "detached",
            f"session {session.id} detached: connection lost, resumable for {resume_window_s:g} s",
            reason="connection lost",
        )


def session_resumed(session: _Session) -> None:
    """Access log: a client re-attached to ``session``."""
    if access.isEnabledFor(logging.INFO):
        _session_event(session, "resumed", f"session {session.id} resumed by a new connection")


__all__ = [
    "FIELDS",
    "FORMATS",
    "JsonFormatter",
    "TextFormatter",
    "access",
    "banner",
    "configure",
    "fields_of",
    "log_banner",
    "session_closed",
    "session_detached",
    "session_opened",
    "session_resumed",
]

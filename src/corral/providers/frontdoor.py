"""Front doors for a fleet: nginx and HAProxy configurations that route by server id.

Several ``corral serve`` processes behind one address lose no session when the front door
sends a reconnecting client back to the server that holds its sessions. A corral client
names that server in the ``corral-server`` request header (the id every server reports
in its ``welcome``, ``--server-id``); a client without it (a new connection, an OpenEnv
client) is balanced over the servers that are ready. Both renderers here do exactly
that, with stock features of each proxy:

* **nginx** (the open-source build): a ``map`` from the header to one ``upstream`` per
  server, the balanced upstream by default, and ``proxy_pass http://$corral_upstream``.
  A server that refuses a new connection (503 while draining or full) is skipped by
  ``proxy_next_upstream`` for a balanced request; a routed one gets the refusal, which
  the client reads as "try again".
* **HAProxy**: ``use-server NAME if { req.hdr(corral-server) -m str NAME }`` per server
  (forced even onto a server the health check marked down: a draining server must
  still be reached by the clients moving their sessions off it), a ``corral-server``
  cookie as a second affinity, and ``/ready`` health checks so that new clients avoid a
  full or draining server.

The same renderers make the configurations ``corral deploy nginx|haproxy`` prints and
the ones the fleet tests start the real proxies with (``tests/support/frontdoor.py``),
so what is documented is what is tested.

Every value that reaches a configuration is checked against a strict pattern first
(server ids, addresses, paths): a name cannot smuggle a directive into the file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.errors import UsageError
from corral.protocol.handshake import ROUTE_HEADER
from corral.protocol.identity import SERVER_ID

ROUTE_COOKIE = "corral-server"
"""HAProxy's affinity cookie (inserted on the upgrade's response, sent back by clients)."""

_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]{0,252})")
_PATH = re.compile(r"/[A-Za-z0-9._/-]*")


class FrontDoorError(UsageError, ValueError):
    """A front door's settings are invalid (the message names the value and the rule)."""


@dataclass(frozen=True)
class Backend:
    """One server behind the front door: its id and the address the proxy reaches it at.

    Attributes:
        id: the server's id (``corral serve --server-id``); the routing key.
        address: ``host:port`` (``[v6]:port`` for IPv6).
    """

    id: str
    address: str

    def __post_init__(self) -> None:
        if not SERVER_ID.fullmatch(self.id):
            raise FrontDoorError(
                f"server id {self.id!r} must match {SERVER_ID.pattern} "
                "(letters, digits, '.', '_', '-'; at most 63 characters)"
            )
        host, _, port = self.address.rpartition(":")
        if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise FrontDoorError(
                f"address {self.address!r} of server {self.id!r} must be host:port"
            )

    @classmethod
    def parse(cls, text: str) -> Backend:
        """``ID=HOST:PORT`` (the CLI's form)."""
        sid, sep, address = text.partition("=")
        if not sep:
            raise FrontDoorError(f"a server is ID=HOST:PORT, got {text!r}")
        return cls(sid.strip(), address.strip())


def _listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise FrontDoorError(f"listen address {listen!r} must be host:port")
    return host, int(port)


def _checked(backends: Sequence[Backend]) -> list[Backend]:
    found = list(backends)
    if not found:
        raise FrontDoorError("a front door needs at least one server")
    ids = [b.id for b in found]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise FrontDoorError(f"server ids must be unique; repeated: {', '.join(duplicates)}")
    return found


def _upstream(backend: Backend) -> str:
    return f"corral_server_{backend.id}"


def render_nginx(
    backends: Sequence[Backend],
    *,
    listen: str = "127.0.0.1:8080",
    prefix: str | Path | None = None,
    websocket_timeout_s: int = 3600,
    max_body_bytes: int = 32 * 1024 * 1024,
    shutdown_timeout_s: float | None = None,
    standalone: bool = True,
) -> str:
    """An nginx configuration routing ``corral-server`` to its server.

    Args:
        backends: the servers.
        listen: where nginx listens.
        prefix: with ``standalone``, the directory nginx keeps its pid, logs and temporary
            files in (default: nginx's own).
        websocket_timeout_s: how long a silent WebSocket stays open (the server's pings
            keep live ones busy far more often).
        max_body_bytes: the largest HTTP body (OpenEnv's ``/step`` carries the action).
        shutdown_timeout_s: ``worker_shutdown_timeout``: on reload, old workers close
            their connections after this long (None: nginx waits for them to end).
        standalone: a whole ``nginx.conf``; False: only what goes inside ``http {}``.
    """
    found = _checked(backends)
    _listen(listen)
    lines: list[str] = []
    if standalone:
        root = None if prefix is None else Path(prefix)
        if root is not None and not _PATH.fullmatch(str(root)):
            raise FrontDoorError(f"prefix {str(root)!r} must be an absolute plain path")
        lines += ["worker_processes 1;", "daemon off;"]
        if root is not None:
            lines += [f"pid {root}/nginx.pid;", f"error_log {root}/error.log warn;"]
        if shutdown_timeout_s is not None:
            lines.append(f"worker_shutdown_timeout {max(1, round(shutdown_timeout_s * 1000))}ms;")
        lines += ["events { worker_connections 4096; }", "http {"]
        if root is not None:
            lines += [
                f"    access_log {root}/access.log;",
                *(
                    f"    {kind}_temp_path {root}/{kind}_temp;"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
                ),
            ]
    pad = "    " if standalone else ""
    body = [
        "# The connection's Upgrade header, passed on (a WebSocket) or not (plain HTTP).",
        "map $http_upgrade $corral_connection {",
        "    default upgrade;",
        "    ''      close;",
        "}",
        f"# A client names its sessions' server in the {ROUTE_HEADER} header.",
        f"map $http_{ROUTE_HEADER.replace('-', '_')} $corral_upstream {{",
        "    default corral_fleet;",
        *(f"    {b.id} {_upstream(b)};" for b in found),
        "}",
        "upstream corral_fleet {",
        *(f"    server {b.address} max_fails=1 fail_timeout=2s;" for b in found),
        "}",
        *(
            line
            for b in found
            for line in (f"upstream {_upstream(b)} {{", f"    server {b.address};", "}")
        ),
        "server {",
        f"    listen {listen};",
        f"    client_max_body_size {max_body_bytes};",
        "    location / {",
        "        proxy_pass http://$corral_upstream;",
        "        proxy_http_version 1.1;",
        "        proxy_set_header Upgrade $http_upgrade;",
        "        proxy_set_header Connection $corral_connection;",
        "        proxy_set_header Host $host;",
        "        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "        proxy_buffering off;",
        f"        proxy_read_timeout {websocket_timeout_s}s;",
        f"        proxy_send_timeout {websocket_timeout_s}s;",
        "        proxy_next_upstream error timeout http_502 http_503;",
        "    }",
        "}",
    ]
    lines += [pad + line if line else line for line in body]
    if standalone:
        lines.append("}")
    return "\n".join(lines) + "\n"


def render_haproxy(
    backends: Sequence[Backend],
    *,
    listen: str = "127.0.0.1:8080",
    stats_socket: str | Path | None = None,
    websocket_timeout_s: int = 3600,
    check_interval_ms: int = 1000,
    hard_stop_after_s: float | None = None,
) -> str:
    """An HAProxy configuration routing ``corral-server`` (or its cookie) to its server.

    Args:
        backends: the servers.
        listen: where HAProxy listens.
        stats_socket: the runtime API's UNIX socket (admin level), e.g. to cut sessions.
        websocket_timeout_s: ``timeout tunnel``: how long a silent WebSocket stays open.
        check_interval_ms: how often each server's ``/ready`` is checked.
        hard_stop_after_s: on reload, old processes close their connections after this
            long (None: they wait for them to end).
    """
    found = _checked(backends)
    _listen(listen)
    lines = ["global", "    maxconn 8192"]
    if stats_socket is not None:
        if not _PATH.fullmatch(str(stats_socket)):
            raise FrontDoorError(f"stats socket {str(stats_socket)!r} must be a plain path")
        lines.append(f"    stats socket {stats_socket} mode 600 level admin")
    if hard_stop_after_s is not None:
        lines.append(f"    hard-stop-after {max(1, round(hard_stop_after_s * 1000))}ms")
    lines += [
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 60s",
        "    timeout server 60s",
        f"    timeout tunnel {websocket_timeout_s}s",
        "    timeout http-request 10s",
        "    retries 3",
        "    option redispatch",
        "    retry-on conn-failure empty-response 503",
        "frontend corral",
        f"    bind {listen}",
        "    default_backend corral_fleet",
        "backend corral_fleet",
        "    balance roundrobin",
        f"    cookie {ROUTE_COOKIE} insert indirect nocache",
        "    option httpchk GET /ready",
        "    http-check expect status 200",
        # A routed request goes to its server even when the check says it is down: a
        # draining server refuses new clients but must still see those moving off it.
        f"    force-persist if {{ req.hdr({ROUTE_HEADER}) -m found }}",
        *(f"    use-server {b.id} if {{ req.hdr({ROUTE_HEADER}) -m str {b.id} }}" for b in found),
        *(
            f"    server {b.id} {b.address} check inter {check_interval_ms} fall 2 rise 1 "
            f"cookie {b.id}"
            for b in found
        ),
    ]
    return "\n".join(lines) + "\n"


_IPV4_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
POD_IP_ROUTE = rf"^(?<pod>{_IPV4_OCTET}(\.{_IPV4_OCTET}){{3}})$"
"""The ``corral-server`` values the Pod router routes: a dotted IPv4 address (the servers
of a ``corral deploy k8s --router`` fleet take their Pod IP as ``--server-id``)."""


def render_nginx_pod_router(
    fleet: str,
    *,
    pod_port: int,
    listen: str = "0.0.0.0:8080",
    prefix: str | Path | None = None,
    websocket_timeout_s: int = 3600,
    max_body_bytes: int = 32 * 1024 * 1024,
) -> str:
    """A standalone nginx that routes a ``corral-server`` header naming a Pod IP to that
    Pod, and everything else to ``fleet`` (the balanced Service, ``host:port``).

    The fleet's Pods come and go with the autoscaler, so the router has no list of them:
    the header *is* the address (the servers' id is their Pod IP), checked against a
    strict IPv4 pattern first; a value that is not one goes to the fleet. What the header
    could reach is bounded where the router runs: its NetworkPolicy lets it reach only
    the fleet's Pods on ``pod_port`` (``corral deploy k8s --router``). A forged header
    gains nothing a client could not reach anyway: sessions are found by their ids,
    which are signed.
    """
    _listen(listen)
    host, _, port = fleet.rpartition(":")
    if not _HOST.fullmatch(host) or not port.isdigit():
        raise FrontDoorError(f"fleet address {fleet!r} must be host:port")
    if not 0 < pod_port < 65536:
        raise FrontDoorError(f"pod port {pod_port} is not a port")
    root = None if prefix is None else Path(prefix)
    if root is not None and not _PATH.fullmatch(str(root)):
        raise FrontDoorError(f"prefix {str(root)!r} must be an absolute plain path")
    lines = ["worker_processes 1;", "daemon off;"]
    if root is not None:
        lines += [f"pid {root}/nginx.pid;", f"error_log {root}/error.log warn;"]
    lines += ["events { worker_connections 4096; }", "http {"]
    if root is not None:
        lines += [f"    access_log {root}/access.log;"] + [
            f"    {kind}_temp_path {root}/{kind}_temp;"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        ]
    lines += [
        "    map $http_upgrade $corral_connection {",
        "        default upgrade;",
        "        ''      close;",
        "    }",
        f"    # {ROUTE_HEADER}: a Pod IP goes to that Pod; anything else to the fleet.",
        f"    map $http_{ROUTE_HEADER.replace('-', '_')} $corral_target {{",
        "        default corral_fleet;",
        f'        "~{POD_IP_ROUTE}" $pod:{pod_port};',
        "    }",
        "    upstream corral_fleet {",
        f"        server {fleet} max_fails=1 fail_timeout=2s;",
        "    }",
        "    server {",
        f"        listen {listen};",
        f"        client_max_body_size {max_body_bytes};",
        "        location / {",
        "            proxy_pass http://$corral_target;",
        "            proxy_http_version 1.1;",
        "            proxy_set_header Upgrade $http_upgrade;",
        "            proxy_set_header Connection $corral_connection;",
        "            proxy_set_header Host $host;",
        "            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "            proxy_buffering off;",
        f"            proxy_read_timeout {websocket_timeout_s}s;",
        f"            proxy_send_timeout {websocket_timeout_s}s;",
        "        }",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


__all__ = [
    "POD_IP_ROUTE",
    "ROUTE_COOKIE",
    "ROUTE_HEADER",
    "SERVER_ID",
    "Backend",
    "FrontDoorError",
    "render_haproxy",
    "render_nginx",
    "render_nginx_pod_router",
]

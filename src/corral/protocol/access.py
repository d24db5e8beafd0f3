"""Who may use a server, decided from a request's head alone.

One rule set for every face that receives requests — the HTTP routes (the middleware of
:mod:`corral.server.auth`) and the WebSocket upgrade on each transport
(:func:`corral.protocol.upgrade.admit_upgrade`) — checked in this order:

1. **Host** (DNS rebinding): a page on ``evil.example`` can make its own name resolve to
   127.0.0.1 and then talk to a loopback server as if same-origin. So on a connection
   that arrived at a loopback address, the ``Host`` must be an IP address or a loopback
   name (``localhost``, ``*.localhost``) — names an attacker cannot point — or one of
   :attr:`AccessPolicy.hosts`. Once that list is set, it applies on every connection.
2. **Origin** (the browser is a peer too): a WebSocket upgrade or a state-changing request
   (any method but GET, HEAD, OPTIONS) that carries an ``Origin`` must come from the
   server's own origin (the ``Origin``'s host and port are the ``Host``'s) or one of
   :attr:`AccessPolicy.origins`. Non-browser clients send no ``Origin``: allowed.
3. **Credentials**: with a token, ``Authorization: Bearer <token>`` — exactly one such
   header; two are refused, whichever would win — or, with the web UI, its cookie from
   the server's own origin.

:func:`check_content_type` adds the body rule for HTTP: a state-changing request with a
body must declare a JSON content type. The content types a page may send cross-origin
without a CORS preflight (``text/plain``, forms) are not JSON, so a page elsewhere can
never post a body the server reads.

A refusal (:class:`Refusal`) is data: the HTTP status, a :class:`~corral.errors.CorralError`
with a stable code (``FORBIDDEN``, ``UNAUTHORIZED``, ``BAD_FRAME``) and the headers to
send; each face renders it in its own way.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from corral.auth import COOKIE_NAME, bearer_matches, cookie_matches
from corral.errors import BadFrame, CorralError, Forbidden, Unauthorized
from corral.protocol.fields import clip
from corral.protocol.messages import ErrorReply
from corral.protocol.outflow import CloseCode

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing: no Origin or content-type rule applies to them."""

ANY = "*"
"""In :attr:`AccessPolicy.origins` or :attr:`AccessPolicy.hosts`: allow every one."""

JSON_TYPES = frozenset({"application/json", "application/x-ndjson", "application/jsonl"})
"""Content types a state-changing body may declare (besides ``application/*+json``)."""

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True, slots=True)
class RequestHead:
    """What the access rules read of a request: method, path, headers and where it came.

    Attributes:
        method: ``GET`` for a WebSocket upgrade.
        path: the path, without the query.
        headers: ``(name, value)`` pairs in order, names lower-case.
        client: the peer's address ("" when unknown, e.g. in process).
        loopback: the connection arrived at a loopback address of this server.
        websocket: the request is a WebSocket upgrade.
    """

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    client: str = ""
    loopback: bool = False
    websocket: bool = False

    @classmethod
    def of(
        cls,
        method: str,
        path: str,
        pairs: Iterable[tuple[str | bytes, str | bytes]],
        *,
        client: str = "",
        local: str | None = None,
        websocket: bool = False,
    ) -> RequestHead:
        """Build a head from header pairs as any server gives them (bytes are latin-1).

        ``local`` is the server address the connection arrived at (None: unknown).
        """
        headers = tuple((_text(name).lower(), _text(value)) for name, value in pairs)
        return cls(method.upper(), path, headers, client, is_loopback(local), websocket)

    def values(self, name: str) -> list[str]:
        """Every value of header ``name`` (lower-case), in order."""
        return [value for key, value in self.headers if key == name]

    def value(self, name: str) -> str | None:
        """The first value of header ``name``, or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def state_changing(self) -> bool:
        """The method may change state (any but GET, HEAD, OPTIONS)."""
        return self.method not in SAFE_METHODS


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def is_loopback(address: str | None) -> bool:
    """Whether ``address`` (an IP, possibly IPv4-mapped IPv6) is a loopback address."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request refused: the HTTP status, the error, and headers to send with it."""

    status: int
    error: CorralError
    headers: tuple[tuple[str, str], ...] = ()

    def wire(self) -> dict[str, Any]:
        """The body of a refused WebSocket upgrade: the protocol's error message, with
        what it echoes bounded (:meth:`~corral.protocol.messages.ErrorReply.of`)."""
        return ErrorReply.of(self.error).to_wire()

    @property
    def close_code(self) -> int:
        """The close code of a face that can only refuse an upgrade by closing it."""
        if self.status in (429, 503):
            return CloseCode.TRY_AGAIN_LATER
        if self.status == 400:
            return CloseCode.PROTOCOL_ERROR
        return CloseCode.POLICY_VIOLATION


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """What a server allows (see the module docstring).

    Attributes:
        token: the bearer token every request needs (None: no authentication).
        cookies: also accept the web UI's cookie (from the server's own origin).
        origins: origins allowed besides the server's own, as ``scheme://host[:port]``
            (lower-case, no default port); ``"*"`` allows any.
        hosts: host names allowed besides IP addresses and loopback names (lower-case);
            ``"*"`` allows any.
    """

    token: str | None = field(default=None, repr=False)
    cookies: bool = False
    origins: frozenset[str] = frozenset()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        token: str | None = None,
        *,
        cookies: bool = False,
        origins: Iterable[str] = (),
        hosts: Iterable[str] = (),
    ) -> AccessPolicy:
        """A policy from settings as a user writes them.

        Raises:
            ValueError: an origin that is not ``scheme://host[:port]``, or an empty host.
        """
        return cls(
            token,
            cookies,
            frozenset(normal_origin(o) for o in origins),
            frozenset(normal_host(h) for h in hosts),
        )


def normal_origin(origin: str) -> str:
    """``origin`` as :attr:`AccessPolicy.origins` holds it (``*`` as it is).

    Raises:
        ValueError: not ``scheme://host[:port]`` with nothing after.
    """
    origin = origin.strip()
    if origin == ANY:
        return ANY
    parsed = _origin(origin)
    if parsed is None:
        raise ValueError(f"{origin!r} is not an origin; write it as scheme://host[:port]")
    scheme, host, port = parsed
    return (
        f"{scheme}://{host}" if port == _DEFAULT_PORTS.get(scheme) else f"{scheme}://{host}:{port}"
    )


def normal_host(host: str) -> str:
    """``host`` as :attr:`AccessPolicy.hosts` holds it.

    Raises:
        ValueError: empty, or with a port or a path.
    """
    value = host.strip().lower().rstrip(".")
    if value == ANY:
        return ANY
    if not value or any(c in value for c in "/:@ "):
        raise ValueError(f"{host!r} is not a host name (write it without scheme or port)")
    return value


def _origin(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of a serialized origin, or None when malformed."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if not scheme or not host or parts.path not in ("", "/") or parts.query or parts.username:
        return None
    if port is None:
        port = _DEFAULT_PORTS.get(scheme, 0)
    return scheme, host, port


def _host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header, or None when malformed."""
    try:
        parts = urlsplit("//" + value.strip())
        port = parts.port
    except ValueError:
        return None
    name = (parts.hostname or "").rstrip(".")
    if not name or parts.path or parts.username is not None:
        return None
    return name, port


def _unpointable(name: str) -> bool:
    """An IP address or a loopback name: no DNS answer an attacker controls can make it."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _forbidden(reason: str, message: str, fix: str, **details: Any) -> Refusal:
    return Refusal(403, Forbidden(message, details={"reason": reason, "fix": fix, **details}))


def check_host(head: RequestHead, policy: AccessPolicy) -> Refusal | None:
    """The DNS-rebinding rule (rule 1 of the module docstring)."""
    hosts = head.values("host")
    if len(hosts) > 1:
        return _forbidden("host", "more than one Host header", "send exactly one Host header")
    if not hosts or ANY in policy.hosts or not (head.loopback or policy.hosts):
        return None
    parsed = _host(hosts[0])
    if parsed is not None and (_unpointable(parsed[0]) or parsed[0] in policy.hosts):
        return None
    shown = clip(hosts[0], 128)
    return _forbidden(
        "host",
        f"this server does not answer to host {shown!r}",
        "reach it by IP address or localhost, or allow the name "
        "(ServerConfig.allowed_hosts, corral serve --allow-host)",
        host=shown,
    )


def check_origin(head: RequestHead, policy: AccessPolicy) -> Refusal | None:
    """The browser-origin rule (rule 2 of the module docstring), for every request."""
    if not (head.websocket or head.state_changing):
        return None
    origins = head.values("origin")
    if not origins:
        return None
    if len(origins) > 1:
        return _forbidden("origin", "more than one Origin header", "send at most one Origin")
    if ANY in policy.origins or same_origin(origins[0], head.value("host")):
        return None
    try:
        if normal_origin(origins[0]) in policy.origins:
            return None
    except ValueError:
        pass  # malformed (or "null", a sandboxed page's): never allowed
    shown = clip(origins[0], 128)
    return _forbidden(
        "origin",
        f"requests from pages of {shown!r} are not allowed",
        "open the page from this server, or allow its origin "
        "(ServerConfig.allowed_origins, corral serve --allow-origin)",
        origin=shown,
    )


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether ``origin`` names the very host and port of the ``Host`` header ``host``."""
    if origin is None or host is None:
        return False
    parsed, named = _origin(origin), _host(host)
    if parsed is None or named is None:
        return False
    scheme, name, port = parsed
    return name == named[0].lower() and port == (named[1] or _DEFAULT_PORTS.get(scheme, 0))


def check_credentials(head: RequestHead, policy: AccessPolicy) -> Refusal | None:
    """The credentials rule (rule 3 of the module docstring)."""
    token = policy.token
    if token is None:
        return None
    given = head.values("authorization")
    if len(given) > 1:
        return _unauthorized("more than one Authorization header; send exactly one")
    if bearer_matches(given[0] if given else None, token):
        return None
    origin = head.value("origin")
    if (
        policy.cookies
        and (origin is None or same_origin(origin, head.value("host")))
        and cookie_matches(_cookie(head.values("cookie"), COOKIE_NAME), token)
    ):
        return None
    return _unauthorized("wrong bearer token" if given else "this server requires a bearer token")


def _unauthorized(message: str) -> Refusal:
    error = Unauthorized(
        message,
        details={
            "fix": "send 'Authorization: Bearer <token>' (corral clients: token= or $CORRAL_TOKEN)"
        },
    )
    return Refusal(401, error, (("WWW-Authenticate", 'Bearer realm="corral"'),))


def _cookie(headers: list[str], name: str) -> str | None:
    for header in headers:
        for part in header.split(";"):
            key, _, value = part.strip().partition("=")
            if key == name:
                return value
    return None


def check_access(
    head: RequestHead, policy: AccessPolicy, *, public: bool = False
) -> Refusal | None:
    """Rules 1 to 3 of the module docstring, in order; ``public`` paths need no credentials."""
    refusal = check_host(head, policy) or check_origin(head, policy)
    if refusal is not None or public:
        return refusal
    return check_credentials(head, policy)


def check_content_type(head: RequestHead) -> Refusal | None:
    """A state-changing request with a body must declare JSON (see the module docstring)."""
    if not head.state_changing:
        return None
    length = head.value("content-length")
    if head.value("transfer-encoding") is None and (length is None or length.strip() == "0"):
        return None
    kinds = head.values("content-type")
    media = kinds[0].split(";", 1)[0].strip().lower() if len(kinds) == 1 else ""
    if media in JSON_TYPES or (media.startswith("application/") and media.endswith("+json")):
        return None
    shown = "none" if not kinds else clip(", ".join(kinds), 128)
    error = BadFrame(
        f"a request body must be JSON, declared 'Content-Type: application/json' (got {shown})",
        details={"content_type": shown, "fix": "send Content-Type: application/json"},
    )
    return Refusal(415, error)


__all__ = [
    "ANY",
    "JSON_TYPES",
    "SAFE_METHODS",
    "AccessPolicy",
    "Refusal",
    "RequestHead",
    "check_access",
    "check_content_type",
    "check_credentials",
    "check_host",
    "check_origin",
    "is_loopback",
    "normal_host",
    "normal_origin",
    "same_origin",
]

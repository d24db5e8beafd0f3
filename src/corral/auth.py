"""Bearer tokens shared by the server (which requires one) and the client (which sends it),
and the fleet key servers sign what clients carry between them with.

A server started with a token refuses every HTTP route and the WebSocket handshake
unless the request carries ``Authorization: Bearer <token>``. Both sides find the token
the same way: an explicit argument first, then the ``CORRAL_TOKEN`` environment
variable, then the file named by ``CORRAL_TOKEN_FILE``. A browser, which cannot set headers
on a WebSocket, exchanges the token once for a short-lived signed cookie (see
:func:`issue_cookie`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

TOKEN_ENV = "CORRAL_TOKEN"
"""Environment variable holding the bearer token itself."""

TOKEN_FILE_ENV = "CORRAL_TOKEN_FILE"
"""Environment variable naming a file that holds the bearer token."""

_MIN_LENGTH = 8


def check_token(token: str, source: str) -> str:
    """Return ``token`` stripped of surrounding whitespace, or raise if it is unusable.

    Raises:
        ValueError: the token is empty, too short, or contains whitespace or control
            characters (it must fit in an HTTP header); ``source`` names where it came from.
    """
    value = token.strip()
    if len(value) < _MIN_LENGTH:
        raise ValueError(
            f"the bearer token from {source} is {len(value)} characters long; use at least "
            f"{_MIN_LENGTH} (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if any(ch.isspace() or not ch.isprintable() or not ch.isascii() for ch in value):
        raise ValueError(
            f"the bearer token from {source} contains whitespace, control or non-ASCII "
            "characters; it must be a single printable ASCII word"
        )
    return value


def read_token_file(path: str | Path) -> str:
    """Read a bearer token from ``path`` (surrounding whitespace and newlines ignored).

    Raises:
        ValueError: the file cannot be read or holds no usable token.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {str(path)!r}: {exc}") from None
    return check_token(text, f"file {str(path)!r}")


def resolve_token(token: str | None = None) -> str | None:
    """The token to use: ``token`` if given, else ``$CORRAL_TOKEN``, else ``$CORRAL_TOKEN_FILE``.

    Returns None when none of them is set (no authentication).

    Raises:
        ValueError: the token found is unusable (see :func:`check_token`).
    """
    if token is not None:
        return check_token(token, "the token argument")
    env_token = os.environ.get(TOKEN_ENV)
    if env_token:
        return check_token(env_token, f"${TOKEN_ENV}")
    env_file = os.environ.get(TOKEN_FILE_ENV)
    if env_file:
        return read_token_file(env_file)
    return None


def bearer_header(token: str) -> dict[str, str]:
    """The HTTP header carrying ``token``."""
    return {"Authorization": f"Bearer {token}"}


def bearer_matches(header: str | None, token: str) -> bool:
    """True when an ``Authorization`` header value carries exactly ``token``.

    The comparison takes the same time whatever the header holds, so the token cannot be
    guessed one character at a time.
    """
    if header is None:
        return False
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return secrets.compare_digest(value.strip().encode(), token.encode())


# -- browser sessions ---------------------------------------------------------------
# Browsers cannot put a header on a WebSocket handshake. The web UI therefore sends the
# bearer token once (``POST /auth``) and gets a short-lived cookie in exchange; every
# route and the WebSocket then accept either. The cookie is signed with a key derived
# from the token, so replicas sharing a token accept each other's cookies, and changing
# the token voids every cookie issued with the old one.

COOKIE_NAME = "corral_auth"
"""The name of the HttpOnly cookie a browser holds after exchanging the token."""

COOKIE_TTL_S = 3600
"""How long an exchanged cookie is valid, in seconds."""

_COOKIE_VERSION = "v1"


def _cookie_key(token: str) -> bytes:
    return hashlib.sha256(b"corral-auth-cookie\0" + token.encode()).digest()


def _cookie_mac(token: str, payload: str) -> str:
    return hmac.new(_cookie_key(token), payload.encode(), hashlib.sha256).hexdigest()


def issue_cookie(token: str, *, now: float | None = None, ttl: float = COOKIE_TTL_S) -> str:
    """A cookie value standing for ``token`` until ``now + ttl``."""
    expires = int((time.time() if now is None else now) + ttl)
    payload = f"{_COOKIE_VERSION}.{expires}.{secrets.token_hex(8)}"
    return f"{payload}.{_cookie_mac(token, payload)}"


def cookie_matches(value: str | None, token: str, *, now: float | None = None) -> bool:
    """True when ``value`` is an unexpired cookie issued for ``token``.

    Like :func:`bearer_matches`, the signature is compared in constant time.
    """
    if not value:
        return False
    payload, _, mac = value.rpartition(".")
    version, _, rest = payload.partition(".")
    expires, _, nonce = rest.partition(".")
    if version != _COOKIE_VERSION or not expires.isdigit() or not nonce:
        return False
    if int(expires) < (time.time() if now is None else now):
        return False
    return secrets.compare_digest(mac.encode(), _cookie_mac(token, payload).encode())


# -- the fleet key ----------------------------------------------------------------
# One secret shared by every server of a fleet: it signs what a client carries from
# one server to another (session snapshots; the fleet's session ids), so that no client
# can forge or alter it. Each use signs with its own key derived from it
# (:func:`fleet_subkey`), so a value signed for one purpose never verifies for another.

FLEET_KEY_ENV = "CORRAL_FLEET_KEY"
"""Environment variable holding the fleet key itself."""

FLEET_KEY_MIN_BYTES = 32
"""The shortest fleet key accepted (an HMAC-SHA256 key as long as its hash)."""


def check_fleet_key(key: bytes, source: str) -> bytes:
    """Return ``key`` stripped of surrounding whitespace, or raise if it is too short.

    Raises:
        ValueError: fewer than :data:`FLEET_KEY_MIN_BYTES` bytes; ``source`` names where
            it came from, and the message says how to make one.
    """
    value = key.strip()
    if len(value) < FLEET_KEY_MIN_BYTES:
        raise ValueError(
            f"the fleet key from {source} is {len(value)} bytes long; use at least "
            f"{FLEET_KEY_MIN_BYTES}, the same on every server of the fleet (e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return value


def read_fleet_key_file(path: str | Path) -> bytes:
    """Read the fleet key from ``path`` (surrounding whitespace and newlines ignored).

    Raises:
        ValueError: the file cannot be read or holds too short a key.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the fleet key file {str(path)!r}: {exc}") from None
    return check_fleet_key(raw, f"file {str(path)!r}")


def resolve_fleet_key(key: bytes | None = None) -> bytes | None:
    """The fleet key to use: ``key`` if given, else ``$CORRAL_FLEET_KEY``; None when
    neither is set.

    Raises:
        ValueError: the key found is too short (see :func:`check_fleet_key`).
    """
    if key is not None:
        return check_fleet_key(key, "the fleet_key argument")
    env_key = os.environ.get(FLEET_KEY_ENV)
    if env_key:
        return check_fleet_key(env_key.encode(), f"${FLEET_KEY_ENV}")
    return None


def fleet_subkey(key: bytes, purpose: str) -> bytes:
    """The key signing values of ``purpose`` (``"snapshot"``...), derived from the fleet
    key."""
    return hmac.new(key, b"corral-fleet\0" + purpose.encode(), hashlib.sha256).digest()

"""The WebSocket upgrade decision: one function every transport renders.

:func:`admit_upgrade` takes a request head (:class:`~corral.protocol.access.RequestHead`:
path, headers, the client's address, whether it arrived on loopback) and the server's
state (:class:`UpgradePolicy`: access rules, the connection gate, the session registry,
deflate), and whether the face has another protocol for clients without a corral
subprotocol, and returns :class:`Accept` — the codec, the agreed compression, the
response headers — or a :class:`~corral.protocol.access.Refusal` with its HTTP status,
error and headers. The
native picows door, the ASGI ``/ws`` route and the in-process transport of
:mod:`corral.testing` only render the answer (as websockets' ``ServerProtocol.accept()``
/ ``reject()`` are rendered by its asyncio, sync and trio servers).

The checks, in order:

1. access (:func:`~corral.protocol.access.check_access`): Host, Origin, credentials —
   403 ``FORBIDDEN`` or 401 ``UNAUTHORIZED``;
2. the subprotocol: a corral one picks the codec; none goes to the fallback protocol
   (OpenEnv's envelope) when the server has one, else 400 ``UNSUPPORTED_PROTOCOL``;
3. the per-address connection gate: 429 ``TOO_MANY_CONNECTIONS`` and ``Retry-After``;
4. room for sessions (corral clients only; the fallback reports a full server its own
   way): a client whose ``corral-resume`` header names a live session is let in whatever
   the load (its sessions hold their slots); any other gets 503 and ``Retry-After`` —
   ``NOT_READY`` while the server cannot serve new sessions (draining, hung calls at their
   bound), ``CAPACITY_REACHED`` when full.

An :class:`Accept` holds one count of its address in the gate: the face calls
``gate.leave(accept.address)`` when the connection ends (a refusal holds none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.errors import NotReady, UnsupportedProtocol
from corral.protocol.access import AccessPolicy, Refusal, RequestHead, check_access
from corral.protocol.codecs import SUBPROTOCOLS, Codec, codec_for_subprotocols
from corral.protocol.deflate import DeflateParams, negotiate
from corral.protocol.handshake import RESUME_HEADER
from corral.protocol.registry import SessionRegistry
from corral.protocol.server import ConnectionGate

RETRY_AFTER = (("Retry-After", "1"),)
"""The header of a refusal the client should retry shortly (429, 503)."""


@dataclass(frozen=True, slots=True)
class Accept:
    """An upgrade let in.

    Attributes:
        codec: the corral codec its subprotocol picked; None when it offered none and
            the server's fallback protocol (OpenEnv's envelope) serves it.
        deflate: the permessage-deflate parameters agreed (None: no compression).
        address: the client's address, counted once in the gate until the face leaves.
    """

    codec: Codec | None
    deflate: DeflateParams | None
    address: str

    def headers(self) -> dict[str, str]:
        """The 101 answer's negotiated headers (subprotocol, extension)."""
        out: dict[str, str] = {}
        if self.codec is not None:
            out["Sec-WebSocket-Protocol"] = self.codec.subprotocol
        if self.deflate is not None:
            out["Sec-WebSocket-Extensions"] = self.deflate.response()
        return out


@dataclass(slots=True)
class UpgradePolicy:
    """The server state an upgrade is decided against (see the module docstring).

    Attributes:
        access: Host, Origin and credential rules.
        gate: open connections by client address.
        registry: the server's sessions (capacity, what is live, why none can open now).
        deflate: accept permessage-deflate when a corral client offers it.
    """

    access: AccessPolicy
    gate: ConnectionGate
    registry: SessionRegistry[Any]
    deflate: bool = False


def offered_subprotocols(head: RequestHead) -> list[str]:
    """The subprotocols a client offers, in its order of preference."""
    offered: list[str] = []
    for value in head.values("sec-websocket-protocol"):
        offered.extend(part.strip() for part in value.split(",") if part.strip())
    return offered


def admit_upgrade(
    head: RequestHead, policy: UpgradePolicy, *, fallback: bool = False
) -> Accept | Refusal:
    """Accept or refuse the WebSocket upgrade ``head`` (see the module docstring).

    ``fallback``: the face serves clients that offer no corral subprotocol with another
    protocol (the ASGI route's OpenEnv envelope).
    """
    refusal = check_access(head, policy.access)
    if refusal is not None:
        return refusal
    codec = codec_for_subprotocols(offered_subprotocols(head))
    if codec is None and not fallback:
        error = UnsupportedProtocol(
            f"ask for subprotocol {' or '.join(SUBPROTOCOLS)}",
            details={"subprotocols": list(SUBPROTOCOLS)},
        )
        return Refusal(400, error)
    refused = policy.gate.enter(head.client)
    if refused is not None:
        return Refusal(429, refused, RETRY_AFTER)
    if codec is not None:
        refusal = _room(head, policy.registry)
        if refusal is not None:
            policy.gate.leave(head.client)
            return refusal
    deflate = None
    if codec is not None and policy.deflate:
        deflate = negotiate(head.values("sec-websocket-extensions"))
    return Accept(codec, deflate, head.client)


def _room(head: RequestHead, registry: SessionRegistry[Any]) -> Refusal | None:
    """Room for the sessions a corral client comes to open, or the 503 saying why not."""
    resume = head.value(RESUME_HEADER)
    if not registry.accepts(resume):
        return Refusal(503, registry.capacity_error(), RETRY_AFTER)
    if resume:
        return None  # a reconnecting client: its sessions hold their slots already
    reason = registry.unavailable()
    if reason is not None:
        error = NotReady(
            f"the server cannot serve new sessions now: {reason}", details={"reason": reason}
        )
        return Refusal(503, error, RETRY_AFTER)
    return None


__all__ = [
    "RETRY_AFTER",
    "Accept",
    "UpgradePolicy",
    "admit_upgrade",
    "offered_subprotocols",
]

"""The messages of ``corral/1`` and their validation, as plain data.

Every message is a map with a ``type`` and, for requests and their replies, an ``id``.
Requests name the session they address (``session``), so one connection carries many
sessions. A reply echoes the request's ``id``; replies may come out of order.

Client → server: ``hello``, ``open``, ``attach``, ``reset``, ``step``, ``state``, ``close``.
Server → client: ``welcome``, ``opened``, ``attached``, ``result``, ``state``, ``closed``,
``error``.

:func:`parse_request` turns a decoded frame into a typed request or raises a
:class:`~corral.errors.ProtocolError` with a stable code; it is strict about types and
never lets a malformed value through to the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.errors import BadMessage, InvalidArgument, UnknownType

MAX_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ContractRef:
    """A side's view of the contract: version and fingerprint."""

    version: str
    fingerprint: str | None = None


@dataclass(frozen=True, slots=True)
class Hello:
    """Opens the connection: protocol version, the client's contract, wanted extras."""

    id: int
    protocol: str
    client: str = ""
    contract: ContractRef | None = None
    want_schemas: bool = False
    type: str = "hello"


@dataclass(frozen=True, slots=True)
class Open:
    """Creates a session (a fresh environment instance)."""

    id: int
    type: str = "open"


@dataclass(frozen=True, slots=True)
class Attach:
    """Re-attaches this connection to a live session after a reconnect."""

    id: int
    session: str
    token: str
    type: str = "attach"


@dataclass(frozen=True, slots=True)
class Reset:
    """Starts a new episode of a session."""

    id: int
    session: str
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    type: str = "reset"


@dataclass(frozen=True, slots=True)
class Step:
    """Applies one action (a wire object, validated by the server's Action model)."""

    id: int
    session: str
    action: Any
    type: str = "step"


@dataclass(frozen=True, slots=True)
class GetState:
    """Asks for the session's current state."""

    id: int
    session: str
    type: str = "state"


@dataclass(frozen=True, slots=True)
class Close:
    """Ends a session and frees its slot."""

    id: int
    session: str
    type: str = "close"


Request = Hello | Open | Attach | Reset | Step | GetState | Close
SessionRequest = Reset | Step | GetState | Close


def _field(msg: dict[str, Any], name: str, types: type | tuple[type, ...], required: bool) -> Any:
    if name not in msg or msg[name] is None:
        if required:
            raise BadMessage(
                f"message {msg.get('type')!r} is missing field {name!r}", details={"field": name}
            )
        return None
    value = msg[name]
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _tuple(types))
    if not ok:
        expected = " or ".join(t.__name__ for t in _tuple(types))
        raise BadMessage(
            f"field {name!r} of {msg.get('type')!r} must be {expected}, got {type(value).__name__}",
            details={"field": name, "expected": expected},
        )
    return value


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _request_id(msg: dict[str, Any]) -> int:
    rid: int = _field(msg, "id", int, True)
    if not 0 <= rid <= MAX_ID:
        raise BadMessage("field 'id' must be between 0 and 2**63-1", details={"field": "id"})
    return rid


def _session(msg: dict[str, Any]) -> str:
    sid: str = _field(msg, "session", str, True)
    return sid


def peek_id(msg: Any) -> int | None:
    """The request id of a decoded message if it has a valid one, else None."""
    if isinstance(msg, dict):
        rid = msg.get("id")
        if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid <= MAX_ID:
            return rid
    return None


def peek_session(msg: Any) -> str | None:
    """The session id of a decoded message if it has one, else None."""
    if isinstance(msg, dict):
        sid = msg.get("session")
        if isinstance(sid, str):
            return sid
    return None


def _parse_hello(msg: dict[str, Any]) -> Hello:
    contract = _field(msg, "contract", dict, False)
    ref = None
    if contract is not None:
        ref = ContractRef(
            version=_field(contract, "version", str, True),
            fingerprint=_field(contract, "fingerprint", str, False),
        )
    return Hello(
        id=_request_id(msg),
        protocol=_field(msg, "protocol", str, True),
        client=_field(msg, "client", str, False) or "",
        contract=ref,
        want_schemas=bool(_field(msg, "schemas", bool, False)),
    )


def _parse_reset(msg: dict[str, Any]) -> Reset:
    seed = _field(msg, "seed", int, False)
    if seed is not None and not 0 <= seed <= MAX_ID:
        raise InvalidArgument(
            f"seed must be between 0 and 2**63-1, got {seed}", details={"field": "seed"}
        )
    return Reset(
        id=_request_id(msg),
        session=_session(msg),
        seed=seed,
        options=_field(msg, "options", dict, False) or {},
    )


def _parse_step(msg: dict[str, Any]) -> Step:
    if "action" not in msg:
        raise BadMessage("message 'step' is missing field 'action'", details={"field": "action"})
    return Step(id=_request_id(msg), session=_session(msg), action=msg["action"])


_PARSERS: dict[str, Any] = {
    "hello": _parse_hello,
    "open": lambda m: Open(id=_request_id(m)),
    "attach": lambda m: Attach(
        id=_request_id(m), session=_session(m), token=_field(m, "token", str, True)
    ),
    "reset": _parse_reset,
    "step": _parse_step,
    "state": lambda m: GetState(id=_request_id(m), session=_session(m)),
    "close": lambda m: Close(id=_request_id(m), session=_session(m)),
}

REQUEST_TYPES = frozenset(_PARSERS)


def register_request(type_name: str, parser: Any) -> None:
    """Add a request type (used by protocol extensions such as batching)."""
    _PARSERS[type_name] = parser


def parse_request(msg: dict[str, Any]) -> Request:
    """Validate a decoded message and return the typed request.

    Raises:
        BadMessage: a field is missing or has the wrong type.
        UnknownType: ``type`` is not a known request.
    """
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise BadMessage("message has no string field 'type'", details={"field": "type"})
    parser = _PARSERS.get(kind)
    if parser is None:
        raise UnknownType(
            f"unknown message type {kind!r}", details={"known": sorted(_PARSERS), "type": kind}
        )
    request: Request = parser(msg)
    return request


# Replies, built by the server; plain dicts so that codecs encode them directly.


def welcome(
    request_id: int,
    *,
    server: dict[str, Any],
    env: dict[str, Any],
    limits: dict[str, Any],
    compat: str,
    schemas: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The reply to ``hello``."""
    reply: dict[str, Any] = {
        "type": "welcome",
        "id": request_id,
        "protocol": "corral/1",
        "server": server,
        "env": env,
        "limits": limits,
        "compat": compat,
    }
    if schemas is not None:
        reply["schemas"] = schemas
    return reply


def opened(request_id: int, session: str, token: str, *, kind: str = "opened") -> dict[str, Any]:
    """The reply to ``open`` (or, with ``kind="attached"``, to ``attach``)."""
    return {"type": kind, "id": request_id, "session": session, "token": token}


def result(request_id: int, session: str, observation: Any) -> dict[str, Any]:
    """The reply to ``reset`` and ``step``: the observation's wire object."""
    return {"type": "result", "id": request_id, "session": session, "observation": observation}


def state_reply(request_id: int, session: str, state: Any) -> dict[str, Any]:
    """The reply to ``state``."""
    return {"type": "state", "id": request_id, "session": session, "state": state}


def closed(request_id: int, session: str) -> dict[str, Any]:
    """The reply to ``close``."""
    return {"type": "closed", "id": request_id, "session": session}


def error(
    request_id: int | None,
    code: str,
    message: str,
    *,
    details: dict[str, Any] | None = None,
    session: str | None = None,
) -> dict[str, Any]:
    """An error reply; ``request_id`` is None when the request's id was unreadable."""
    reply: dict[str, Any] = {
        "type": "error",
        "id": request_id,
        "code": code,
        "message": message,
        "details": details or {},
    }
    if session is not None:
        reply["session"] = session
    return reply

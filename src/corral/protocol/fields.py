"""Strict readers of message fields, shared by every ``corral/1`` message parser.

A decoded frame is untrusted data: these readers check presence and exact type (a
``bool`` is not an ``int``), and raise :class:`~corral.errors.BadMessage` naming the
field, so that no malformed value ever reaches an environment.
"""

from __future__ import annotations

from typing import Any

from corral.errors import BadMessage, InvalidArgument

MAX_ID = 2**63 - 1
"""Largest request id (and seed): ids fit a signed 64-bit integer on every peer."""


def _names(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _check(msg: dict[str, Any], name: str, value: Any, types: type | tuple[type, ...]) -> None:
    allowed = _names(types)
    if isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed):
        return
    expected = " or ".join(t.__name__ for t in allowed)
    raise BadMessage(
        f"field {name!r} of {msg.get('type')!r} must be {expected}, got {type(value).__name__}",
        details={"field": name, "expected": expected},
    )


def required(msg: dict[str, Any], name: str, types: type | tuple[type, ...]) -> Any:
    """``msg[name]``, which must be present, not null, and of ``types``."""
    value = msg.get(name)
    if type(value) is types:  # the common case, and the cheapest check (a bool is no int)
        return value
    if value is None:
        raise BadMessage(
            f"message {msg.get('type')!r} is missing field {name!r}", details={"field": name}
        )
    _check(msg, name, value, types)
    return value


def optional(msg: dict[str, Any], name: str, types: type | tuple[type, ...]) -> Any:
    """``msg[name]`` if present and not null (then of ``types``), else None."""
    value = msg.get(name)
    if value is not None:
        _check(msg, name, value, types)
    return value


def present(msg: dict[str, Any], name: str) -> Any:
    """``msg[name]`` of any type (null included), which must be present."""
    if name not in msg:
        raise BadMessage(
            f"message {msg.get('type')!r} is missing field {name!r}", details={"field": name}
        )
    return msg[name]


def request_id(msg: dict[str, Any]) -> int:
    """The message's ``id``: an integer between 0 and :data:`MAX_ID`."""
    rid: int = required(msg, "id", int)
    if not 0 <= rid <= MAX_ID:
        raise BadMessage("field 'id' must be between 0 and 2**63-1", details={"field": "id"})
    return rid


def reply_id(msg: dict[str, Any]) -> int | None:
    """An error reply's ``id``: a request id, or null when the request's was unreadable."""
    if msg.get("id") is None:
        return None
    return request_id(msg)


def seed(msg: dict[str, Any], *, item: int | None = None, name: str = "seed") -> int | None:
    """A reset's seed (field ``name``): null, or an integer between 0 and :data:`MAX_ID`.

    Raises:
        BadMessage: not an integer; InvalidArgument: out of range. With ``item`` (a
            batch item's index) the error names the item.
    """
    value = msg.get(name)
    if value is None:
        return None
    where = "" if item is None else f"item {item}: "
    extra = {} if item is None else {"item": item}
    if not isinstance(value, int) or isinstance(value, bool):
        if item is None:
            _check(msg, name, value, int)  # raises, in the words of a single message
        raise BadMessage(
            f"{where}field {name!r} must be an integer or null, got {type(value).__name__}",
            details={**extra, "field": name},
        )
    if not 0 <= value <= MAX_ID:
        raise InvalidArgument(
            f"{where}{name} must be between 0 and 2**63-1, got {value}",
            details={**extra, "field": name},
        )
    return value


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


ECHO_CHARS = 256
"""Characters of a string (an id, a name, a value) an error reply echoes."""
MESSAGE_CHARS = 2048
"""Characters of an error reply's message."""
ECHO_ITEMS = 64
"""Items of a list or map inside an error's details."""
_ECHO_DEPTH = 8


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text``, cut to ``limit`` characters with a note of how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…(+{len(text) - limit} chars)"


def echo(value: Any, depth: int = 0) -> Any:
    """``value`` bounded for an error reply: strings and bytes clipped, lists and maps cut
    to :data:`ECHO_ITEMS` entries, nesting to a few levels.

    The one bound on what an error echoes of its request (an id, a session, a
    validation input), so that an error reply is never larger than a few KiB whatever
    was sent: a 1 MiB session id comes back as its first :data:`ECHO_CHARS` characters.
    """
    if isinstance(value, str):
        return clip(value)
    if isinstance(value, bytes | bytearray):
        return value if len(value) <= ECHO_CHARS else bytes(value[:ECHO_CHARS])
    if depth >= _ECHO_DEPTH and isinstance(value, dict | list | tuple):
        return clip(repr(value))
    if isinstance(value, dict):
        out = {
            clip(str(k)) if not isinstance(k, str) else clip(k): echo(v, depth + 1)
            for k, v in list(value.items())[:ECHO_ITEMS]
        }
        if len(value) > ECHO_ITEMS:
            out["…"] = f"{len(value) - ECHO_ITEMS} more entries"
        return out
    if isinstance(value, list | tuple):
        items = [echo(v, depth + 1) for v in value[:ECHO_ITEMS]]
        if len(value) > ECHO_ITEMS:
            items.append(f"…{len(value) - ECHO_ITEMS} more items")
        return items
    return value

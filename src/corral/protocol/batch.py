"""Batched requests: many sessions' resets or steps in one message, one reply.

    → {"type": "step_batch", "id": 7, "items": [{"session": "a", "action": {...}}, ...]}
    → {"type": "reset_batch", "id": 8, "items": [{"session": "a", "seed": 1, "options": {}}]}
    ← {"type": "batch", "id": 7, "results": [{"session": "a", "observation": {...}},
                                            {"session": "b", "error": {code, message, details}}]}

``results`` has one entry per item, in item order. An item that fails (a malformed item,
an unknown session, an invalid action, an exception in the environment) is an error for
that session only; the other items run normally. Only a message-level problem (no
``items`` list, an empty or oversized batch, a bad id) fails the whole message.

A batch message addresses sessions of the connection that sends it; one session may
appear once per batch (a repeat is ``SESSION_BUSY`` for that item).

These types are entries of the one message table, :mod:`corral.protocol.messages`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from corral.errors import BadMessage, BatchTooLarge, CorralError, error_from_wire
from corral.protocol import fields as f


@dataclass(slots=True)
class ResetItem:
    """One session's reset inside a ``reset_batch``."""

    session: str
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """The item's wire map."""
        return {"session": self.session, "seed": self.seed, "options": self.options}


@dataclass(slots=True)
class StepItem:
    """One session's action (a wire object) inside a ``step_batch``."""

    session: str
    action: Any

    def to_wire(self) -> dict[str, Any]:
        """The item's wire map."""
        return {"session": self.session, "action": self.action}


@dataclass(slots=True)
class BadItem:
    """An item that could not be read; it is answered with ``error``, nothing runs.

    Only parsing makes one: it has no wire form of its own.
    """

    session: str | None
    error: CorralError


def _batch_id(msg: dict[str, Any]) -> int:
    rid = f.peek_id(msg)
    if rid is None:
        raise BadMessage(
            f"message {msg.get('type')!r} needs an integer 'id' between 0 and 2**63-1",
            details={"field": "id"},
        )
    return rid


def _items(msg: dict[str, Any]) -> list[Any]:
    items = msg.get("items")
    if not isinstance(items, list):
        raise BadMessage(
            f"message {msg.get('type')!r} needs a list field 'items' of "
            "{'session': ..., ...} maps",
            details={"field": "items", "expected": "array"},
        )
    if not items:
        raise BadMessage(
            f"message {msg.get('type')!r} has no items; send at least one",
            details={"field": "items"},
        )
    return items


def _item_session(index: int, raw: Any) -> str:
    if not isinstance(raw, dict):
        raise BadMessage(
            f"item {index} must be a map with a 'session', got {type(raw).__name__}",
            details={"item": index, "expected": "object"},
        )
    session = raw.get("session")
    if not isinstance(session, str):
        raise BadMessage(
            f"item {index} needs a string field 'session'",
            details={"item": index, "field": "session"},
        )
    return session


def _reset_item(index: int, raw: Any) -> ResetItem | BadItem:
    try:
        session = _item_session(index, raw)
    except CorralError as exc:
        return BadItem(None, exc)
    try:
        seed = f.seed(raw, item=index)
    except CorralError as exc:
        return BadItem(session, exc)
    options = raw.get("options")
    if options is None:
        options = {}
    elif not isinstance(options, dict):
        error = BadMessage(
            f"item {index}: field 'options' must be a map, got {type(options).__name__}",
            details={"item": index, "field": "options"},
        )
        return BadItem(session, error)
    return ResetItem(session, seed, options)


def _step_item(index: int, raw: Any) -> StepItem | BadItem:
    try:
        session = _item_session(index, raw)
    except CorralError as exc:
        return BadItem(None, exc)
    if "action" not in raw:
        error = BadMessage(
            f"item {index} is missing field 'action'",
            details={"item": index, "field": "action"},
        )
        return BadItem(session, error)
    return StepItem(session, raw["action"])


def _items_to_wire(items: tuple[ResetItem | StepItem | BadItem, ...]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        if isinstance(item, BadItem):
            raise ValueError("a BadItem comes from parsing and has no wire form")
        out.append(item.to_wire())
    return out


@dataclass(slots=True)
class ResetBatch:
    """Resets many sessions at once; bad items are read as :class:`BadItem`."""

    type: ClassVar[str] = "reset_batch"
    id: int
    items: tuple[ResetItem | BadItem, ...]

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {"type": self.type, "id": self.id, "items": _items_to_wire(self.items)}

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> ResetBatch:
        """Read a ``reset_batch`` message; bad items become :class:`BadItem`.

        Raises:
            BadMessage: the id or the ``items`` list is missing, mistyped or empty.
        """
        rid = _batch_id(msg)
        return cls(rid, tuple(_reset_item(i, raw) for i, raw in enumerate(_items(msg))))


@dataclass(slots=True)
class StepBatch:
    """Steps many sessions at once; bad items are read as :class:`BadItem`."""

    type: ClassVar[str] = "step_batch"
    id: int
    items: tuple[StepItem | BadItem, ...]

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {"type": self.type, "id": self.id, "items": _items_to_wire(self.items)}

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> StepBatch:
        """Read a ``step_batch`` message; bad items become :class:`BadItem`.

        Raises:
            BadMessage: the id or the ``items`` list is missing, mistyped or empty.
        """
        rid = _batch_id(msg)
        return cls(rid, tuple(_step_item(i, raw) for i, raw in enumerate(_items(msg))))


BatchRequest = ResetBatch | StepBatch


def check_batch_size(batch: BatchRequest, limit: int) -> None:
    """Raise ``BatchTooLarge`` when ``batch`` carries more than ``limit`` items."""
    if len(batch.items) > limit:
        raise BatchTooLarge(
            f"{batch.type} carries {len(batch.items)} items; this server accepts at most "
            f"{limit} per message (split the batch)",
            details={"items": len(batch.items), "limit": limit},
            request_id=batch.id,
        )


@dataclass(slots=True)
class ItemResult:
    """A successful item of a ``batch`` reply: the observation's wire object."""

    session: str
    observation: Any

    def to_wire(self) -> dict[str, Any]:
        """The item's wire map."""
        return {"session": self.session, "observation": self.observation}


@dataclass(slots=True)
class ItemError:
    """A failed item of a ``batch`` reply (``session`` is None when it was unreadable)."""

    session: str | None
    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, session: str | None, error: CorralError) -> ItemError:
        """The failed item for ``error``."""
        return cls(session, str(error.code), error.message, error.details)

    def exception(self, request_id: int | None = None) -> CorralError:
        """The exception this item carries, as its code's class."""
        wire = {"code": self.code, "message": self.message, "details": self.details}
        return error_from_wire(wire, request_id)

    def to_wire(self) -> dict[str, Any]:
        """The item's wire map."""
        error = {"code": self.code, "message": self.message, "details": self.details}
        return {"session": self.session, "error": error}


BatchItemReply = ItemResult | ItemError


def _reply_item(index: int, raw: Any) -> BatchItemReply:
    if not isinstance(raw, dict):
        raise BadMessage(
            f"batch result {index} must be a map, got {type(raw).__name__}",
            details={"item": index, "expected": "object"},
        )
    session = raw.get("session")
    error = raw.get("error")
    if error is not None:
        if not isinstance(error, dict) or (session is not None and not isinstance(session, str)):
            raise BadMessage(
                f"batch result {index} has a malformed 'error'", details={"item": index}
            )
        code = f.required(error, "code", str)
        details = f.optional(error, "details", dict) or {}
        message = f.optional(error, "message", str) or code
        return ItemError(session, code, message, details)
    if not isinstance(session, str) or "observation" not in raw:
        raise BadMessage(
            f"batch result {index} needs a string 'session' and an 'observation' or 'error'",
            details={"item": index},
        )
    return ItemResult(session, raw["observation"])


@dataclass(slots=True)
class BatchReply:
    """The reply to a batch message: one result or error per item, in item order."""

    type: ClassVar[str] = "batch"
    id: int
    results: list[BatchItemReply]

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return {"type": self.type, "id": self.id, "results": [r.to_wire() for r in self.results]}

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> BatchReply:
        """Read a ``batch`` reply.

        Raises:
            BadMessage: the id is bad, or ``results`` is not a list of result maps.
        """
        rid = f.request_id(msg)
        results = msg.get("results")
        if not isinstance(results, list):
            raise BadMessage(
                "a 'batch' reply needs a list field 'results'", details={"field": "results"}
            )
        return cls(rid, [_reply_item(i, raw) for i, raw in enumerate(results)])

    def expect(self, items: int) -> list[BatchItemReply]:
        """The results, checked to answer ``items`` items.

        Raises:
            BadMessage: the reply holds another number of results.
        """
        if len(self.results) != items:
            raise BadMessage(
                f"batch reply holds {len(self.results)} results for {items} items",
                details={"results": len(self.results), "items": items},
            )
        return self.results

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.errors import BadMessage, BatchTooLarge, CorralError, InvalidArgument
from corral.protocol.messages import MAX_ID, register_request

RESET_BATCH = "reset_batch"
STEP_BATCH = "step_batch"
BATCH_REPLY = "batch"


@dataclass(frozen=True, slots=True)
class ResetItem:
    """One session's reset inside a ``reset_batch``."""

    session: str
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepItem:
    """One session's action (a wire object) inside a ``step_batch``."""

    session: str
    action: Any


@dataclass(frozen=True, slots=True)
class BadItem:
    """An item that could not be read; it is answered with ``error``, nothing runs."""

    session: str | None
    error: CorralError


Item = ResetItem | StepItem | BadItem


@dataclass(frozen=True, slots=True)
class ResetBatch:
    """Resets many sessions at once."""

    id: int
    items: tuple[ResetItem | BadItem, ...]
    type: str = RESET_BATCH


@dataclass(frozen=True, slots=True)
class StepBatch:
    """Steps many sessions at once."""

    id: int
    items: tuple[StepItem | BadItem, ...]
    type: str = STEP_BATCH


BatchRequest = ResetBatch | StepBatch


def _batch_id(msg: dict[str, Any]) -> int:
    rid = msg.get("id")
    if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid <= MAX_ID:
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
    seed = raw.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        error: CorralError = BadMessage(
            f"item {index}: field 'seed' must be an integer or null, got {type(seed).__name__}",
            details={"item": index, "field": "seed"},
        )
        return BadItem(session, error)
    if seed is not None and not 0 <= seed <= MAX_ID:
        error = InvalidArgument(
            f"item {index}: seed must be between 0 and 2**63-1, got {seed}",
            details={"item": index, "field": "seed"},
        )
        return BadItem(session, error)
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


def parse_reset_batch(msg: dict[str, Any]) -> ResetBatch:
    """Read a ``reset_batch`` message; bad items become :class:`BadItem`.

    Raises:
        BadMessage: the id or the ``items`` list is missing, mistyped or empty.
    """
    rid = _batch_id(msg)
    return ResetBatch(rid, tuple(_reset_item(i, raw) for i, raw in enumerate(_items(msg))))


def parse_step_batch(msg: dict[str, Any]) -> StepBatch:
    """Read a ``step_batch`` message; bad items become :class:`BadItem`.

    Raises:
        BadMessage: the id or the ``items`` list is missing, mistyped or empty.
    """
    rid = _batch_id(msg)
    return StepBatch(rid, tuple(_step_item(i, raw) for i, raw in enumerate(_items(msg))))


def check_batch_size(batch: BatchRequest, limit: int) -> None:
    """Raise ``BatchTooLarge`` when ``batch`` carries more than ``limit`` items."""
    if len(batch.items) > limit:
        raise BatchTooLarge(
            f"{batch.type} carries {len(batch.items)} items; this server accepts at most "
            f"{limit} per message (split the batch)",
            details={"items": len(batch.items), "limit": limit},
            request_id=batch.id,
        )


# Replies and client-side builders.


def item_result(session: str, observation: Any) -> dict[str, Any]:
    """A successful item of a ``batch`` reply."""
    return {"session": session, "observation": observation}


def item_error(session: str | None, error: CorralError) -> dict[str, Any]:
    """A failed item of a ``batch`` reply."""
    return {"session": session, "error": error.to_wire()}


def batch_reply(request_id: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The reply to a batch message: one result or error per item, in item order."""
    return {"type": BATCH_REPLY, "id": request_id, "results": results}


def step_batch(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """A ``step_batch`` message (without its id) for ``(session, wire action)`` pairs."""
    return {"type": STEP_BATCH, "items": [{"session": s, "action": a} for s, a in items]}


def reset_batch(items: list[tuple[str, int | None, dict[str, Any]]]) -> dict[str, Any]:
    """A ``reset_batch`` message (without its id) for ``(session, seed, options)`` items."""
    return {
        "type": RESET_BATCH,
        "items": [{"session": s, "seed": seed, "options": opts} for s, seed, opts in items],
    }


def read_batch_reply(reply: dict[str, Any], expected: int) -> list[dict[str, Any]]:
    """The per-item results of a ``batch`` reply, checked to hold ``expected`` entries.

    Raises:
        BadMessage: the reply is not a batch reply of the right length.
    """
    results = reply.get("results")
    if reply.get("type") != BATCH_REPLY or not isinstance(results, list):
        raise BadMessage(f"expected a 'batch' reply, got {reply.get('type')!r}")
    if len(results) != expected or not all(isinstance(r, dict) for r in results):
        raise BadMessage(
            f"batch reply holds {len(results)} results for {expected} items",
            details={"results": len(results), "items": expected},
        )
    return results


register_request(RESET_BATCH, parse_reset_batch)
register_request(STEP_BATCH, parse_step_batch)

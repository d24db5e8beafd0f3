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

**Columnar replies.** A request with ``"columns": true`` asks for the reply as a struct
of arrays: the item sessions in one list, each observation field in one list over the
successful items (in item order), and the failed items by index. A server that does not
know the flag ignores it and answers in rows, so a client reads either form; a server
answers in rows anyway when the observations do not share one set of fields::

    ← {"type": "batch", "id": 7, "sessions": ["a", "b", "c"],
       "columns": {"message": ["x", "z"], "reward": [1.0, 0.5], "done": [false, true], ...},
       "errors": [[1, {code, message, details}]]}

The keys are sent once per batch instead of once per item: fewer bytes, and no map per
item to build on either side. An observation without a field the others have (a server
leaves an empty ``reward_components`` out) is listed under ``"absent": {field: [positions]}``
(its slot in the column holds None); in memory such a value is :data:`ABSENT`. corral's
client asks for the columnar form on the binary codec (the row form stays for JSON,
where readability is the point).

**Same-step resets.** A ``step_batch`` with ``"autoreset": true`` asks the server to
reset, at once, every item whose step ends its episode (``done``, truncated or not),
with no options, as Gymnasium's and SB3's same-step autoreset does; with the item's
``reset_seed`` (an integer, 0 to 2**63-1) as the seed when it has one, else with no seed.
A client that seeds each next episode in advance (corral's pool does) keeps every episode
replayable. The seed is used only with the flag; a malformed one is an error for its
item either way (``BAD_MESSAGE``, or ``INVALID_ARGUMENT`` out of range). A server that
does not know the field resets with no seed (a verified replay of that episode then
fails, and the client ends it truncated, as for any unseeded episode). Such an
item's result stays the ended step's observation (its reward, flags and metadata); the
new episode's first observation (or the reset's error) goes in a sparse map beside the
results, by item index, in either reply form::

    → {"type": "step_batch", "id": 7, "autoreset": true,
       "items": [{"session": "a", "action": {...}, "reset_seed": 1234}, ...]}
    ← {"type": "batch", "id": 7, "results": [...],             (or the columnar keys)
       "resets": [[1, {"message": "", "done": false, ...}]],
       "reset_errors": [[4, {code, message, details}]]}

Both keys are left out when empty. A reset error means the step ran and ended its
episode but the new one did not start (the environment raised, the call overran the
step timeout, the session closed): the session stays ended and needs a ``reset``. A
server that does not know the flag ignores it, and a client that finds an ended item
without an entry in either map resets it itself (a second round trip), so old servers
still work. The reset belongs to the item: a re-sent batch replays it from the reply
cache, never running it twice.

These types are entries of the one message table, :mod:`corral.protocol.messages`.
The module is ~700 lines because it is one message family: the two requests, the reply
in both of its forms (rows and columns, each with its same-step resets) and the checks
each wire shape needs.
"""

from __future__ import annotations

from collections.abc import Container
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
    reset_seed: int | None = None
    """The seed of the same-step reset this step may call for (``autoreset``; see the
    module docstring); None: an unseeded reset, as without the field."""

    def to_wire(self) -> dict[str, Any]:
        """The item's wire map (``reset_seed`` only when there is one)."""
        if self.reset_seed is None:
            return {"session": self.session, "action": self.action}
        return {"session": self.session, "action": self.action, "reset_seed": self.reset_seed}


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
    if type(raw) is dict:  # the well-formed item, read with no further calls
        session = raw.get("session")
        if type(session) is str and "action" in raw:
            seed = raw.get("reset_seed")
            if seed is None:
                return StepItem(session, raw["action"])
            if type(seed) is int and 0 <= seed <= f.MAX_ID:
                return StepItem(session, raw["action"], seed)
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
    try:
        seed = f.seed(raw, item=index, name="reset_seed")
    except CorralError as exc:
        return BadItem(session, exc)
    return StepItem(session, raw["action"], seed)


def _batch_wire(
    kind: str,
    rid: int,
    items: tuple[ResetItem | StepItem | BadItem, ...],
    columns: bool,
    autoreset: bool = False,
    acked: bool = False,
) -> dict[str, Any]:
    out = []
    for item in items:
        if isinstance(item, BadItem):
            raise ValueError("a BadItem comes from parsing and has no wire form")
        out.append(item.to_wire())
    wire: dict[str, Any] = {"type": kind, "id": rid, "items": out}
    if columns:
        wire["columns"] = True
    if autoreset:
        wire["autoreset"] = True
    if acked:
        wire["acked"] = True
    return wire


@dataclass(slots=True)
class ResetBatch:
    """Resets many sessions at once; bad items are read as :class:`BadItem`."""

    type: ClassVar[str] = "reset_batch"
    id: int
    items: tuple[ResetItem | BadItem, ...]
    columns: bool = False
    """Ask for a columnar reply (see the module docstring)."""
    acked: bool = False
    """The client holds every earlier reply of each item's session (see
    :mod:`corral.protocol.messages`); set by the client protocol when it sends."""

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return _batch_wire(self.type, self.id, self.items, self.columns, acked=self.acked)

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> ResetBatch:
        """Read a ``reset_batch`` message; bad items become :class:`BadItem`.

        Raises:
            BadMessage: the id or the ``items`` list is missing, mistyped or empty.
        """
        rid = _batch_id(msg)
        items = tuple(_reset_item(i, raw) for i, raw in enumerate(_items(msg)))
        return cls(rid, items, msg.get("columns") is True, msg.get("acked") is True)


@dataclass(slots=True)
class StepBatch:
    """Steps many sessions at once; bad items are read as :class:`BadItem`."""

    type: ClassVar[str] = "step_batch"
    id: int
    items: tuple[StepItem | BadItem, ...]
    columns: bool = False
    """Ask for a columnar reply (see the module docstring)."""
    autoreset: bool = False
    """Ask for the same-step reset of every item whose step ends its episode (see the
    module docstring)."""
    acked: bool = False
    """As :attr:`ResetBatch.acked`."""

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map."""
        return _batch_wire(self.type, self.id, self.items, self.columns, self.autoreset, self.acked)

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> StepBatch:
        """Read a ``step_batch`` message; bad items become :class:`BadItem`.

        Raises:
            BadMessage: the id or the ``items`` list is missing, mistyped or empty.
        """
        rid = _batch_id(msg)
        items = tuple(_step_item(i, raw) for i, raw in enumerate(_items(msg)))
        columns, autoreset = msg.get("columns") is True, msg.get("autoreset") is True
        return cls(rid, items, columns, autoreset, msg.get("acked") is True)


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
    reset: BatchItemReply | None = None
    """The same-step reset of an item whose step ended its episode (``autoreset``): the
    new episode's first observation, or the reset's error; sent beside the results (see
    the module docstring), never inside the item's own map."""

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
        """The failed item for ``error``, what it echoes bounded (see ``fields.echo``)."""
        return cls(
            None if session is None else f.clip(session),
            str(error.code),
            f.clip(error.message, f.MESSAGE_CHARS),
            f.echo(error.details),
        )

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


def _resets_of(results: list[BatchItemReply]) -> dict[int, BatchItemReply]:
    """The same-step resets the items of ``results`` carry, by item index."""
    return {
        index: item.reset
        for index, item in enumerate(results)
        if type(item) is ItemResult and item.reset is not None
    }


def _resets_wire(resets: dict[int, BatchItemReply]) -> dict[str, Any]:
    """The ``resets`` / ``reset_errors`` keys of a reply (none of them when empty)."""
    wire: dict[str, Any] = {}
    ok = [[i, r.observation] for i, r in resets.items() if isinstance(r, ItemResult)]
    failed = [[i, r.to_wire()["error"]] for i, r in resets.items() if isinstance(r, ItemError)]
    if ok:
        wire["resets"] = ok
    if failed:
        wire["reset_errors"] = failed
    return wire


def _read_resets(
    msg: dict[str, Any], sessions: list[Any], failed: Container[int]
) -> dict[int, BatchItemReply]:
    """The same-step resets of a reply whose items have ``sessions`` (``failed``: the
    indices of its failed items), by item index.

    Raises:
        BadMessage: ``resets`` or ``reset_errors`` is not a list of ``[item index, value]``
            pairs, or names an item that does not exist, failed, or is named twice.
    """
    resets: dict[int, BatchItemReply] = {}
    for key in ("resets", "reset_errors"):
        entries = msg.get(key)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise BadMessage(f"{key!r} must be a list", details={"field": key})
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int):
                raise BadMessage(
                    f"each entry of {key!r} must be [item index, value]", details={"field": key}
                )
            index, value = entry
            if not 0 <= index < len(sessions) or index in failed or index in resets:
                raise BadMessage(
                    f"{key!r} names item {index} of {len(sessions)}, which is not a "
                    "successful item (or names it twice)",
                    details={"field": key, "item": index},
                )
            session = sessions[index]
            if key == "resets":
                resets[index] = ItemResult(session, value)
            else:
                resets[index] = _reply_item(index, {"session": session, "error": value})
    return resets


class _Absent:
    """The value of a field an observation does not have (see :data:`ABSENT`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
"""In a :class:`BatchColumns` column: this observation has no such field (the server
leaves some out when empty, e.g. ``reward_components``). Never sent: the wire form lists
the positions under ``absent``."""


@dataclass(slots=True)
class BatchColumns:
    """A batch reply as a struct of arrays (see the module docstring).

    Attributes:
        sessions: every item's session, in item order (None: an unreadable item).
        fields: each observation field's values over the successful items, in order;
            :data:`ABSENT` where an observation does not have the field.
        errors: the failed items, by item index.
        sparse: some value is :data:`ABSENT`.
        resets: the same-step resets of items whose step ended their episode, by item
            index (see the module docstring).
    """

    sessions: list[str | None]
    fields: dict[str, list[Any]]
    errors: dict[int, ItemError] = field(default_factory=dict)
    sparse: bool = False
    resets: dict[int, BatchItemReply] = field(default_factory=dict)

    @property
    def ok(self) -> int:
        """How many items succeeded (the length of every field list)."""
        return len(self.sessions) - len(self.errors)

    @classmethod
    def of(cls, results: list[BatchItemReply]) -> BatchColumns | None:
        """The columns of ``results``; None when an observation is not a map (only the
        row form carries that)."""
        sessions: list[str | None] = []
        errors: dict[int, ItemError] = {}
        resets: dict[int, BatchItemReply] = {}
        observations: list[dict[str, Any]] = []
        keys: Any = None
        sparse = False
        for index, item in enumerate(results):
            sessions.append(item.session)
            if type(item) is ItemError:
                errors[index] = item
                continue
            obs = item.observation  # type: ignore[union-attr]
            if type(obs) is not dict:
                return None
            if item.reset is not None:  # type: ignore[union-attr]
                resets[index] = item.reset  # type: ignore[union-attr]
            if keys is None:
                keys = obs.keys()
            elif not sparse and obs.keys() != keys:
                sparse = True
            observations.append(obs)
        if not sparse:
            names = list(keys) if keys is not None else []
            fields = {name: [obs[name] for obs in observations] for name in names}
            return cls(sessions, fields, errors, resets=resets)
        union: dict[str, None] = {}
        for obs in observations:
            union.update(dict.fromkeys(obs))
        fields = {name: [obs.get(name, ABSENT) for obs in observations] for name in union}
        return cls(sessions, fields, errors, sparse=True, resets=resets)

    def rows(self) -> list[BatchItemReply]:
        """The same results in row form."""
        names = list(self.fields)
        values = iter(zip(*self.fields.values(), strict=True)) if names else None
        rows: list[BatchItemReply] = []
        for index, session in enumerate(self.sessions):
            error = self.errors.get(index)
            if error is not None:
                rows.append(error)
                continue
            assert session is not None
            row: dict[str, Any] = {}
            if values is not None:
                row = {n: v for n, v in zip(names, next(values), strict=True) if v is not ABSENT}
            rows.append(ItemResult(session, row, self.resets.get(index)))
        return rows

    def to_wire(self) -> dict[str, Any]:
        """The columnar part of a ``batch`` reply's wire map."""
        wire: dict[str, Any] = {
            "sessions": self.sessions,
            "columns": self.fields,
            "errors": [[i, e.to_wire()["error"]] for i, e in self.errors.items()],
        }
        if self.sparse:
            absent: dict[str, list[int]] = {}
            columns: dict[str, list[Any]] = {}
            for name, values in self.fields.items():
                where = [k for k, v in enumerate(values) if v is ABSENT]
                if where:
                    absent[name] = where
                    values = [None if v is ABSENT else v for v in values]
                columns[name] = values
            wire["columns"], wire["absent"] = columns, absent
        if self.resets:
            wire.update(_resets_wire(self.resets))
        return wire

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> BatchColumns:
        """Read the columnar part of a ``batch`` reply.

        Raises:
            BadMessage: a list or map is missing or mistyped, a column has the wrong
                length, or an error (an absent value, a reset) names an item that does
                not exist (or twice).
        """
        sessions = msg.get("sessions")
        columns = msg.get("columns")
        raw_errors = msg.get("errors", [])
        if not isinstance(sessions, list) or not isinstance(columns, dict):
            raise BadMessage(
                "a columnar 'batch' reply needs a list 'sessions' and a map 'columns'",
                details={"field": "columns"},
            )
        if not isinstance(raw_errors, list):
            raise BadMessage("'errors' must be a list", details={"field": "errors"})
        errors: dict[int, ItemError] = {}
        for entry in raw_errors:
            if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int):
                raise BadMessage(
                    "each entry of 'errors' must be [item index, error]",
                    details={"field": "errors"},
                )
            index, error = entry
            if not 0 <= index < len(sessions) or index in errors:
                raise BadMessage(
                    f"'errors' names item {index} of {len(sessions)} (or twice)",
                    details={"field": "errors", "item": index},
                )
            item = _reply_item(index, {"session": sessions[index], "error": error})
            assert isinstance(item, ItemError)
            errors[index] = item
        ok = len(sessions) - len(errors)
        for name, values in columns.items():
            if not isinstance(name, str) or not isinstance(values, list) or len(values) != ok:
                raise BadMessage(
                    f"column {name!r} must be a list of {ok} values",
                    details={"field": "columns", "column": str(name)},
                )
        for index, session in enumerate(sessions):
            if index not in errors and not isinstance(session, str):
                raise BadMessage(
                    f"batch result {index} needs a string session", details={"item": index}
                )
        resets = _read_resets(msg, sessions, errors)
        absent = msg.get("absent")
        if absent is None:
            return cls(sessions, columns, errors, resets=resets)
        _mark_absent(absent, columns, ok)
        return cls(sessions, columns, errors, sparse=True, resets=resets)


def _mark_absent(absent: Any, columns: dict[str, list[Any]], ok: int) -> None:
    """Put :data:`ABSENT` where the wire's ``absent`` map says (checking it)."""
    if not isinstance(absent, dict):
        raise BadMessage(
            "'absent' must be a map of column → positions", details={"field": "absent"}
        )
    for name, where in absent.items():
        values = columns.get(name)
        if values is None or not isinstance(where, list):
            raise BadMessage(
                f"'absent' names column {name!r}, which the reply does not have",
                details={"field": "absent", "column": str(name)},
            )
        for position in where:
            if type(position) is not int or not 0 <= position < ok or values[position] is ABSENT:
                raise BadMessage(
                    f"'absent' names position {position!r} of column {name!r} "
                    f"({ok} values), or twice",
                    details={"field": "absent", "column": name},
                )
            values[position] = ABSENT


class BatchReply:
    """The reply to a batch message: one result or error per item, in item order.

    Built from rows (``results``) or read from a columnar reply (``columns``); either
    form is available from the other on demand. ``columnar`` chooses the wire form.
    """

    __slots__ = ("_columns", "_results", "columnar", "id")
    type: ClassVar[str] = "batch"

    def __init__(
        self,
        id: int,
        results: list[BatchItemReply] | None = None,
        *,
        columns: BatchColumns | None = None,
        columnar: bool = False,
    ) -> None:
        if (results is None) == (columns is None):
            raise ValueError("a BatchReply holds results or columns (one of them)")
        self.id = id
        self._results = results
        self._columns = columns
        self.columnar = columnar or columns is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BatchReply):
            return NotImplemented
        return self.id == other.id and self.results == other.results

    def __repr__(self) -> str:
        return f"BatchReply(id={self.id!r}, items={len(self)}, columnar={self.columnar})"

    def __len__(self) -> int:
        if self._columns is not None:
            return len(self._columns.sessions)
        assert self._results is not None
        return len(self._results)

    @property
    def results(self) -> list[BatchItemReply]:
        """One result or error per item, in item order (built from columns once)."""
        if self._results is None:
            assert self._columns is not None
            self._results = self._columns.rows()
        return self._results

    @property
    def columns(self) -> BatchColumns | None:
        """The columnar form when the reply came as one (else None: read ``results``)."""
        return self._columns

    def to_wire(self) -> dict[str, Any]:
        """The message's wire map: columnar when asked and possible, else rows."""
        columns = self._columns
        if columns is None and self.columnar:
            assert self._results is not None
            columns = BatchColumns.of(self._results)
        if columns is not None:
            return {"type": self.type, "id": self.id, **columns.to_wire()}
        results = self.results
        wire: dict[str, Any] = {
            "type": self.type,
            "id": self.id,
            "results": [r.to_wire() for r in results],
        }
        resets = _resets_of(results)
        if resets:
            wire.update(_resets_wire(resets))
        return wire

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> BatchReply:
        """Read a ``batch`` reply, in rows or in columns.

        Raises:
            BadMessage: the id is bad, neither ``results`` (a list of result maps) nor
                a valid columnar form is there, or the same-step resets are malformed.
        """
        rid = f.request_id(msg)
        if "columns" in msg:
            return cls(rid, columns=BatchColumns.from_wire(msg))
        raw_results = msg.get("results")
        if not isinstance(raw_results, list):
            raise BadMessage(
                "a 'batch' reply needs a list field 'results'", details={"field": "results"}
            )
        results = [_reply_item(i, raw) for i, raw in enumerate(raw_results)]
        if "resets" in msg or "reset_errors" in msg:
            failed = {i for i, item in enumerate(results) if type(item) is ItemError}
            sessions = [item.session for item in results]
            for index, reset in _read_resets(msg, sessions, failed).items():
                results[index].reset = reset  # type: ignore[union-attr]
        return cls(rid, results)

    def expect(self, items: int) -> list[BatchItemReply]:
        """The results, checked to answer ``items`` items.

        Raises:
            BadMessage: the reply holds another number of results.
        """
        self.check(items)
        return self.results

    def check(self, items: int) -> None:
        """Raise ``BadMessage`` unless the reply answers ``items`` items."""
        if len(self) != items:
            raise BadMessage(
                f"batch reply holds {len(self)} results for {items} items",
                details={"results": len(self), "items": items},
            )

"""The compatibility diff between two contracts: every change, classified by direction.

Every difference between a locked and a current set of schemas is classified:

* **compatible**: clients built for the locked contract keep working with a server
  running the current models;
* **breaking**: some of them fail, and the message says where (the server rejects an
  action, or a client cannot decode an observation) and why.

Direction decides. An *action* travels client → server: the current server must accept
everything an old client may send, so the schema may only widen (new optional fields,
wider types, more enum values, looser constraints). An *observation* or *state* travels
server → client: an old client must be able to read everything the current server
sends, so the schema may only narrow. A field added to an observation is breaking where
the locked model forbids unknown keys (``Observation`` does), because a client validating
with the locked model rejects it; pass ``tolerant_readers=True`` when every client
ignores unknown keys, and such additions become compatible. Removing or renaming a field
is breaking in both directions.

The lock file these schemas come from is :mod:`corral.contract.lock`. This module is one
thing at ~600 lines: the schema walk that finds changes and the table that classifies
them share every type in it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from corral.contract.refs import RefError, SchemaReader
from corral.contract.schema import canonical_schema

MODELS = ("action", "observation", "state")
"""The three models of a contract, in the order diffs and locks list them."""

OPTIONAL_MODELS = ("reset_options", "snapshot")
"""Models a contract has when the environment defines them (after the three in diffs)."""


class Direction(StrEnum):
    """Which way a model's values travel."""

    CLIENT_TO_SERVER = "client->server"
    SERVER_TO_CLIENT = "server->client"


DIRECTIONS: dict[str, Direction] = {
    "action": Direction.CLIENT_TO_SERVER,
    "observation": Direction.SERVER_TO_CLIENT,
    "state": Direction.SERVER_TO_CLIENT,
    "reset_options": Direction.CLIENT_TO_SERVER,
    # A snapshot taken under the locked contract (by a server being drained, say) is
    # restored by a server running the current one: it must accept every old snapshot.
    "snapshot": Direction.CLIENT_TO_SERVER,
}

_SENT: dict[str, str] = {
    "snapshot": "snapshots taken under the locked contract",
    "reset_options": "reset options that old clients send",
}
"""What travels client→server, by model, where it is not an action (for messages)."""


class Severity(StrEnum):
    """Whether clients of the locked contract survive a change."""

    COMPATIBLE = "compatible"
    BREAKING = "breaking"


class ChangeKind(StrEnum):
    """What changed."""

    MODEL_ADDED = "model_added"
    MODEL_REMOVED = "model_removed"
    FIELD_ADDED = "field_added"
    REQUIRED_FIELD_ADDED = "required_field_added"
    FIELD_REMOVED = "field_removed"
    MADE_REQUIRED = "made_required"
    MADE_OPTIONAL = "made_optional"
    DEFAULT_CHANGED = "default_changed"
    TYPE_CHANGED = "type_changed"
    TYPE_NARROWED = "type_narrowed"
    TYPE_WIDENED = "type_widened"
    ENUM_VALUE_ADDED = "enum_value_added"
    ENUM_VALUE_REMOVED = "enum_value_removed"
    CONSTRAINT_TIGHTENED = "constraint_tightened"
    CONSTRAINT_LOOSENED = "constraint_loosened"
    EXTRA_KEYS_FORBIDDEN = "extra_keys_forbidden"
    EXTRA_KEYS_ALLOWED = "extra_keys_allowed"


class _Effect(Enum):
    """How a change moves the set of values a schema accepts."""

    WIDEN = "widen"
    NARROW = "narrow"
    CHANGE = "change"


_KIND_EFFECT = {
    ChangeKind.TYPE_CHANGED: _Effect.CHANGE,
    ChangeKind.TYPE_NARROWED: _Effect.NARROW,
    ChangeKind.TYPE_WIDENED: _Effect.WIDEN,
    ChangeKind.ENUM_VALUE_ADDED: _Effect.WIDEN,
    ChangeKind.ENUM_VALUE_REMOVED: _Effect.NARROW,
    ChangeKind.CONSTRAINT_TIGHTENED: _Effect.NARROW,
    ChangeKind.CONSTRAINT_LOOSENED: _Effect.WIDEN,
    ChangeKind.EXTRA_KEYS_FORBIDDEN: _Effect.NARROW,
    ChangeKind.EXTRA_KEYS_ALLOWED: _Effect.WIDEN,
}


@dataclass(frozen=True)
class Change:
    """One difference between the locked and the current contract.

    Attributes:
        path: where, e.g. ``action.guess`` or ``observation.board[].cell``.
        kind: what changed.
        severity: compatible or breaking for clients of the locked contract.
        direction: which way values at ``path`` travel.
        fails_at: for a breaking change, the side whose validation fails
            (``"server"``: it rejects old clients' actions; ``"client"``: old clients
            cannot decode what the server sends); ``None`` when compatible.
        message: one readable sentence with the old and new values.
    """

    path: str
    kind: ChangeKind
    severity: Severity
    direction: Direction
    fails_at: str | None
    message: str

    @property
    def breaking(self) -> bool:
        """True for a breaking change."""
        return self.severity is Severity.BREAKING


@dataclass(frozen=True)
class _Finding:
    path: str
    kind: ChangeKind
    message: str
    closed: bool = False  # the locked object holding the field forbids unknown keys


class _Root:
    """One side's schema, able to resolve its ``$ref`` pointers."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.reader = SchemaReader(schema)

    def resolve(self, node: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
        """Follow ``$ref`` chains; returns the target and the last ref name. A reference
        that does not resolve (or a cycle) leaves the node as it is: it is compared as
        the schema it says, and differs from anything else."""
        try:
            resolved = self.reader.resolve(node)
        except RefError:
            return node, None
        return resolved.node, resolved.name


_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


@dataclass
class _Branch:
    """One alternative of a (possibly union) schema, after resolving references."""

    key: str
    node: Mapping[str, Any]
    ref: str | None
    values: list[Any] | None = None


def _type_of_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _branches(root: _Root, node: Mapping[str, Any]) -> list[_Branch]:
    """Flatten ``anyOf``/``oneOf``/type lists/single ``allOf`` into alternatives.

    All enum and const alternatives merge into one ``enum`` branch, so that
    ``Literal["a"] | Literal["b"]`` and ``Literal["a", "b"]`` compare equal.
    """
    out: list[_Branch] = []
    enum_values: list[Any] = []
    enum_node: Mapping[str, Any] | None = None

    def walk(current: Mapping[str, Any]) -> None:
        nonlocal enum_node
        current, ref = root.resolve(current)
        alternatives = current.get("anyOf") or current.get("oneOf")
        if isinstance(alternatives, list):
            for alt in alternatives:
                if isinstance(alt, Mapping):
                    walk(alt)
            return
        all_of = current.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
            siblings = {k: v for k, v in current.items() if k != "allOf"}
            walk({**all_of[0], **siblings})
            return
        if "enum" in current or "const" in current:
            values = current["enum"] if "enum" in current else [current["const"]]
            for value in values:
                if value not in enum_values:
                    enum_values.append(value)
            enum_node = enum_node or current
            return
        kind = current.get("type")
        if isinstance(kind, list):
            for item in kind:
                walk({**current, "type": item})
            return
        if kind is None:
            out.append(_Branch("any", current, ref))
        elif kind == "object" and ("properties" in current or ref is not None):
            out.append(_Branch(f"model:{ref or current.get('title', '')}", current, ref))
        else:
            out.append(_Branch(str(kind), current, ref))

    walk(node)
    if enum_node is not None:
        out.append(_Branch("enum", enum_node, None, enum_values))
    return out


def _covers(wide: _Branch, narrow: _Branch) -> bool:
    """True when every value of ``narrow`` is a value of ``wide`` (ignoring constraints)."""
    if wide.key == "any":
        return True
    if wide.key == "number" and narrow.key == "integer":
        return True
    if narrow.key == "enum" and narrow.values is not None and wide.key in _TYPES:
        types = {_type_of_value(v) for v in narrow.values}
        if wide.key == "number":
            types = {"number" if t == "integer" else t for t in types}
        return types <= {wide.key}
    return False


def _describe_branch(branch: _Branch) -> str:
    if branch.key == "enum" and branch.values is not None:
        return "one of " + ", ".join(json.dumps(v) for v in branch.values)
    if branch.key.startswith("model:"):
        return f"object {branch.key[6:]}".rstrip()
    return branch.key


_UPPER = ("maxLength", "maximum", "exclusiveMaximum", "maxItems", "maxProperties")
_LOWER = ("minLength", "minimum", "exclusiveMinimum", "minItems", "minProperties")
_EXACT = ("pattern", "format", "multipleOf")


class _Differ:
    def __init__(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        self.old = _Root(old)
        self.new = _Root(new)
        self.findings: list[_Finding] = []
        self._active: set[tuple[str, str]] = set()

    def add(self, path: str, kind: ChangeKind, message: str, *, closed: bool = False) -> None:
        self.findings.append(_Finding(path, kind, message, closed))

    # ---- values

    def value(self, path: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        old_branches = _branches(self.old, old)
        new_branches = _branches(self.new, new)
        matched: list[tuple[_Branch, _Branch]] = []
        removed: list[_Branch] = []
        added = list(new_branches)
        for ob in old_branches:
            twin = next((nb for nb in added if nb.key == ob.key), None)
            if twin is not None:
                added.remove(twin)
                matched.append((ob, twin))
            else:
                removed.append(ob)
        # A nested model renamed (its class, not its fields) is the same on the wire.
        old_models = [b for b in removed if b.key.startswith("model:")]
        new_models = [b for b in added if b.key.startswith("model:")]
        if len(old_models) == 1 and len(new_models) == 1:
            matched.append((old_models[0], new_models[0]))
            removed.remove(old_models[0])
            added.remove(new_models[0])

        widened = [(r, a) for r in removed for a in added if _covers(a, r)]
        narrowed = [(r, a) for r in removed for a in added if _covers(r, a)]
        paired_old = {id(r) for r, _ in widened + narrowed}
        paired_new = {id(a) for _, a in widened + narrowed}
        kept_old = [ob for ob, _ in matched]
        kept_new = [nb for _, nb in matched]
        lost = [
            r
            for r in removed
            if id(r) not in paired_old and not any(_covers(nb, r) for nb in kept_new)
        ]
        gained = [
            a
            for a in added
            if id(a) not in paired_new and not any(_covers(ob, a) for ob in kept_old)
        ]
        if lost and gained:
            old_desc = " | ".join(_describe_branch(b) for b in old_branches)
            new_desc = " | ".join(_describe_branch(b) for b in new_branches)
            self.add(path, ChangeKind.TYPE_CHANGED, f"type changed from {old_desc} to {new_desc}")
        else:
            for b in lost:
                self.add(path, ChangeKind.TYPE_NARROWED, f"no longer accepts {_describe_branch(b)}")
            for b in gained:
                self.add(path, ChangeKind.TYPE_WIDENED, f"now also accepts {_describe_branch(b)}")
        for r, a in narrowed:
            self.add(
                path,
                ChangeKind.TYPE_NARROWED,
                f"narrowed from {_describe_branch(r)} to {_describe_branch(a)}",
            )
        for r, a in widened:
            self.add(
                path,
                ChangeKind.TYPE_WIDENED,
                f"widened from {_describe_branch(r)} to {_describe_branch(a)}",
            )
        for ob, nb in matched:
            self.branch(path, ob, nb)

    def branch(self, path: str, old: _Branch, new: _Branch) -> None:
        if old.key == "enum" and old.values is not None and new.values is not None:
            for v in old.values:
                if v not in new.values:
                    self.add(path, ChangeKind.ENUM_VALUE_REMOVED, f"value {json.dumps(v)} removed")
            for v in new.values:
                if v not in old.values:
                    self.add(path, ChangeKind.ENUM_VALUE_ADDED, f"value {json.dumps(v)} added")
            return
        self.constraints(path, old.node, new.node)
        if old.key == "array":
            self.array(path, old.node, new.node)
        elif old.key == "object" or old.key.startswith("model:"):
            pair = (old.ref or f"@{path}", new.ref or f"@{path}")
            if pair in self._active:
                return  # a recursive model: this pair is already being compared above
            self._active.add(pair)
            try:
                self.object(path, old.node, new.node)
            finally:
                self._active.discard(pair)

    def constraints(self, path: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        for key in _UPPER + _LOWER:
            before, after = old.get(key), new.get(key)
            if before == after or not _is_number(before, after):
                continue
            upper = key in _UPPER
            if before is None:
                tighter, text = True, f"{key} {after} added"
            elif after is None:
                tighter, text = False, f"{key} {before} removed"
            else:
                tighter = (after < before) if upper else (after > before)
                text = f"{key} changed from {before} to {after}"
            kind = ChangeKind.CONSTRAINT_TIGHTENED if tighter else ChangeKind.CONSTRAINT_LOOSENED
            self.add(path, kind, text)
        for key in _EXACT:
            before, after = old.get(key), new.get(key)
            if before == after:
                continue
            if before is None:
                self.add(path, ChangeKind.CONSTRAINT_TIGHTENED, f"{key} {after!r} added")
            elif after is None:
                self.add(path, ChangeKind.CONSTRAINT_LOOSENED, f"{key} {before!r} removed")
            elif key == "multipleOf" and _divides(before, after):
                self.add(path, ChangeKind.CONSTRAINT_TIGHTENED, f"{key} {before} → {after}")
            elif key == "multipleOf" and _divides(after, before):
                self.add(path, ChangeKind.CONSTRAINT_LOOSENED, f"{key} {before} → {after}")
            else:
                self.add(
                    path, ChangeKind.TYPE_CHANGED, f"{key} changed from {before!r} to {after!r}"
                )
        if old.get("uniqueItems") != new.get("uniqueItems"):
            kind = (
                ChangeKind.CONSTRAINT_TIGHTENED
                if new.get("uniqueItems")
                else ChangeKind.CONSTRAINT_LOOSENED
            )
            self.add(path, kind, f"uniqueItems is now {bool(new.get('uniqueItems'))}")

    def array(self, path: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        old_prefix = old.get("prefixItems") or []
        new_prefix = new.get("prefixItems") or []
        for i, (a, b) in enumerate(zip(old_prefix, new_prefix, strict=False)):
            self.value(f"{path}[{i}]", a, b)
        old_items, new_items = old.get("items"), new.get("items")
        if isinstance(old_items, Mapping) and isinstance(new_items, Mapping):
            self.value(f"{path}[]", old_items, new_items)
        elif isinstance(old_items, Mapping) != isinstance(new_items, Mapping):
            kind = ChangeKind.TYPE_NARROWED if new_items is not None else ChangeKind.TYPE_WIDENED
            self.add(path, kind, "item type " + ("added" if new_items is not None else "removed"))

    def object(self, path: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        old_props: Mapping[str, Any] = old.get("properties", {})
        new_props: Mapping[str, Any] = new.get("properties", {})
        old_req = set(old.get("required", []))
        new_req = set(new.get("required", []))
        closed = old.get("additionalProperties") is False
        removed = [n for n in old_props if n not in new_props]
        added = [n for n in new_props if n not in old_props]
        for name in removed:
            twins = [
                a
                for a in added
                if canonical_schema(_resolved(self.new, new_props[a]))
                == canonical_schema(_resolved(self.old, old_props[name]))
            ]
            hint = f" (renamed to {twins[0]!r}?)" if len(twins) == 1 else ""
            self.add(
                _join(path, name),
                ChangeKind.FIELD_REMOVED,
                f"field {name!r} removed{hint}",
                closed=closed,
            )
        for name in added:
            required = name in new_req
            self.add(
                _join(path, name),
                ChangeKind.REQUIRED_FIELD_ADDED if required else ChangeKind.FIELD_ADDED,
                f"{'required' if required else 'optional'} field {name!r} added",
                closed=closed,
            )
        for name in old_props:
            if name not in new_props:
                continue
            sub = _join(path, name)
            if name in old_req and name not in new_req:
                self.add(sub, ChangeKind.MADE_OPTIONAL, f"{name!r} is now optional")
            elif name in new_req and name not in old_req:
                self.add(sub, ChangeKind.MADE_REQUIRED, f"{name!r} is now required")
            o_node, n_node = old_props[name], new_props[name]
            if (
                name not in new_req
                and "default" in o_node
                and "default" in n_node
                and o_node["default"] != n_node["default"]
            ):
                self.add(
                    sub,
                    ChangeKind.DEFAULT_CHANGED,
                    f"default changed from {json.dumps(o_node['default'])} "
                    f"to {json.dumps(n_node['default'])}",
                )
            self.value(sub, o_node, n_node)
        self.extra(path, old.get("additionalProperties"), new.get("additionalProperties"))

    def extra(self, path: str, old: Any, new: Any) -> None:
        old_open = old is not False
        new_open = new is not False
        if old_open and not new_open:
            self.add(path, ChangeKind.EXTRA_KEYS_FORBIDDEN, "unknown keys are now rejected")
        elif new_open and not old_open:
            self.add(path, ChangeKind.EXTRA_KEYS_ALLOWED, "unknown keys are now accepted")
        elif isinstance(old, Mapping) and isinstance(new, Mapping):
            self.value(f"{path}{{}}", old, new)
        elif isinstance(old, Mapping) != isinstance(new, Mapping) and old_open and new_open:
            kind = ChangeKind.TYPE_NARROWED if isinstance(new, Mapping) else ChangeKind.TYPE_WIDENED
            self.add(f"{path}{{}}", kind, "value type of unknown keys changed")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _resolved(root: _Root, node: Mapping[str, Any]) -> dict[str, Any]:
    resolved, _ = root.resolve(node)
    return {k: v for k, v in resolved.items() if k != "default"}


def _is_number(*values: Any) -> bool:
    return all(
        v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in values
    )


def _divides(small: Any, big: Any) -> bool:
    if not _is_number(small, big) or not small:
        return False
    ratio = big / small
    return bool(math.isclose(ratio, round(ratio)) and round(ratio) > 1)


def _severity(
    kind: ChangeKind,
    direction: Direction,
    *,
    old_closed: bool,
    tolerant_readers: bool,
    model: str = "action",
) -> tuple[Severity, str | None, str]:
    """Severity, failing side and the consequence sentence of ``kind`` in ``direction``
    (for values of ``model``)."""
    to_server = direction is Direction.CLIENT_TO_SERVER
    rejects = (
        f"the server rejects {_SENT.get(model, 'actions that old clients send')}"
        if to_server
        else "old clients cannot decode what the server sends"
    )
    side = "server" if to_server else "client"
    if kind is ChangeKind.MODEL_REMOVED:
        return Severity.BREAKING, side, "old clients still use it"
    if kind is ChangeKind.FIELD_REMOVED:
        if not to_server:
            return Severity.BREAKING, "client", "old clients still expect it"
        if old_closed:
            return (
                Severity.BREAKING,
                "server",
                "old clients still send it and the server rejects it",
            )
        return Severity.BREAKING, "server", "old clients still send it and the server ignores it"
    if kind is ChangeKind.MODEL_ADDED:
        return Severity.COMPATIBLE, None, "old clients do not use it"
    if kind in (ChangeKind.FIELD_ADDED, ChangeKind.REQUIRED_FIELD_ADDED):
        if to_server:
            if kind is ChangeKind.REQUIRED_FIELD_ADDED:
                return Severity.BREAKING, "server", "old clients do not send it"
            return Severity.COMPATIBLE, None, "old clients omit it and get the default"
        if old_closed and not tolerant_readers:
            return (
                Severity.BREAKING,
                "client",
                "old clients' models forbid unknown keys and reject it",
            )
        why = "readers ignore keys they do not know" if old_closed else "unknown keys are allowed"
        return Severity.COMPATIBLE, None, why
    if kind is ChangeKind.MADE_REQUIRED:
        if to_server:
            return Severity.BREAKING, "server", "old clients may omit it"
        return Severity.COMPATIBLE, None, "the server always sends every field"
    if kind is ChangeKind.MADE_OPTIONAL:
        return Severity.COMPATIBLE, None, "values that were valid stay valid"
    if kind is ChangeKind.DEFAULT_CHANGED:
        who = "old clients that omit it get the new default" if to_server else "values unchanged"
        return Severity.COMPATIBLE, None, who
    effect = _KIND_EFFECT[kind]
    if effect is _Effect.CHANGE:
        return Severity.BREAKING, side, rejects
    if (effect is _Effect.NARROW) == to_server:
        return Severity.BREAKING, side, rejects
    safe = (
        "everything old clients send is still accepted"
        if to_server
        else "everything the server sends was already valid for old clients"
    )
    return Severity.COMPATIBLE, None, safe


def diff_schemas(
    old: Mapping[str, Mapping[str, Any]],
    new: Mapping[str, Mapping[str, Any]],
    *,
    tolerant_readers: bool = False,
) -> list[Change]:
    """Classify every difference between two sets of contract schemas.

    Args:
        old: the locked schemas, keyed ``action``/``observation``/``state`` and, when
            present, ``reset_options`` and ``snapshot`` (both client→server: the current
            server must restore every snapshot taken under the locked contract); other
            keys are compared as server→client models.
        new: the current schemas, same keys.
        tolerant_readers: clients ignore object keys they do not know. When False (the
            safe default: a client validating with the locked models rejects unknown keys
            wherever they forbid them), a field added to a server→client model whose
            locked schema forbids unknown keys is breaking.

    Returns:
        The changes, in a stable order (by model, then in schema order). An empty list
        means the schemas are equivalent (annotations such as titles and descriptions
        are ignored).
    """
    changes: list[Change] = []
    known = (*MODELS, *OPTIONAL_MODELS)
    names = [m for m in known if m in old or m in new]
    names += sorted(k for k in {*old, *new} if k not in known)
    for model in names:
        direction = DIRECTIONS.get(model, Direction.SERVER_TO_CLIENT)
        if model not in new:
            findings = [_Finding(model, ChangeKind.MODEL_REMOVED, f"model {model!r} removed")]
        elif model not in old:
            findings = [_Finding(model, ChangeKind.MODEL_ADDED, f"model {model!r} added")]
        else:
            differ = _Differ(old[model], new[model])
            differ.value(model, old[model], new[model])
            findings = differ.findings
        for f in findings:
            severity, side, why = _severity(
                f.kind,
                direction,
                old_closed=f.closed,
                tolerant_readers=tolerant_readers,
                model=model,
            )
            changes.append(
                Change(
                    path=f.path,
                    kind=f.kind,
                    severity=severity,
                    direction=direction,
                    fails_at=side,
                    message=f"{f.message}: {why}",
                )
            )
    return changes

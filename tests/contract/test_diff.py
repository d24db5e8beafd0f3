"""The compatibility diff: one table row per rule, then properties against pydantic itself."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from corral.contract import State
from corral.contract.diff import ChangeKind, Direction, Severity, diff_schemas

C, B = Severity.COMPATIBLE, Severity.BREAKING


def changes(old: type[BaseModel], new: type[BaseModel], model: str) -> list[tuple[str, str, str]]:
    """(path, kind, severity) of every change of ``old`` → ``new`` as ``model``."""
    result = diff_schemas({model: old.model_json_schema()}, {model: new.model_json_schema()})
    return [(c.path, c.kind.value, c.severity.value) for c in result]


def model(name: str, **fields: Any) -> type[BaseModel]:
    """A strict (unknown keys forbidden) model with ``fields``."""
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


class Color(Enum):
    RED = "red"
    GREEN = "green"


class Color3(Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Point(BaseModel):
    x: int
    y: int


class Point3(BaseModel):
    x: int
    y: int
    z: int = 0


class PointRenamedClass(BaseModel):
    x: int
    y: int


# Each row: old fields, new fields, expected (kind, action severity, observation severity).
RULES: list[tuple[str, dict[str, Any], dict[str, Any], str, Severity, Severity]] = [
    # An observation model forbidding unknown keys rejects a field it does not know.
    ("optional added", {}, {"f": (int, 0)}, "field_added", C, B),
    ("required added", {}, {"f": (int, ...)}, "required_field_added", B, B),
    ("removed", {"f": (int, 0)}, {}, "field_removed", B, B),
    ("optional->required", {"f": (int, 0)}, {"f": (int, ...)}, "made_required", B, C),
    ("required->optional", {"f": (int, ...)}, {"f": (int, 0)}, "made_optional", C, C),
    ("number->integer", {"f": (float, ...)}, {"f": (int, ...)}, "type_narrowed", B, C),
    ("integer->number", {"f": (int, ...)}, {"f": (float, ...)}, "type_widened", C, B),
    ("str->Literal", {"f": (str, ...)}, {"f": (Literal["a", "b"], ...)}, "type_narrowed", B, C),
    ("Literal->str", {"f": (Literal["a"], ...)}, {"f": (str, ...)}, "type_widened", C, B),
    ("str->int", {"f": (str, ...)}, {"f": (int, ...)}, "type_changed", B, B),
    ("union member removed", {"f": (int | str, ...)}, {"f": (int, ...)}, "type_narrowed", B, C),
    ("union member added", {"f": (int, ...)}, {"f": (int | str, ...)}, "type_widened", C, B),
    ("nullable removed", {"f": (int | None, ...)}, {"f": (int, ...)}, "type_narrowed", B, C),
    ("nullable added", {"f": (int, ...)}, {"f": (int | None, ...)}, "type_widened", C, B),
    (
        "literal value removed",
        {"f": (Literal["a", "b"], ...)},
        {"f": (Literal["a"], ...)},
        "enum_value_removed",
        B,
        C,
    ),
    (
        "literal value added",
        {"f": (Literal["a"], ...)},
        {"f": (Literal["a", "b"], ...)},
        "enum_value_added",
        C,
        B,
    ),
    ("enum member added", {"f": (Color, ...)}, {"f": (Color3, ...)}, "enum_value_added", C, B),
    ("enum member removed", {"f": (Color3, ...)}, {"f": (Color, ...)}, "enum_value_removed", B, C),
    (
        "maxLength smaller",
        {"f": (str, Field(max_length=10))},
        {"f": (str, Field(max_length=5))},
        "constraint_tightened",
        B,
        C,
    ),
    (
        "maxLength larger",
        {"f": (str, Field(max_length=5))},
        {"f": (str, Field(max_length=10))},
        "constraint_loosened",
        C,
        B,
    ),
    (
        "maxLength added",
        {"f": (str, ...)},
        {"f": (str, Field(max_length=5))},
        "constraint_tightened",
        B,
        C,
    ),
    (
        "minimum larger",
        {"f": (int, Field(ge=0))},
        {"f": (int, Field(ge=1))},
        "constraint_tightened",
        B,
        C,
    ),
    (
        "minimum removed",
        {"f": (int, Field(ge=0))},
        {"f": (int, ...)},
        "constraint_loosened",
        C,
        B,
    ),
    (
        "pattern added",
        {"f": (str, ...)},
        {"f": (str, Field(pattern="^a"))},
        "constraint_tightened",
        B,
        C,
    ),
    (
        "pattern changed",
        {"f": (str, Field(pattern="^a"))},
        {"f": (str, Field(pattern="^b"))},
        "type_changed",
        B,
        B,
    ),
    (
        "multipleOf finer",
        {"f": (int, Field(multiple_of=4))},
        {"f": (int, Field(multiple_of=2))},
        "constraint_loosened",
        C,
        B,
    ),
    (
        "maxItems smaller",
        {"f": (list[int], Field(max_length=3))},
        {"f": (list[int], Field(max_length=2))},
        "constraint_tightened",
        B,
        C,
    ),
    (
        "list item narrowed",
        {"f": (list[float], ...)},
        {"f": (list[int], ...)},
        "type_narrowed",
        B,
        C,
    ),
    (
        "dict value widened",
        {"f": (dict[str, int], ...)},
        {"f": (dict[str, float], ...)},
        "type_widened",
        C,
        B,
    ),
    ("nested field added", {"p": (Point, ...)}, {"p": (Point3, ...)}, "field_added", C, C),
    ("nested field removed", {"p": (Point3, ...)}, {"p": (Point, ...)}, "field_removed", B, B),
    ("any->int", {"f": (Any, ...)}, {"f": (int, ...)}, "type_narrowed", B, C),
    ("default changed", {"f": (int, 1)}, {"f": (int, 2)}, "default_changed", C, C),
]


@pytest.mark.parametrize(
    ("old", "new", "kind", "as_action", "as_observation"),
    [row[1:] for row in RULES],
    ids=[row[0] for row in RULES],
)
def test_rule(
    old: dict[str, Any],
    new: dict[str, Any],
    kind: str,
    as_action: Severity,
    as_observation: Severity,
) -> None:
    old_model, new_model = model("M", **old), model("M", **new)
    for name, expected in (("action", as_action), ("observation", as_observation)):
        found = changes(old_model, new_model, name)
        assert [(k, s) for _, k, s in found] == [(kind, expected.value)], (name, found)


def test_paths_name_the_field_through_nesting() -> None:
    old = model("M", points=(list[Point], ...), by_name=(dict[str, Point], ...))
    new = model("M", points=(list[Point3], ...), by_name=(dict[str, Point3], ...))
    paths = [
        c.path
        for c in diff_schemas(
            {"action": old.model_json_schema()}, {"action": new.model_json_schema()}
        )
    ]
    assert paths == ["action.points[].z", "action.by_name{}.z"]


def test_renaming_a_nested_class_is_not_a_change() -> None:
    old = model("M", p=(Point, ...))
    new = model("M", p=(PointRenamedClass, ...))
    assert changes(old, new, "action") == []


def test_renamed_field_is_breaking_with_a_hint() -> None:
    old = model("M", guess=(str, ...))
    new = model("M", answer=(str, ...))
    result = diff_schemas({"action": old.model_json_schema()}, {"action": new.model_json_schema()})
    removed = next(c for c in result if c.kind is ChangeKind.FIELD_REMOVED)
    assert removed.path == "action.guess"
    assert removed.breaking and removed.fails_at == "server"
    assert "renamed to 'answer'?" in removed.message
    assert removed.direction is Direction.CLIENT_TO_SERVER


def test_the_failing_side_follows_direction() -> None:
    old = model("M", f=(int, ...))
    new = model("M", f=(str, ...))
    for name, side in (("action", "server"), ("observation", "client"), ("state", "client")):
        (change,) = diff_schemas({name: old.model_json_schema()}, {name: new.model_json_schema()})
        assert change.fails_at == side
        assert change.path == f"{name}.f"


def test_removed_field_message_says_whether_the_server_rejects_or_ignores() -> None:
    strict_old = model("M", f=(int, 0))
    lax_old = create_model("M", f=(int, 0))
    empty = create_model("M")
    (rejects,) = diff_schemas(
        {"action": strict_old.model_json_schema()}, {"action": model("M").model_json_schema()}
    )
    (ignores,) = diff_schemas(
        {"action": lax_old.model_json_schema()}, {"action": empty.model_json_schema()}
    )
    assert "rejects" in rejects.message and "ignores" in ignores.message


def test_tolerant_readers_make_added_observation_fields_compatible() -> None:
    old, new = model("M"), model("M", f=(int, 0))
    old_s = {"observation": old.model_json_schema()}
    new_s = {"observation": new.model_json_schema()}
    (strict,) = diff_schemas(old_s, new_s)
    assert strict.breaking and strict.fails_at == "client"
    assert "forbid unknown keys" in strict.message
    (tolerant,) = diff_schemas(old_s, new_s, tolerant_readers=True)
    assert not tolerant.breaking and tolerant.fails_at is None

    # Where the locked model allows unknown keys (State does), adding is compatible anyway.
    class Counted(State):
        target: int = 0

    (state,) = diff_schemas(
        {"state": State.model_json_schema()},
        {"state": Counted.model_json_schema()},
    )
    assert state.kind is ChangeKind.FIELD_ADDED and not state.breaking


def test_recursive_models_terminate() -> None:
    class Tree(BaseModel):
        value: int
        children: list[Tree] = []

    class Tree2(BaseModel):
        value: int
        label: str = ""
        children: list[Tree2] = []

    found = changes(Tree, Tree2, "observation")
    assert found == [("observation.label", "field_added", "compatible")]
    assert changes(Tree, Tree, "action") == []


def test_missing_models() -> None:
    schema = {"type": "object", "properties": {}}
    result = diff_schemas({"action": schema, "state": schema}, {"action": schema})
    assert [(c.path, c.kind, c.severity) for c in result] == [
        ("state", ChangeKind.MODEL_REMOVED, B)
    ]


def test_annotations_are_ignored() -> None:
    old = model("M", f=(int, Field(description="one")))
    new = model("N", f=(int, Field(description="two", title="F!")))
    assert changes(old, new, "action") == []


# ----------------------------------------------------------------------- properties
#
# Soundness against pydantic itself: when the diff calls a change compatible, every
# payload valid for the old model must validate against the new one (actions), or every
# payload the new model produces must validate against the old one (observations, read
# by strict clients, or with tolerant_readers by clients that ignore unknown keys).

FIELD_TYPES: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (int, st.integers(-1000, 1000)),
    (float, st.floats(-1e6, 1e6, allow_nan=False)),
    (str, st.text(max_size=12)),
    (bool, st.booleans()),
    (Literal["a", "b"], st.sampled_from(["a", "b"])),
    (Literal["a", "b", "c"], st.sampled_from(["a", "b", "c"])),
    (int | None, st.none() | st.integers(-1000, 1000)),
    (str | None, st.none() | st.text(max_size=12)),
    (int | str, st.integers(-5, 5) | st.text(max_size=3)),
    (list[int], st.lists(st.integers(-9, 9), max_size=4)),
    (list[float], st.lists(st.floats(-9, 9, allow_nan=False), max_size=4)),
    (dict[str, int], st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=3)),
]
NAMES = ["a", "b", "c", "d"]


@st.composite
def model_specs(draw: st.DrawFn) -> dict[str, tuple[int, bool]]:
    """field name → (index into FIELD_TYPES, required)."""
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=4))
    return {n: (draw(st.integers(0, len(FIELD_TYPES) - 1)), draw(st.booleans())) for n in names}


@st.composite
def mutations(draw: st.DrawFn, old: dict[str, tuple[int, bool]]) -> dict[str, tuple[int, bool]]:
    """A variant of ``old``: some fields retyped, made (not) required, dropped or added."""
    new: dict[str, tuple[int, bool]] = {}
    for name, (index, required) in old.items():
        action = draw(st.sampled_from(["keep", "keep", "retype", "toggle", "drop"]))
        if action == "keep":
            new[name] = (index, required)
        elif action == "retype":
            new[name] = (draw(st.integers(0, len(FIELD_TYPES) - 1)), required)
        elif action == "toggle":
            new[name] = (index, not required)
    for name in NAMES:
        if name not in old and draw(st.integers(0, 3)) == 0:
            new[name] = (draw(st.integers(0, len(FIELD_TYPES) - 1)), draw(st.booleans()))
    return new


def variants(old: dict[str, tuple[int, bool]]) -> st.SearchStrategy[dict[str, tuple[int, bool]]]:
    return mutations(old) | model_specs()


def build(spec: dict[str, tuple[int, bool]], *, forbid: bool) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for name, (index, required) in spec.items():
        tp, _ = FIELD_TYPES[index]
        fields[name] = (tp, ...) if required else (tp | None, None)
    config = ConfigDict(extra="forbid" if forbid else "ignore")
    return create_model("P", __config__=config, **fields)


@st.composite
def payloads(draw: st.DrawFn, spec: dict[str, tuple[int, bool]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (index, required) in spec.items():
        if required or draw(st.booleans()):
            out[name] = draw(FIELD_TYPES[index][1])
    return out


def accepts(model_cls: type[BaseModel], payload: dict[str, Any]) -> bool:
    try:
        model_cls.model_validate_json(json.dumps(payload))
    except ValidationError:
        return False
    return True


@given(old=model_specs(), data=st.data())
def test_compatible_actions_are_accepted_by_the_new_server(
    old: dict[str, tuple[int, bool]], data: st.DataObject
) -> None:
    new = data.draw(variants(old))
    old_m, new_m = build(old, forbid=True), build(new, forbid=True)
    result = diff_schemas(
        {"action": old_m.model_json_schema()}, {"action": new_m.model_json_schema()}
    )
    if any(c.breaking for c in result):
        return
    for _ in range(5):
        payload = data.draw(payloads(old))
        assert accepts(new_m, payload), (payload, result)


@pytest.mark.parametrize("tolerant", [False, True])
@given(old=model_specs(), data=st.data())
def test_compatible_observations_are_decoded_by_old_clients(
    tolerant: bool, old: dict[str, tuple[int, bool]], data: st.DataObject
) -> None:
    new = data.draw(variants(old))
    old_m, new_m = build(old, forbid=True), build(new, forbid=True)
    result = diff_schemas(
        {"observation": old_m.model_json_schema()},
        {"observation": new_m.model_json_schema()},
        tolerant_readers=tolerant,
    )
    if any(c.breaking for c in result):
        return
    # A strict reader validates with the locked model as is; a tolerant one ignores
    # unknown keys.
    reader = build(old, forbid=not tolerant)
    for _ in range(5):
        payload = data.draw(payloads(new))
        # The server serializes every field of its model, defaults included.
        sent = new_m.model_validate_json(json.dumps(payload)).model_dump(mode="json")
        assert accepts(reader, sent), (sent, result)


@given(spec=model_specs())
def test_identical_models_have_no_changes(spec: dict[str, tuple[int, bool]]) -> None:
    m = build(spec, forbid=True)
    for name in ("action", "observation"):
        assert diff_schemas({name: m.model_json_schema()}, {name: m.model_json_schema()}) == []


@given(old=model_specs(), new=model_specs())
def test_value_changes_flip_with_direction(
    old: dict[str, tuple[int, bool]], new: dict[str, tuple[int, bool]]
) -> None:
    """A type change compatible for actions old→new is compatible for observations new→old."""
    old_m, new_m = build(old, forbid=True), build(new, forbid=True)
    forward = diff_schemas(
        {"action": old_m.model_json_schema()}, {"action": new_m.model_json_schema()}
    )
    backward = diff_schemas(
        {"observation": new_m.model_json_schema()}, {"observation": old_m.model_json_schema()}
    )
    value_kinds = {
        ChangeKind.TYPE_CHANGED,
        ChangeKind.TYPE_NARROWED,
        ChangeKind.TYPE_WIDENED,
        ChangeKind.ENUM_VALUE_ADDED,
        ChangeKind.ENUM_VALUE_REMOVED,
    }
    fwd = sorted((c.path.split(".", 1)[1], c.severity) for c in forward if c.kind in value_kinds)
    bwd = sorted((c.path.split(".", 1)[1], c.severity) for c in backward if c.kind in value_kinds)
    assert fwd == bwd

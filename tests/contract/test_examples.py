"""Examples from JSON Schemas: a valid instance to play, one the schema rejects."""

from __future__ import annotations

import pytest

from corral.contract.examples import example_for, invalid_action_for, schema_problem

ECHO = {
    "type": "object",
    "properties": {"m": {"type": "string", "minLength": 3}},
    "required": ["m"],
}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (ECHO, {"m": "aaa"}),
        (
            {"type": "object", "properties": {"k": {"enum": ["x", "y"]}}, "required": ["k"]},
            {"k": "x"},
        ),
        (
            {
                "type": "object",
                "properties": {"k": {"type": "integer", "exclusiveMinimum": 4}},
                "required": ["k"],
            },
            {"k": 5},
        ),
        (
            {
                "type": "object",
                "properties": {"k": {"type": "number", "minimum": 2, "maximum": 5}},
                "required": ["k"],
            },
            {"k": 2.0},
        ),
        (
            {
                "type": "object",
                "properties": {"k": {"anyOf": [{"type": "null"}, {"type": "boolean"}]}},
                "required": ["k"],
            },
            {"k": None},
        ),
        (
            {
                "type": "object",
                "properties": {"k": {"type": "array", "minItems": 2, "items": {"const": 1}}},
                "required": ["k"],
            },
            {"k": [1, 1]},
        ),
        (
            {
                "type": "object",
                "properties": {"k": {"$ref": "#/$defs/P"}},
                "required": ["k"],
                "$defs": {
                    "P": {"type": "object", "properties": {"x": {"type": "integer", "default": 3}}}
                },
            },
            {"k": {}},
        ),
        ({"type": "object", "properties": {"opt": {"type": "string"}}}, {}),
        ({"type": ["string", "null"]}, "a"),
    ],
)
def test_examples_from_schemas(schema, expected):
    assert example_for(schema) == expected
    assert schema_problem(schema, expected) is None


def test_unsynthesizable_schemas_and_invalid_actions():
    with pytest.raises(ValueError, match="cannot synthesize"):
        example_for({"type": "object", "properties": {"k": {"not": {}}}, "required": ["k"]})
    closed = {**ECHO, "additionalProperties": False}
    assert invalid_action_for(closed, {"m": "aaa"}) == {
        "m": "aaa",
        "__corral_validate_unknown__": 1,
    }
    assert invalid_action_for(ECHO, {"m": "aaa"}) == {"m": 12345}
    assert invalid_action_for({"type": "object"}, {}) is None
    assert schema_problem(ECHO, {"m": 3}) == "m: 3 is not of type 'string'"

"""``$ref`` resolution: the one reader against the shared vectors, and every walker of
schemas going through it (issue 32: six rules, one of them recursing forever)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from corral.adapters.gymnasium.spaces import SpaceConversionError, binding_for_schema
from corral.adapters.trl import _resolve as trl_resolve
from corral.contract.diff import ChangeKind, diff_schemas
from corral.contract.dynamic import model_from_schema
from corral.contract.examples import example_for, invalid_action_for
from corral.contract.refs import RefError, SchemaReader
from corral.evaluation.policies import SchemaSampler

VECTORS = json.loads((Path(__file__).parent / "schema_ref_vectors.json").read_text())["vectors"]

CYCLE: dict[str, Any] = {
    "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
    "$ref": "#/$defs/A",
}


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_the_shared_vectors(vector: dict[str, Any]) -> None:
    reader = SchemaReader(vector["schema"])
    node = vector.get("node", vector["schema"])
    if "error" in vector:
        with pytest.raises(RefError) as err:
            reader.resolve(node)
        assert err.value.kind == vector["error"]
        assert isinstance(err.value, ValueError)
        return
    resolved = reader.resolve(node)
    assert dict(resolved.node) == vector["expected"]["node"]
    assert resolved.name == vector["expected"]["name"]


def test_the_vectors_cover_both_errors_and_every_rule() -> None:
    assert {v.get("error") for v in VECTORS} == {None, "unresolvable", "cycle"}
    assert len(VECTORS) >= 20


def test_a_cycle_names_its_chain_and_a_reader_of_defs_alone() -> None:
    with pytest.raises(RefError, match=r"#/\$defs/A -> #/\$defs/B -> #/\$defs/A form a cycle"):
        SchemaReader(CYCLE).resolve(CYCLE)
    reader = SchemaReader.of_defs({"N": {"type": "integer"}})
    assert reader.deref({"$ref": "#/$defs/N"}) == {"type": "integer"}


# -- every walker of schemas, on the same cycle and the same sibling rule -------------------


def test_examples_refuse_a_cycle_instead_of_recursing() -> None:
    """The issue's own call raised RecursionError."""
    with pytest.raises(ValueError, match="form a cycle"):
        example_for(CYCLE)
    schema = {"$defs": {"N": {"type": "integer", "minimum": 3}}, "properties": {}}
    assert example_for(schema, {"$ref": "#/$defs/N", "minimum": 5}) == 5  # siblings apply
    action = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"a": {"$ref": "#/$defs/A"}, "n": {"type": "integer"}},
        "required": ["n"],
        "$defs": CYCLE["$defs"],
    }
    assert invalid_action_for(action, {"n": 1}) is not None  # the cyclic field is skipped


def test_the_diff_compares_a_cycle_as_written() -> None:
    assert diff_schemas({"action": CYCLE}, {"action": CYCLE}) == []
    changed = {**CYCLE, "$defs": {**CYCLE["$defs"], "B": {"type": "integer"}}}
    kinds = {c.kind for c in diff_schemas({"action": CYCLE}, {"action": changed})}
    assert kinds  # a cycle that now reaches a schema is a change, found without recursing
    assert kinds <= set(ChangeKind)


def test_the_gymnasium_spaces_name_the_cycle() -> None:
    with pytest.raises(SpaceConversionError, match=r"M\.x: recursive schema references"):
        binding_for_schema({"$ref": "#/$defs/A"}, CYCLE["$defs"], "M.x")
    with pytest.raises(SpaceConversionError, match=r"M\.y: cannot resolve schema reference"):
        binding_for_schema({"$ref": "#/$defs/Missing"}, CYCLE["$defs"], "M.y")
    bound = binding_for_schema(
        {"$ref": "#/$defs/N", "maximum": 4}, {"N": {"type": "integer", "minimum": 0}}, "M.z"
    )
    assert bound.space.n == 5  # type: ignore[attr-defined]  # the sibling bound applies


def test_trl_keeps_the_other_keywords_of_a_cycle() -> None:
    assert trl_resolve({"$ref": "#/$defs/A", "description": "d"}, CYCLE["$defs"]) == {
        "description": "d"
    }
    assert trl_resolve({"$ref": "#/$defs/N", "description": "d"}, {"N": {"type": "string"}}) == {
        "type": "string",
        "description": "d",
    }


def test_the_random_policy_draws_nothing_for_a_cycle() -> None:
    class Wide(BaseModel):
        x: Any = None

    sampler = SchemaSampler(Wide)
    sampler.schema = {**CYCLE, "type": "object", "properties": {"x": {"$ref": "#/$defs/A"}}}
    assert sampler._value(sampler.schema["properties"]["x"], random.Random(0), 0) is None


def test_rebuilt_models_survive_a_cycle() -> None:
    schema = {
        "type": "object",
        "title": "Holder",
        "properties": {"x": {"$ref": "#/$defs/A"}, "n": {"type": "integer"}},
        "$defs": CYCLE["$defs"],
    }
    model = model_from_schema(schema)
    assert model.model_validate({"n": 2}).n == 2  # type: ignore[attr-defined]

"""Schema export, fingerprints and contract versions."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field
from tests.strategies import CONTRACT_SETTINGS, model_classes

from corral.contract import (
    Action,
    Observation,
    State,
)
from corral.contract.schema import (
    Contract,
    canonical_schema,
    compatible,
    fingerprint,
    model_schemas,
    parse_semver,
)
from corral.envs.echo import EchoAction, EchoEnv, EchoObservation, EchoSnapshot, EchoState

# The same contract, defined in a fresh interpreter (and in this one, below).
CONTRACT_SOURCE = textwrap.dedent(
    """
    import enum
    from typing import Literal
    from pydantic import Field
    from corral.contract import Action, Observation, State
    from corral.contract.schema import fingerprint, model_schemas

    class Dir(enum.Enum):
        N = "n"
        S = "s"

    class Inner(Action):
        depth: int = Field(default=1, ge=0)

    class Move(Action):
        direction: Dir
        speed: float = 1.5
        tags: dict[str, list[int]] = {}
        inner: Inner | None = None
        mode: Literal["walk", "run"] = "walk"

    class Seen(Observation):
        grid: list[list[int]] = []
        big: int = 2**70

    class Where(State):
        position: tuple[int, int] = (0, 0)
    """
)


def _fingerprint_in_subprocess(hash_seed: str) -> str:
    code = CONTRACT_SOURCE + "\nprint(fingerprint(model_schemas(Move, Seen, Where)))\n"
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_fingerprint_is_the_same_in_separate_processes() -> None:
    namespace: dict[str, Any] = {}
    # dont_inherit: this module's `from __future__ import annotations` must not leak in.
    exec(compile(CONTRACT_SOURCE, "<contract>", "exec", dont_inherit=True), namespace)
    here = fingerprint(model_schemas(namespace["Move"], namespace["Seen"], namespace["Where"]))
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", here)
    assert _fingerprint_in_subprocess("1") == here
    assert _fingerprint_in_subprocess("2") == here


def test_fingerprint_of_a_real_contract_is_stable_across_calls() -> None:
    contract = EchoEnv.contract()
    schemas = model_schemas(EchoAction, EchoObservation, EchoState)
    again = fingerprint({**schemas, "snapshot": EchoSnapshot.model_json_schema()})
    assert contract.fingerprint == again == EchoEnv.contract().fingerprint


class Base(Action):
    """The original docstring."""

    name: str = Field(description="who")
    count: int = 0


class Redocumented(Action):
    """A completely different docstring."""

    model_config = ConfigDict(title="Base", json_schema_extra={"examples": [{"name": "x"}]})

    name: str = Field(description="someone else", title="The name", examples=["ann"])
    count: int = Field(0, description="how many")


def fp(model: type[BaseModel]) -> str:
    return fingerprint({"action": model.model_json_schema()})


def test_annotations_do_not_change_the_fingerprint() -> None:
    assert fp(Base) == fp(Redocumented)


class Added(Action):
    name: str
    count: int = 0
    extra: str | None = None


class Removed(Action):
    name: str


class Retyped(Action):
    name: str
    count: float = 0


class MadeOptional(Action):
    name: str | None
    count: int = 0


class Renamed(Action):
    title_: str = Field(alias="nom")
    count: int = 0


class Constrained(Action):
    name: str = Field(max_length=3)
    count: int = 0


class Required(Action):
    name: str
    count: int


@pytest.mark.parametrize(
    "changed", [Added, Removed, Retyped, MadeOptional, Renamed, Constrained, Required]
)
def test_structural_changes_change_the_fingerprint(changed: type[BaseModel]) -> None:
    assert fp(changed) != fp(Base)


class NamedLikeAnnotations(Action):
    title: str
    description: str
    examples: list[int]


class NamedOtherwise(Action):
    heading: str
    summary: str
    samples: list[int]


def test_properties_named_like_annotation_keywords_are_kept() -> None:
    canonical = canonical_schema(NamedLikeAnnotations.model_json_schema())
    for name in (b'"title"', b'"description"', b'"examples"'):
        assert name in canonical
    assert b"NamedLikeAnnotations" not in canonical  # the model's own title is stripped
    assert fp(NamedLikeAnnotations) != fp(NamedOtherwise)

    class Fewer(Action):
        title: str
        description: str

    assert fp(Fewer) != fp(NamedLikeAnnotations)


def _with_leaf(doc: str, description: str, field_title: str | None = None) -> type[BaseModel]:
    """An action holding a nested model called ``Leaf``, documented as given."""

    class Leaf(BaseModel):
        x: int = Field(description=description, title=field_title)

    Leaf.__doc__ = doc

    class Holder(Action):
        leaf: Leaf
        leaves: list[Leaf] = []

    return Holder


def test_nested_definitions_are_canonicalized_too() -> None:
    a = _with_leaf("Leaf docs.", "x")
    b = _with_leaf("Other docs.", "other", field_title="X!")
    assert a.model_json_schema() != b.model_json_schema()
    assert fp(a) == fp(b)

    class Leaf(BaseModel):
        x: int = Field(description="x")

    class Renamed(BaseModel):
        x: int = Field(description="x")

    class A(Action):
        leaf: Leaf

    class B(Action):
        leaf: Renamed

    # Same structure, another $defs name: the names are part of the schema.
    assert fp(A) != fp(B)


def test_fingerprint_ignores_key_order_and_depends_on_role_names() -> None:
    schemas = model_schemas(EchoAction, EchoObservation, EchoState)
    reordered = {k: dict(reversed(list(v.items()))) for k, v in reversed(list(schemas.items()))}
    assert fingerprint(reordered) == fingerprint(schemas)
    swapped = {"action": schemas["state"], "observation": schemas["observation"]}
    swapped["state"] = schemas["action"]
    assert fingerprint(swapped) != fingerprint(schemas)


def test_huge_integers_in_schemas_are_fingerprinted() -> None:
    class Big(Action):
        n: int = Field(default=2**100, le=2**120)

    class Bigger(Action):
        n: int = Field(default=2**101, le=2**120)

    assert re.fullmatch(r"sha256:[0-9a-f]{16}", fp(Big))
    assert fp(Big) == fp(Big) != fp(Bigger)


@CONTRACT_SETTINGS
@given(model=model_classes(base=Observation))
def test_fingerprint_is_a_function_of_the_schema(model: type[BaseModel]) -> None:
    schema = model.model_json_schema()
    assert fingerprint({"m": schema}) == fingerprint({"m": model.model_json_schema()})
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", fingerprint({"m": schema}))


def test_model_schemas_and_contract() -> None:
    schemas = model_schemas(EchoAction, EchoObservation, EchoState)
    assert set(schemas) == {"action", "observation", "state"}
    assert schemas["state"]["properties"]["total_length"]["type"] == "integer"
    contract = Contract("echo", "1.2.3", EchoAction, EchoObservation, EchoState)
    assert contract.schemas == schemas
    assert contract.schemas is contract.schemas  # computed once
    assert contract.fingerprint == fingerprint(schemas)
    with pytest.raises(AttributeError):
        contract.version = "2.0.0"  # type: ignore[misc]


def test_observation_and_state_bases_have_schemas() -> None:
    schemas = model_schemas(Action, Observation, State)
    assert schemas["action"]["additionalProperties"] is False
    assert set(schemas["observation"]["properties"]) == {
        "done",
        "truncated",
        "reward",
        "reward_components",
        "metadata",
    }
    assert set(schemas["state"]["properties"]) == {"episode_id", "step_count"}


@pytest.mark.parametrize(
    ("version", "parsed"),
    [
        ("0.0.0", (0, 0, 0)),
        ("1.0.0", (1, 0, 0)),
        ("10.20.30", (10, 20, 30)),
        ("1.2.3-alpha", (1, 2, 3)),
        ("1.2.3-rc.1", (1, 2, 3)),
        ("1.2.3+build.5", (1, 2, 3)),
        ("1.2.3-beta.2+exp.sha.5114f85", (1, 2, 3)),
        ("999999.0.1", (999999, 0, 1)),
    ],
)
def test_parse_semver_accepts_semantic_versions(version: str, parsed: tuple[int, int, int]) -> None:
    assert parse_semver(version) == parsed


@pytest.mark.parametrize(
    "version",
    [
        "",
        "1",
        "1.0",
        "1.0.0.0",
        "01.0.0",
        "1.02.0",
        "v1.0.0",
        " 1.0.0",
        "1.0.0 ",
        "1.0.0-",
        "1.0.0+",
        "1.0.0-al pha",
        "a.b.c",
        "1.-1.0",
        "1.0.0\n",
    ],
)
def test_parse_semver_rejects_everything_else(version: str) -> None:
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR\.PATCH") as info:
        parse_semver(version)
    assert repr(version) in str(info.value)


@pytest.mark.parametrize(
    ("client", "server", "ok"),
    [
        ("1.0.0", "1.0.0", True),
        ("1.0.0", "1.9.3", True),
        ("1.9.3", "1.0.0", True),
        ("1.0.0-rc.1", "1.2.0+build", True),
        ("0.1.0", "0.2.0", True),
        ("1.0.0", "2.0.0", False),
        ("2.0.0", "1.0.0", False),
        ("0.9.9", "1.0.0", False),
    ],
)
def test_compatible_means_same_major(client: str, server: str, ok: bool) -> None:
    assert compatible(client, server) is ok


@given(
    st.tuples(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50)),
)
def test_compatible_is_symmetric(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    va, vb = ".".join(map(str, a)), ".".join(map(str, b))
    assert compatible(va, vb) == compatible(vb, va) == (a[0] == b[0])


def test_compatible_rejects_bad_versions() -> None:
    with pytest.raises(ValueError, match=r"'1\.0'"):
        compatible("1.0", "1.0.0")
    with pytest.raises(ValueError, match="'x'"):
        compatible("1.0.0", "x")

"""Models rebuilt from JSON Schemas: mapping, inheritance, recursion, round trips."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import ipaddress
import pathlib
import typing
import uuid
from typing import Annotated, Any, Literal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, RootModel, SecretStr, ValidationError
from tests.strategies import CONTRACT_SETTINGS, instances, model_classes

from corral.contract import (
    Action,
    Environment,
    Observation,
    State,
    WireModel,
)
from corral.contract.dynamic import contract_models, model_from_schema
from corral.contract.schema import fingerprint, model_schemas
from corral.envs.echo import EchoEnv


def same_fingerprint(a: type[BaseModel], b: type[BaseModel]) -> bool:
    return fingerprint({"m": a.model_json_schema()}) == fingerprint({"m": b.model_json_schema()})


def rebuilt(model: type[BaseModel], **kwargs: Any) -> type[BaseModel]:
    return model_from_schema(model.model_json_schema(), **kwargs)


def annotation(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].annotation


# --- types ------------------------------------------------------------------------------------


class Scalars(BaseModel):
    s: str
    i: int
    f: float
    b: bool
    n: None


def test_scalars_map_to_python_types() -> None:
    d = rebuilt(Scalars)
    assert [annotation(d, n) for n in "sifbn"] == [str, int, float, bool, type(None)]
    assert d.model_validate({"s": "x", "i": 1, "f": 1.5, "b": True, "n": None}).i == 1
    with pytest.raises(ValidationError):
        d.model_validate({"s": "x", "i": "nope", "f": 1.5, "b": True, "n": None})


class Formats(BaseModel):
    when: dt.datetime
    day: dt.date
    clock: dt.time
    span: dt.timedelta
    ident: uuid.UUID
    where: pathlib.Path
    ip: ipaddress.IPv4Address
    net: ipaddress.IPv6Network
    secret: SecretStr
    raw: bytes


def test_string_formats_map_to_their_types() -> None:
    d = rebuilt(Formats)
    expected = {
        "when": dt.datetime,
        "day": dt.date,
        "clock": dt.time,
        "span": dt.timedelta,
        "ident": uuid.UUID,
        "where": pathlib.Path,
        "ip": ipaddress.IPv4Address,
        "net": ipaddress.IPv6Network,
        "secret": SecretStr,
    }
    for name, tp in expected.items():
        assert annotation(d, name) is tp, name
    assert annotation(d, "raw") is bytes
    assert same_fingerprint(Formats, d)


def test_unknown_string_format_validates_as_str_and_keeps_the_schema() -> None:
    schema = {
        "type": "object",
        "title": "Mail",
        "properties": {"to": {"type": "string", "format": "email", "maxLength": 5}},
        "required": ["to"],
    }
    d = model_from_schema(schema)
    assert d(to="a@b.c").to == "a@b.c"
    assert d.model_json_schema()["properties"]["to"]["format"] == "email"
    assert fingerprint({"m": schema}) == fingerprint({"m": d.model_json_schema()})


class Bytes(WireModel):
    data: bytes = b"\x00\xff"


class PlainBytes(BaseModel):
    data: bytes


@pytest.mark.parametrize("payload", [b"", b"\x00\xff\xfe-_+/", bytes(range(256))])
def test_base64_bytes_round_trip_in_json_and_stay_raw_in_python_mode(payload: bytes) -> None:
    d = rebuilt(Bytes)
    original = Bytes(data=payload)
    dumped = original.model_dump(mode="json")
    copy = d.model_validate(dumped)
    assert copy.data == payload  # type: ignore[attr-defined]
    assert copy.model_dump(mode="json") == dumped
    assert copy.model_dump() == {"data": payload}
    assert d.model_validate({"data": payload}).data == payload  # type: ignore[attr-defined]
    assert d.model_validate_json(original.model_dump_json()).data == payload  # type: ignore[attr-defined]
    assert d().data == b"\x00\xff"  # type: ignore[attr-defined]
    assert same_fingerprint(Bytes, d)


def test_base64_bytes_reject_bad_text() -> None:
    d = rebuilt(Bytes)
    with pytest.raises(ValidationError, match="base64"):
        d.model_validate({"data": "not base64!"})
    with pytest.raises(ValidationError, match="ASCII"):
        d.model_validate({"data": "é"})


def test_utf8_bytes_round_trip() -> None:
    d = rebuilt(PlainBytes)
    dumped = PlainBytes(data="héllo".encode()).model_dump(mode="json")
    assert d.model_validate(dumped).model_dump(mode="json") == dumped
    assert same_fingerprint(PlainBytes, d)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Choices(BaseModel):
    color: Color = Color.BLUE
    level: Level
    mode: Literal["fast", "slow"]
    one: Literal[7]
    flag: Literal[True]
    mixed: Literal[1, "a"]


def test_enums_become_enum_classes_and_inline_enums_literals() -> None:
    d = rebuilt(Choices)
    color = annotation(d, "color")
    assert issubclass(color, enum.Enum)
    assert color.__name__ == "Color"
    assert [m.value for m in color] == ["red", "blue"]
    assert [m.value for m in annotation(d, "level")] == [1, 2]
    assert annotation(d, "mode") == Literal["fast", "slow"]
    assert annotation(d, "one") == Literal[7]
    assert annotation(d, "flag") == Literal[True]
    assert annotation(d, "mixed") == Literal[1, "a"]
    obj = d(level=2, mode="fast", one=7, flag=True, mixed="a")
    assert obj.color is color("blue")  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        d(level=3, mode="fast", one=7, flag=True, mixed="a")
    assert same_fingerprint(Choices, d)


def test_enum_member_names_are_always_valid_and_unique() -> None:
    schema = {
        "type": "object",
        "title": "E",
        "properties": {"e": {"$ref": "#/$defs/Odd"}},
        "required": ["e"],
        "$defs": {"Odd": {"enum": ["V1", "two words", "_private", "mro", "", "V1 "]}},
    }
    d = model_from_schema(schema)
    odd = annotation(d, "e")
    assert [m.value for m in odd] == ["V1", "two words", "_private", "mro", "", "V1 "]
    assert len({m.name for m in odd}) == 6


class Containers(BaseModel):
    items: list[int]
    unique: set[str]
    frozen: frozenset[int]
    pair: tuple[int, str]
    empty: tuple[()]
    many: tuple[float, ...]
    table: dict[str, float]
    keyed: dict[Literal["x", "y"], int]
    anything: dict[str, Any]
    untyped: list[Any]
    models: set[int] = Field(default_factory=set)


def test_containers() -> None:
    d = rebuilt(Containers)
    assert annotation(d, "items") == list[int]
    assert annotation(d, "unique") == set[str]
    assert annotation(d, "frozen") == set[int]  # same schema as frozenset
    assert annotation(d, "pair") == tuple[int, str]
    assert annotation(d, "empty") == tuple[()]
    assert annotation(d, "many") == list[float]  # same schema as tuple[float, ...]
    assert annotation(d, "table") == dict[str, float]
    assert annotation(d, "keyed") == dict[Literal["x", "y"], int]
    assert annotation(d, "anything") == dict[str, Any]
    assert annotation(d, "untyped") == list[Any]
    obj = d(
        items=[1],
        unique=["a", "a"],
        frozen=[1],
        pair=[1, "a"],
        empty=[],
        many=[1.5],
        table={"k": 1},
        keyed={"x": 1},
        anything={"a": [1]},
        untyped=[None],
    )
    assert obj.unique == {"a"}  # type: ignore[attr-defined]
    assert obj.pair == (1, "a")  # type: ignore[attr-defined]
    assert obj.models == set()  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        d.model_validate(obj.model_dump() | {"keyed": {"z": 1}})
    assert same_fingerprint(Containers, d)


class Constrained(BaseModel):
    model_config = ConfigDict(regex_engine="python-re")

    count: int = Field(ge=0, lt=10, multiple_of=2)
    ratio: float = Field(gt=0.5, le=1.0)
    name: str = Field(min_length=1, max_length=5, pattern="^a")
    look: str = Field(default="b", pattern=r"^(?!a)b")
    tags: list[str] = Field(min_length=1, max_length=2)
    table: dict[str, int] = Field(default_factory=dict, max_length=1)


def test_constraints_are_carried_over() -> None:
    d = rebuilt(Constrained)
    ok = {"count": 4, "ratio": 1.0, "name": "ab", "tags": ["x"]}
    assert d.model_validate(ok).model_dump() == Constrained.model_validate(ok).model_dump()
    bad_values = [
        {"count": -2},
        {"count": 10},
        {"count": 3},
        {"ratio": 0.5},
        {"ratio": 1.5},
        {"name": ""},
        {"name": "abcdef"},
        {"name": "ba"},
        {"look": "ab"},
        {"tags": []},
        {"tags": ["a", "b", "c"]},
        {"table": {"a": 1, "b": 2}},
    ]
    for bad in bad_values:
        with pytest.raises(ValidationError):
            Constrained.model_validate(ok | bad)
        with pytest.raises(ValidationError):
            d.model_validate(ok | bad)
    assert same_fingerprint(Constrained, d)
    # The look-ahead pattern needs Python's regex engine, which was switched on for it.
    assert d.model_config.get("regex_engine") == "python-re"


def test_draft4_boolean_exclusive_bounds() -> None:
    schema = {
        "type": "object",
        "title": "B",
        "properties": {
            "x": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
            "y": {"type": "integer", "maximum": 5, "exclusiveMaximum": True},
        },
        "required": ["x", "y"],
    }
    d = model_from_schema(schema)
    d(x=0.1, y=4)
    with pytest.raises(ValidationError):
        d(x=0, y=4)
    with pytest.raises(ValidationError):
        d(x=1, y=5)


class Inner(BaseModel):
    """A nested model."""

    a: int = 3


class Outer(BaseModel):
    inner: Inner
    maybe: Inner | None = None
    many: list[Inner] = Field(default_factory=list)
    defaulted: Inner = Inner(a=5)


def test_nested_models_from_defs() -> None:
    d = rebuilt(Outer)
    inner = annotation(d, "inner")
    assert issubclass(inner, BaseModel)
    assert inner.__name__ == "Inner"
    assert inner.__doc__ == "A nested model."
    assert annotation(d, "maybe") == inner | None
    assert annotation(d, "many") == list[inner]
    obj = d(inner={"a": 1})
    assert obj.defaulted == inner(a=5)  # type: ignore[attr-defined]
    assert obj.many == []  # type: ignore[attr-defined]
    assert obj.maybe is None  # type: ignore[attr-defined]
    assert same_fingerprint(Outer, d)


class Node(BaseModel):
    value: int = 0
    children: list[Node] = Field(default_factory=list)
    parent: Node | None = None


class Tree(BaseModel):
    root: Node
    forest: dict[str, Node] = Field(default_factory=dict)


class Ping(BaseModel):
    pong: Pong | None = None


class Pong(BaseModel):
    ping: Ping | None = None


Ping.model_rebuild()


def test_recursive_root_model() -> None:
    assert "$ref" in Node.model_json_schema()  # pydantic's form for a recursive root
    d = rebuilt(Node)
    assert d.__name__ == "Node"
    data = {"value": 1, "children": [{"value": 2, "children": [{}]}], "parent": {"value": 0}}
    obj = d.model_validate(data)
    assert isinstance(obj.children[0].children[0], d)  # type: ignore[attr-defined]
    assert obj.model_dump() == Node.model_validate(data).model_dump()
    assert d.model_json_schema() == Node.model_json_schema()


def test_recursion_below_the_root_and_mutual_recursion() -> None:
    d = rebuilt(Tree)
    obj = d.model_validate({"root": {"children": [{"value": 9}]}, "forest": {"x": {}}})
    assert obj.root.children[0].value == 9  # type: ignore[attr-defined]
    assert same_fingerprint(Tree, d)
    p = rebuilt(Ping)
    deep = p.model_validate({"pong": {"ping": {"pong": {"ping": None}}}})
    assert deep.pong.ping.pong.ping is None  # type: ignore[attr-defined]
    assert p.model_json_schema() == Ping.model_json_schema()


def test_ref_to_the_document_root() -> None:
    schema = {
        "type": "object",
        "title": "Chain",
        "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}], "default": None}},
    }
    d = model_from_schema(schema)
    assert d.model_validate({"next": {"next": {}}}).next.next.next is None  # type: ignore[attr-defined]


class Cat(BaseModel):
    kind: Literal["cat"] = "cat"
    lives: int = 9


class Dog(BaseModel):
    kind: Literal["dog"] = "dog"
    good: bool = True


class Pets(BaseModel):
    pet: Cat | Dog = Field(discriminator="kind")
    maybe: Annotated[Cat | Dog, Field(discriminator="kind")] | None = None
    either: int | str = 0


def test_unions_and_discriminated_unions() -> None:
    d = rebuilt(Pets)
    obj = d.model_validate({"pet": {"kind": "dog"}, "maybe": {"kind": "cat"}, "either": "x"})
    assert type(obj.pet).__name__ == "Dog"  # type: ignore[attr-defined]
    assert type(obj.maybe).__name__ == "Cat"  # type: ignore[attr-defined]
    assert obj.either == "x"  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match=r"discriminator|tag"):
        d.model_validate({"pet": {"kind": "cow"}})
    assert same_fingerprint(Pets, d)


class Root(RootModel[list[int]]):
    pass


class WithRoot(BaseModel):
    numbers: Root


def test_root_model_definitions() -> None:
    d = rebuilt(WithRoot)
    root = annotation(d, "numbers")
    assert issubclass(root, RootModel)
    assert d.model_validate({"numbers": [1, 2]}).model_dump(mode="json") == {"numbers": [1, 2]}
    assert same_fingerprint(WithRoot, d)


class Money(BaseModel):
    amount: decimal.Decimal


def test_decimal_comes_back_as_float_or_str_with_the_same_schema() -> None:
    d = rebuilt(Money)
    assert annotation(d, "amount") == float | str
    dumped = Money(amount=decimal.Decimal("1.10")).model_dump(mode="json")
    assert d.model_validate(dumped).model_dump(mode="json") == dumped
    assert same_fingerprint(Money, d)


# --- fields -----------------------------------------------------------------------------------


class Defaults(BaseModel):
    required: int
    optional_required: int | None
    with_default: int = 5
    none_default: str | None = None
    when: dt.datetime = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    color: Color = Color.RED
    factory_list: list[int] = Field(default_factory=list)
    factory_dict: dict[str, int] = Field(default_factory=dict)
    factory_set: set[int] = Field(default_factory=set)
    factory_other: int = Field(default_factory=lambda: 3)


def test_required_and_defaults() -> None:
    d = rebuilt(Defaults)
    with pytest.raises(ValidationError) as info:
        d()
    missing = {e["loc"][0] for e in info.value.errors()}
    assert missing == {"required", "optional_required"}
    obj = d(required=1, optional_required=None)
    assert obj.with_default == 5  # type: ignore[attr-defined]
    assert obj.none_default is None  # type: ignore[attr-defined]
    # JSON defaults are validated into their types.
    assert obj.when == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)  # type: ignore[attr-defined]
    assert obj.color is annotation(d, "color")("red")  # type: ignore[attr-defined]
    # A default the schema does not show (default_factory) becomes an empty container...
    assert obj.factory_list == []  # type: ignore[attr-defined]
    assert obj.factory_dict == {}  # type: ignore[attr-defined]
    assert obj.factory_set == set()  # type: ignore[attr-defined]
    # ... or None.
    assert obj.factory_other is None  # type: ignore[attr-defined]
    # Fresh containers per instance.
    obj.factory_list.append(1)  # type: ignore[attr-defined]
    assert d(required=1, optional_required=None).factory_list == []  # type: ignore[attr-defined]
    assert same_fingerprint(Defaults, d)


class Annotated_(BaseModel):
    """Docs survive."""

    model_config = ConfigDict(title="Documented", json_schema_extra={"x-owner": "team"})

    speed: float = Field(
        default=1.0,
        title="Speed!",
        description="how fast",
        examples=[0.5],
        json_schema_extra={"x-unit": "m/s"},
    )
    old: int = Field(default=0, deprecated=True)


def test_titles_descriptions_examples_and_extra_keywords_survive() -> None:
    d = rebuilt(Annotated_)
    assert d.__name__ == "Documented"
    assert d.__doc__ == "Docs survive."
    info = d.model_fields["speed"]
    assert (info.title, info.description, info.examples) == ("Speed!", "how fast", [0.5])
    assert d.model_json_schema() == Annotated_.model_json_schema()
    assert d.model_fields["old"].deprecated


def test_property_names_that_are_not_python_names_get_aliases() -> None:
    schema = {
        "type": "object",
        "title": "Odd",
        "properties": {
            "my field": {"type": "integer"},
            "class": {"type": "string"},
            "_private": {"type": "boolean"},
            "model_dump": {"type": "integer"},
            "1st": {"type": "integer"},
            "x": {"type": "integer"},
            "_x": {"type": "integer"},
        },
        "required": ["my field", "class", "_private", "model_dump", "1st", "x", "_x"],
    }
    d = model_from_schema(schema)
    data = {
        "my field": 1,
        "class": "c",
        "_private": True,
        "model_dump": 2,
        "1st": 3,
        "x": 4,
        "_x": 5,
    }
    obj = d.model_validate(data)
    assert obj.model_dump() == data
    assert obj.model_dump_json() == d.model_validate_json(obj.model_dump_json()).model_dump_json()
    assert fingerprint({"m": schema}) == fingerprint({"m": d.model_json_schema()})
    assert callable(obj.model_dump)


def test_name_overrides_the_title() -> None:
    d = rebuilt(Inner, name="Renamed")
    assert d.__name__ == "Renamed"
    assert d.model_json_schema()["title"] == "Renamed"


# --- extra and bases --------------------------------------------------------------------------


class Forbid(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: int = 0


class Allow(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int = 0


class TypedExtra(BaseModel):
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, int] = Field(init=False)  # type: ignore[assignment]


class Ignore(BaseModel):
    a: int = 0


def test_extra_follows_additional_properties() -> None:
    with pytest.raises(ValidationError):
        rebuilt(Forbid)(b=1)
    assert rebuilt(Allow)(b=1).model_dump() == {"a": 0, "b": 1}
    assert rebuilt(Ignore)(b=1).model_dump() == {"a": 0}
    typed = rebuilt(TypedExtra)
    assert typed(b="2").model_dump() == {"b": 2}
    with pytest.raises(ValidationError):
        typed(b="x")
    for model in (Forbid, Allow, TypedExtra, Ignore):
        assert same_fingerprint(model, rebuilt(model)), model


class Move(Action):
    direction: Literal["n", "s", "e", "w"]


class Seen(Observation):
    grid: list[list[int]] = Field(default_factory=list)
    reward: float = 0.0  # redefined: required-ness and type differ from the base's


class Where(State):
    position: tuple[int, int] = (0, 0)


def test_corral_bases_inherit_their_fields_and_behaviour() -> None:
    act = rebuilt(Move, base=Action)
    obs = rebuilt(Seen, base=Observation)
    st_ = rebuilt(Where, base=State)
    assert issubclass(act, Action) and issubclass(obs, Observation) and issubclass(st_, State)
    # Inherited, not redefined: the FieldInfo is the base's own.
    for name in ("done", "truncated", "metadata"):
        assert name in obs.model_fields
        assert name not in obs.__annotations__
    assert "episode_id" not in st_.__annotations__ and "step_count" not in st_.__annotations__
    # A base field the schema describes differently is redefined.
    assert "reward" in obs.__annotations__
    assert obs.model_fields["reward"].annotation is float
    # Base behaviour: truncated implies done; actions forbid extras; state keeps them.
    assert obs(truncated=True).done is True
    with pytest.raises(ValidationError):
        act(direction="n", speed=3)
    assert st_(step_count=2, note="x").model_dump() == {
        "episode_id": None,
        "step_count": 2,
        "position": (0, 0),
        "note": "x",
    }
    with pytest.raises(ValidationError):
        st_(step_count=-1)
    for original, copy in ((Move, act), (Seen, obs), (Where, st_)):
        assert same_fingerprint(original, copy)


def test_contract_models_of_a_real_environment() -> None:
    contract = EchoEnv.contract()
    act, obs, st_ = contract_models(contract.schemas)
    assert (act.__name__, obs.__name__, st_.__name__) == (
        "EchoAction",
        "EchoObservation",
        "EchoState",
    )
    assert issubclass(act, Action) and issubclass(obs, Observation) and issubclass(st_, State)
    three = {k: v for k, v in contract.schemas.items() if k != "snapshot"}  # its own model
    assert fingerprint(model_schemas(act, obs, st_)) == fingerprint(three)
    env = EchoEnv()
    env.reset()
    reply = env.step(contract.action(message="hello")).model_dump(mode="json")  # type: ignore[arg-type]
    decoded = obs.model_validate(reply)
    assert decoded.echoed_message == "hello"  # type: ignore[attr-defined]
    assert decoded.reward == pytest.approx(0.5)
    with pytest.raises(ValidationError):
        act(message="")  # min_length carried over

    class Rebuilt(Environment[act, obs, st_]):  # type: ignore[valid-type]
        pass

    assert Rebuilt.contract().fingerprint == fingerprint(three)  # echo's, but its snapshot


def test_contract_models_needs_all_three_schemas() -> None:
    schemas = EchoEnv.contract().schemas
    with pytest.raises(ValueError, match="state") as info:
        contract_models({"action": schemas["action"], "observation": schemas["observation"]})
    assert "GET /schema" in str(info.value)


def test_bad_input_gets_clear_errors() -> None:
    with pytest.raises(TypeError, match="JSON Schema dict"):
        model_from_schema("not a schema")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="BaseModel subclass"):
        model_from_schema({"type": "object"}, base=dict)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="not an object model"):
        model_from_schema({"type": "array", "items": {"type": "integer"}})


@pytest.mark.parametrize(
    "node",
    [
        {"not": {"type": "string"}},
        {"allOf": [{"type": "string"}, {"maxLength": 3}]},
        {"if": {"type": "string"}, "then": {"minLength": 1}},
        {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}},
        {"$ref": "https://example.com/other.json#/x"},
        {"$ref": "#/$defs/Missing"},
        {"type": "wat"},
        {"type": "string", "minLength": "three", "pattern": "([unclosed"},
        {"type": "integer", "minimum": "zero", "multipleOf": 0},
        {"type": "array", "minItems": -1, "uniqueItems": True, "items": {"type": "object"}},
        {"enum": [[1], {"a": 1}]},
        {"const": {"a": 1}},
        {"x-custom": {"deep": [1]}, "type": "string"},
        {"type": ["string", "null"]},
        {"type": "integer", "nullable": True},
        {"anyOf": [{"type": "null"}]},
        {"anyOf": [{"type": "string"}, {"not": {}}]},
        {"type": None, "x-what": {"$ref": "string"}},
        {"type": "string", "format": "email", "x-see": [{"$ref": "#/nowhere"}]},
    ],
)
def test_unmappable_keywords_never_crash(node: dict[str, Any]) -> None:
    schema = {"type": "object", "title": "Odd", "properties": {"f": node}}
    d = model_from_schema(schema)
    assert "f" in d.model_fields
    d.model_json_schema()


def test_what_maps_to_any() -> None:
    schema = {
        "type": "object",
        "title": "T",
        "properties": {
            "no": {"not": {"type": "string"}},
            "ext": {"$ref": "other.json#/x"},
            "typed_null": {"type": ["integer", "null"]},
            "nullable": {"type": "integer", "nullable": True},
        },
    }
    d = model_from_schema(schema)
    assert annotation(d, "no") is Any
    assert annotation(d, "ext") is Any
    assert annotation(d, "typed_null") == int | None
    assert annotation(d, "nullable") == int | None


_JSON_KEYS = st.sampled_from(
    [
        "type",
        "format",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "items",
        "prefixItems",
        "properties",
        "required",
        "additionalProperties",
        "propertyNames",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "uniqueItems",
        "default",
        "$ref",
        "discriminator",
        "nullable",
        "x-what",
        "title",
    ]
)
_JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(
        ["string", "integer", "number", "object", "array", "null", "date-time", "#", "#/$defs/A"]
    ),
)
_SCHEMA_NODES = st.recursive(
    st.dictionaries(_JSON_KEYS, _JSON_LEAVES, max_size=4),
    lambda inner: st.dictionaries(
        _JSON_KEYS,
        st.one_of(_JSON_LEAVES, inner, st.lists(inner, max_size=3), st.lists(_JSON_LEAVES)),
        max_size=4,
    ),
    max_leaves=10,
)


@CONTRACT_SETTINGS
@given(nodes=st.dictionaries(st.sampled_from(["a", "b", "c"]), _SCHEMA_NODES, max_size=3))
@example(nodes={"a": {"type": None, "default": {"$ref": "string"}}})
def test_random_schemas_never_crash(nodes: dict[str, Any]) -> None:
    schema = {
        "type": "object",
        "title": "Fuzz",
        "properties": nodes,
        "$defs": {"A": {"type": "object", "properties": dict(nodes)}},
    }
    d = model_from_schema(schema)
    assert set(d.model_fields) == set(nodes)
    d.model_json_schema()


# --- the key property -------------------------------------------------------------------------


@CONTRACT_SETTINGS
@given(data=st.data(), base=st.sampled_from([Action, Observation, State]))
def test_generated_models_round_trip_through_their_schema(data: st.DataObject, base: Any) -> None:
    model = data.draw(model_classes(base=base), label="model")
    schema = model.model_json_schema()
    for copy in (model_from_schema(schema), model_from_schema(schema, base=base)):
        assert copy.__name__ == model.__name__
        assert fingerprint({"m": copy.model_json_schema()}) == fingerprint({"m": schema})
        for _ in range(2):
            obj = data.draw(instances(model), label="instance")
            dumped = obj.model_dump(mode="json")
            assert copy.model_validate(dumped).model_dump(mode="json") == dumped
            assert copy.model_validate_json(obj.model_dump_json()).model_dump(mode="json") == dumped
    assert issubclass(model_from_schema(schema, base=base), base)


def test_the_property_holds_for_typing_optional_spellings() -> None:
    class Old(BaseModel):
        a: typing.Optional[typing.List[typing.Dict[str, int]]] = None  # noqa: UP006, UP045

    d = rebuilt(Old)
    dumped = Old(a=[{"k": 1}]).model_dump(mode="json")
    assert d.model_validate(dumped).model_dump(mode="json") == dumped
    assert same_fingerprint(Old, d)


def test_ndarray_fields_come_back_as_arrays() -> None:
    import numpy as np

    from corral.contract.arrays import Array, NDArray

    class Frame(Observation):
        pixels: NDArray
        board: Array(dtype="int8", shape=(2, None)) | None = None  # type: ignore[valid-type]

    d = rebuilt(Frame, base=Observation)
    frame = Frame(pixels=np.arange(6.0).reshape(2, 3), board=[[1, 2, 3], [4, 5, 6]])
    copy = d.model_validate(frame.model_dump(mode="json"))
    assert isinstance(copy.pixels, np.ndarray)  # type: ignore[attr-defined]
    assert np.array_equal(copy.pixels, frame.pixels)  # type: ignore[attr-defined]
    assert copy.board.dtype == np.int8  # type: ignore[attr-defined]
    assert copy.model_dump(mode="json") == frame.model_dump(mode="json")
    # Python mode keeps the arrays (the binary codec packs them as raw bytes).
    assert d.model_validate(frame.model_dump()).board.shape == (2, 3)  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="shape"):
        d.model_validate({"pixels": frame.pixels, "board": [[1, 2, 3]] * 3})
    assert same_fingerprint(Frame, d)

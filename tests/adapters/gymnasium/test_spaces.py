"""The Gymnasium space <-> contract type mapping, both directions, through both codecs."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import data_equivalence
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError, create_model

from corral.adapters.gymnasium.spaces import (
    DEFAULT_CHARSET,
    GYM_SPACE_KEY,
    INT_MAX,
    INT_MIN,
    OBSERVATION_BASE_FIELDS,
    SpaceConversionError,
    binding_for_schema,
    field_for_space,
    model_binding,
)
from corral.contract import Action, Observation
from corral.contract.arrays import Array
from corral.contract.dynamic import model_from_schema
from corral.protocol.codecs import get_codec

CODECS = ("msgpack", "json")


def _model(space: spaces.Space[Any]) -> tuple[type[BaseModel], Any]:
    annotation, binding = field_for_space(space, "Probe.value")
    return create_model("Probe", __base__=Observation, value=(annotation, ...)), binding


def _round_trip(model: type[BaseModel], instance: BaseModel, codec_name: str) -> BaseModel:
    codec = get_codec(codec_name)
    frame = codec.encode({"value": codec.dump(instance)})
    return codec.load(model, codec.decode(frame)["value"])


def _client_space(model: type[BaseModel]) -> Any:
    return model_binding(model.model_json_schema(), exclude=sorted(OBSERVATION_BASE_FIELDS))


LEAVES: list[spaces.Space[Any]] = [
    spaces.Discrete(5),
    spaces.Discrete(3, start=-2),
    spaces.Box(-1.0, 1.0, (3,), np.float32),
    spaces.Box(np.array([0.0, -np.inf]), np.array([np.inf, 5.0]), dtype=np.float64),
    spaces.Box(0, 255, (4, 4, 3), np.uint8),
    spaces.Box(-5, 5, (2,), np.int32),
    spaces.Box(-1.0, 1.0, (), np.float32),
    spaces.Box(0, 1, (3,), np.bool_),
    spaces.MultiDiscrete([3, 4, 5]),
    spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[0, 1], [-2, 3]], dtype=np.int32),
    spaces.MultiBinary(4),
    spaces.MultiBinary([2, 3]),
    spaces.Text(6),
    spaces.Text(5, min_length=5, charset="abc"),
    spaces.Text(10, min_length=0, charset="a-]^\\ ["),
]
COMPOSITES: list[spaces.Space[Any]] = [
    spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(0, 1, (2,))}),
    spaces.Dict({"bad-key": spaces.Discrete(2), "json": spaces.Discrete(3), "_x": spaces.Text(3)}),
    spaces.Dict({"outer": spaces.Dict({"inner": spaces.MultiBinary(2)})}),
    spaces.Tuple((spaces.Discrete(3), spaces.Text(4), spaces.Box(-1, 1, (1,)))),
    spaces.Sequence(spaces.Discrete(4)),
    spaces.Sequence(spaces.Box(0, 1, (2,), np.float32), stack=True),
    spaces.Sequence(spaces.Dict({"k": spaces.Discrete(2)})),
    spaces.Tuple((spaces.Dict({"p": spaces.Tuple((spaces.Discrete(2),))}),)),
]


@pytest.mark.parametrize("space", LEAVES + COMPOSITES, ids=repr)
@pytest.mark.parametrize("codec", CODECS)
def test_served_space_round_trips_exactly(space: spaces.Space[Any], codec: str) -> None:
    model, binding = _model(space)
    client = _client_space(model)
    assert client.space == space, "the schema must give back exactly the served space"
    space.seed(7)
    for _ in range(25):
        sample = space.sample()
        decoded = _round_trip(model, model(value=binding.from_gym(sample)), codec)
        again = client.to_gym(decoded)
        assert space.contains(again), f"{again!r} left {space}"
        assert data_equivalence(sample, again, exact=True), (sample, again)


def _space_strategy() -> st.SearchStrategy[spaces.Space[Any]]:
    leaves = st.sampled_from(LEAVES)
    keys = st.text(alphabet="abcxyz_-0", min_size=1, max_size=6)

    def extend(children: st.SearchStrategy[spaces.Space[Any]]) -> Any:
        return st.one_of(
            st.dictionaries(keys, children, min_size=1, max_size=3).map(spaces.Dict),
            st.lists(children, min_size=1, max_size=3).map(lambda xs: spaces.Tuple(tuple(xs))),
            children.map(spaces.Sequence),
        )

    return st.recursive(leaves, extend, max_leaves=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=_space_strategy(), seed=st.integers(0, 2**16), codec=st.sampled_from(CODECS))
def test_any_nesting_of_spaces_round_trips(space: spaces.Space[Any], seed: int, codec: str) -> None:
    model, binding = _model(space)
    client = _client_space(model)
    assert client.space == space
    space.seed(seed)
    sample = space.sample()
    decoded = _round_trip(model, model(value=binding.from_gym(sample)), codec)
    assert data_equivalence(sample, client.to_gym(decoded), exact=True)


def test_dynamic_client_models_decode_served_spaces() -> None:
    space = spaces.Dict(
        {"img": spaces.Box(0, 255, (2, 2), np.uint8), "t": spaces.Tuple((spaces.Discrete(3),))}
    )
    model, binding = _model(space)
    rebuilt = model_from_schema(model.model_json_schema())
    client = _client_space(rebuilt)
    assert client.space == space
    space.seed(1)
    sample = space.sample()
    for codec in CODECS:
        decoded = _round_trip(rebuilt, model(value=binding.from_gym(sample)), codec)
        assert data_equivalence(sample, client.to_gym(decoded), exact=True)


def test_array_samples_are_fresh_and_writable() -> None:
    model, _binding = _model(spaces.Box(0, 255, (2, 2), np.uint8))
    client = _client_space(model)
    frozen = np.frombuffer(bytes(4), dtype=np.uint8).reshape(2, 2)
    assert not frozen.flags.writeable
    sample = client.to_gym({"value": frozen})
    sample[0, 0] = 7  # a decoded zero-copy array is read-only; the sample must not be
    assert frozen[0, 0] == 0


def test_zero_dimensional_arrays_keep_their_shape() -> None:
    model, _binding = _model(spaces.Box(-1.0, 1.0, (), np.float32))
    for codec in CODECS:
        value = np.array(0.5, dtype=np.float32)
        decoded = _round_trip(model, model(value=value), codec)
        assert decoded.value.shape == ()  # type: ignore[attr-defined]


def test_schema_states_bounds_dtype_and_shape() -> None:
    box = spaces.Box(
        np.array([-1.0, 0.0], np.float32), np.array([1.0, np.inf], np.float32), dtype=np.float32
    )
    model, _ = _model(box)
    field = model.model_json_schema()["properties"]["value"]
    assert field["x-corral-ndarray"] == {"dtype": "<f4", "shape": [2]}
    assert field[GYM_SPACE_KEY] == {"type": "Box", "low": [-1.0, 0.0], "high": [1.0, None]}
    discrete, _ = _model(spaces.Discrete(4, start=1))
    schema = discrete.model_json_schema()["properties"]["value"]
    assert (schema["minimum"], schema["maximum"]) == (1, 4)
    text, _ = _model(spaces.Text(3, min_length=1, charset="ab"))
    schema = text.model_json_schema()["properties"]["value"]
    assert (schema["minLength"], schema["maxLength"], schema["pattern"]) == (1, 3, "^[ab]{1,3}$")


def test_discrete_field_rejects_values_outside_the_space() -> None:
    model, _ = _model(spaces.Discrete(3, start=1))
    assert model(value=3).value == 3  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="less than or equal to 3"):
        model(value=4)


@pytest.mark.parametrize(
    "space",
    [
        spaces.Graph(spaces.Box(0, 1, (2,)), None),
        spaces.OneOf([spaces.Discrete(2), spaces.Box(0, 1)]),
        spaces.Tuple(()),
        spaces.Dict({1: spaces.Discrete(2)}),  # type: ignore[dict-item]
    ],
    ids=["graph", "oneof", "empty-tuple", "int-key"],
)
def test_unservable_spaces_are_refused_with_the_path(space: spaces.Space[Any]) -> None:
    with pytest.raises(SpaceConversionError, match=r"Probe\.value"):
        field_for_space(space, "Probe.value")


# -- spaces inferred from schemas of ordinary corral models ---------------------------------


class Inner(BaseModel):
    name: str
    score: float = 0.0


class Wide(Action):
    flag: bool
    color: Literal["red", "green", "blue"]
    small: int = Field(ge=-2, le=2)
    big: int = Field(ge=0)
    free: int
    ratio: float = Field(ge=0.0, le=1.0)
    word: str = Field(pattern="^[a-c]{2,4}$")
    tag: str = Field(max_length=3)
    maybe: int | None = None
    either: int | str
    items: list[Inner]
    pair: tuple[int, bool]
    grid: Array("int8", (2, 2))  # type: ignore[valid-type]
    nested: Inner


def test_ordinary_models_map_to_spaces() -> None:
    binding = model_binding(Wide.model_json_schema(), max_text_length=64)
    space = binding.space
    assert isinstance(space, spaces.Dict)
    text = spaces.Text(64, min_length=0, charset=DEFAULT_CHARSET)
    expected = {
        "flag": spaces.Discrete(2),
        "color": spaces.Discrete(3),
        "small": spaces.Discrete(5, start=-2),
        "big": spaces.Box(0, INT_MAX, (), np.int64),
        "free": spaces.Box(INT_MIN, INT_MAX, (), np.int64),
        "ratio": spaces.Box(0.0, 1.0, (), np.float64),
        "word": spaces.Text(4, min_length=2, charset="abc"),
        "tag": spaces.Text(3, min_length=0, charset=DEFAULT_CHARSET),
        "maybe": spaces.OneOf([spaces.Box(INT_MIN, INT_MAX, (), np.int64), spaces.Discrete(1)]),
        "either": spaces.OneOf([spaces.Box(INT_MIN, INT_MAX, (), np.int64), text]),
        "items": spaces.Sequence(
            spaces.Dict({"name": text, "score": spaces.Box(-np.inf, np.inf, (), np.float64)})
        ),
        "pair": spaces.Tuple((spaces.Box(INT_MIN, INT_MAX, (), np.int64), spaces.Discrete(2))),
        "grid": spaces.Box(-128, 127, (2, 2), np.int8),
        "nested": spaces.Dict({"name": text, "score": spaces.Box(-np.inf, np.inf, (), np.float64)}),
    }
    assert dict(space.spaces) == expected


@pytest.mark.parametrize("codec", CODECS)
def test_ordinary_model_values_round_trip_through_samples(codec: str) -> None:
    binding = model_binding(Wide.model_json_schema(), max_text_length=64)
    action = Wide(
        flag=True,
        color="blue",
        small=-2,
        big=10,
        free=-3,
        ratio=0.25,
        word="abca",
        tag="x!",
        maybe=None,
        either="seven",
        items=[Inner(name="a", score=1.5)],
        pair=(4, False),
        grid=np.eye(2, dtype=np.int8),
        nested=Inner(name="n"),
    )
    decoded = _round_trip(Wide, action, codec)
    sample = binding.to_gym(decoded)
    assert binding.space.contains(sample)
    assert sample["color"] == 2 and sample["flag"] == 1
    assert sample["maybe"] == (1, 0) and sample["either"] == (1, "seven")
    back = Wide.model_validate(binding.from_gym(sample))
    assert back.model_dump(mode="json") == action.model_dump(mode="json")


def test_gym_samples_of_ordinary_models_are_valid_actions() -> None:
    binding = model_binding(Wide.model_json_schema(), max_text_length=8)
    binding.space.seed(3)
    for _ in range(20):
        sample = binding.space.sample()
        Wide.model_validate(binding.from_gym(sample))


def test_single_field_models_unwrap_to_the_field_space() -> None:
    class Guess(Action):
        guess: str = Field(json_schema_extra={"pattern": "^[A-Za-z]{5}$"})

    binding = model_binding(Guess.model_json_schema())
    assert binding.space == spaces.Text(5, min_length=5, charset=_letters())
    assert binding.from_gym("Crane") == {"guess": "Crane"}
    assert binding.to_gym({"guess": "crane"}) == "crane"


def _letters() -> str:
    import string

    return string.ascii_letters


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("^[abc]+$", spaces.Text(100, min_length=1, charset="abc")),
        ("^[a-e]*$", spaces.Text(100, min_length=0, charset="abcde")),
        ("^[x\\-y]{3}$", spaces.Text(3, min_length=3, charset="-xy")),
        ("^[ab]{2,}$", spaces.Text(100, min_length=2, charset="ab")),
        ("^[^ab]+$", spaces.Text(100, min_length=0, charset=DEFAULT_CHARSET)),
        ("^\\d+$", spaces.Text(100, min_length=0, charset=DEFAULT_CHARSET)),
        ("^[\\w]+$", spaces.Text(100, min_length=0, charset=DEFAULT_CHARSET)),
    ],
)
def test_text_patterns(pattern: str, expected: spaces.Text) -> None:
    binding = binding_for_schema({"type": "string", "pattern": pattern}, {}, "f", 100)
    assert binding.space == expected


class Loose(Observation):
    extra: dict[str, int]
    blob: bytes = b""
    anyshape: Array("float32", (None, 3)) = Field(default_factory=lambda: np.zeros((0, 3)))  # type: ignore[valid-type]
    fine: int = 0


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("extra", "free-form object"),
        ("blob", "bytes fields"),
        ("anyshape", "fixed dtype and shape"),
    ],
)
def test_fields_without_a_space_are_named(field: str, message: str) -> None:
    schema = Loose.model_json_schema()
    with pytest.raises(SpaceConversionError, match=rf"Loose\.{field}: .*{message}"):
        model_binding(schema, exclude=sorted(OBSERVATION_BASE_FIELDS), only=[field])


def test_only_keeps_the_named_fields_and_checks_them() -> None:
    schema = Loose.model_json_schema()
    binding = model_binding(schema, exclude=sorted(OBSERVATION_BASE_FIELDS), only=["fine"])
    assert binding.space == spaces.Box(INT_MIN, INT_MAX, (), np.int64)
    with pytest.raises(SpaceConversionError, match=r"no field\(s\) \['reward'\]"):
        model_binding(schema, exclude=sorted(OBSERVATION_BASE_FIELDS), only=["reward"])


def test_a_model_with_no_fields_has_no_space() -> None:
    with pytest.raises(SpaceConversionError, match="no fields"):
        model_binding(Observation.model_json_schema(), exclude=sorted(OBSERVATION_BASE_FIELDS))


def test_union_values_outside_every_branch_are_refused() -> None:
    binding = binding_for_schema({"anyOf": [{"type": "integer"}, {"type": "null"}]}, {}, "f")
    with pytest.raises(SpaceConversionError, match="matches no branch"):
        binding.to_gym("seven")
    enum = binding_for_schema({"enum": ["a", "b"]}, {}, "f")
    with pytest.raises(SpaceConversionError, match="not one of"):
        enum.to_gym("c")


def test_broken_references_are_reported() -> None:
    with pytest.raises(SpaceConversionError, match="cannot resolve"):
        binding_for_schema({"$ref": "#/$defs/Missing"}, {}, "f")
    with pytest.raises(SpaceConversionError, match="recursive"):
        binding_for_schema({"$ref": "#/$defs/A"}, {"A": {"$ref": "#/$defs/A"}}, "f")
    with pytest.raises(SpaceConversionError, match="malformed x-gym-space"):
        binding_for_schema({"type": "integer", GYM_SPACE_KEY: {"type": "Discrete"}}, {}, "f")
    with pytest.raises(SpaceConversionError, match="unknown x-gym-space type"):
        binding_for_schema({GYM_SPACE_KEY: {"type": "Graph"}}, {}, "f")

"""Gymnasium spaces and corral contract types, both ways.

Serving a Gymnasium environment (:func:`field_for_space`): each space becomes a pydantic
field type whose JSON Schema describes it, plus a :class:`Binding` that converts the
environment's samples into field values and back.

==================  =========================================================================
Gymnasium space     contract field type (and what the schema carries)
==================  =========================================================================
``Discrete``        ``int`` with ``minimum``/``maximum`` (``start`` .. ``start + n - 1``)
``Box``             ``Array(dtype, shape)``; bounds in ``x-gym-space`` (``null`` = infinite)
``MultiDiscrete``   ``Array(dtype, shape)``; ``nvec`` and ``start`` in ``x-gym-space``
``MultiBinary``     ``Array("int8", shape)``
``Text``            ``str`` with ``minLength``/``maxLength``/``pattern``; charset in ``x-gym-space``
``Dict``            a nested model with one field per key (the key is the field's alias)
``Tuple``           ``tuple[...]`` (``prefixItems``)
``Sequence``        ``list[...]``; ``stack`` in ``x-gym-space``
==================  =========================================================================

Using a remote environment as a Gymnasium one (:func:`binding_for_schema`): the space is
derived from the JSON Schema alone, so it works for any corral environment. Fields that
carry ``x-gym-space`` (a served Gymnasium environment) give back exactly the original
space. Other schemas are mapped as follows: ``boolean`` → ``Discrete(2)``; an ``enum`` →
``Discrete(len(enum))`` (the sample is the index of the value); ``integer`` with both
bounds → ``Discrete``, otherwise a scalar ``int64`` ``Box`` (open ends: :data:`INT_MIN`,
:data:`INT_MAX`); ``number`` → a scalar
``float64`` ``Box``; ``string`` → ``Text`` (a ``^[class]{m,n}$`` pattern gives its charset
and lengths, otherwise printable ASCII up to ``max_text_length``); an array field →
``Box``; a list → ``Sequence``; a tuple → ``Tuple``; an object with properties → ``Dict``;
a union → ``OneOf`` whose ``null`` branch is ``Discrete(1)``. Anything else (free-form
objects, bytes, arrays of unknown shape) raises :class:`SpaceConversionError` naming the field.

One module (~800 lines) because the two directions are one table: each space kind's field
type, its binding and its inverse sit side by side so that they cannot drift apart.
"""

from __future__ import annotations

import keyword
import re
import string
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import annotated_types
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array, iterate
from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, create_model
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from corral.contract.arrays import Array
from corral.contract.models import Observation, WireModel
from corral.contract.refs import RefError, SchemaReader
from corral.errors import UsageError

GYM_SPACE_KEY = "x-gym-space"
"""The JSON Schema keyword carrying what standard keywords cannot say about a space."""

OBSERVATION_BASE_FIELDS = frozenset(Observation.model_fields)
"""Observation fields that Gymnasium returns outside the observation (and in ``info``):
the base class's (``done``, ``truncated``, ``reward``, ``reward_components``, ``metadata``)."""

DEFAULT_MAX_TEXT_LENGTH = 4096
"""``Text.max_length`` for string fields whose schema gives no ``maxLength``."""

DEFAULT_CHARSET = string.printable
"""``Text`` charset for string fields whose schema pattern gives no character class."""

INT_MIN = int(np.iinfo(np.int64).min)
INT_MAX = int(np.iinfo(np.int64).max) - 1
"""The bounds of an integer field without ``minimum``/``maximum``: the widest int64 range
``Box.sample`` handles (it computes ``high + 1``)."""

_MAX_DISCRETE = 2**62
"""Bounded integers wider than this stay a ``Box``: ``Discrete.n`` must fit in int64."""


class SpaceConversionError(UsageError, ValueError):
    """A space or schema has no counterpart on the other side; the message says where."""


# -- bindings: a space plus the conversions between its samples and field values --------


class Binding(ABC):
    """A Gymnasium space and the conversions between its samples and contract values.

    ``to_gym`` takes what a model dump holds (python mode, by alias; arrays may also
    arrive as wire dicts or nested lists) and returns a sample of :attr:`space`;
    ``from_gym`` takes a sample and returns a value the contract field validates.
    """

    space: spaces.Space[Any]

    @abstractmethod
    def to_gym(self, value: Any) -> Any:
        """The sample of :attr:`space` for the contract value ``value``."""

    @abstractmethod
    def from_gym(self, sample: Any) -> Any:
        """The contract value for the sample ``sample``."""

    @abstractmethod
    def accepts(self, value: Any) -> bool:
        """True when ``value`` has this binding's kind (picks the branch of a union)."""


@dataclass
class DiscreteBinding(Binding):
    """``Discrete``: an integer, or the index of one of ``values`` (enums, booleans)."""

    space: spaces.Discrete
    values: tuple[Any, ...] | None = None

    def to_gym(self, value: Any) -> Any:
        if self.values is None:
            return np.int64(value)
        for index, candidate in enumerate(self.values):
            if type(candidate) is type(value) and candidate == value:
                return np.int64(index)
        raise SpaceConversionError(f"{value!r} is not one of {list(self.values)}")

    def from_gym(self, sample: Any) -> Any:
        index = int(sample)
        return index if self.values is None else self.values[index]

    def accepts(self, value: Any) -> bool:
        if self.values is not None:
            return any(type(v) is type(value) and v == value for v in self.values)
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclass
class ArrayBinding(Binding):
    """``Box``, ``MultiDiscrete`` and ``MultiBinary``: an ndarray of the space's dtype."""

    space: spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary

    def to_gym(self, value: Any) -> Any:
        dtype = self.space.dtype
        array = _array(value)
        # A fresh, writable array: users keep what step() returns, and a decoded
        # zero-copy array is read-only.
        return np.array(array, dtype=dtype, copy=True).reshape(self.space.shape)

    def from_gym(self, sample: Any) -> Any:
        return np.asarray(sample, dtype=self.space.dtype)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (np.ndarray, list, dict))


@dataclass
class ScalarBinding(Binding):
    """A JSON number or unbounded integer as a 0-d ``Box``."""

    space: spaces.Box

    def to_gym(self, value: Any) -> Any:
        return np.array(value, dtype=self.space.dtype)

    def from_gym(self, sample: Any) -> Any:
        item = np.asarray(sample).item()
        return int(item) if np.issubdtype(self.space.dtype, np.integer) else float(item)

    def accepts(self, value: Any) -> bool:
        if isinstance(value, (bool, np.bool_)):
            return False
        if np.issubdtype(self.space.dtype, np.integer):
            return isinstance(value, (int, np.integer))
        return isinstance(value, (int, float, np.integer, np.floating))


@dataclass
class TextBinding(Binding):
    """``Text``: a string."""

    space: spaces.Text

    def to_gym(self, value: Any) -> Any:
        return str(value)

    def from_gym(self, sample: Any) -> Any:
        return str(sample)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)


@dataclass
class NullBinding(Binding):
    """The ``null`` branch of a union: ``Discrete(1)``, whose only sample is 0."""

    space: spaces.Discrete = field(default_factory=lambda: spaces.Discrete(1))

    def to_gym(self, value: Any) -> Any:
        return np.int64(0)

    def from_gym(self, sample: Any) -> Any:
        return None

    def accepts(self, value: Any) -> bool:
        return value is None


@dataclass
class DictBinding(Binding):
    """``Dict``: a mapping keyed like the model's aliases (the space's keys)."""

    space: spaces.Dict
    fields: dict[str, Binding]

    def to_gym(self, value: Any) -> Any:
        mapping = _mapping(value)
        missing = [key for key in self.fields if key not in mapping]
        if missing:
            raise SpaceConversionError(f"missing key(s) {missing} for {self.space}")
        return {key: binding.to_gym(mapping[key]) for key, binding in self.fields.items()}

    def from_gym(self, sample: Any) -> Any:
        return {key: binding.from_gym(sample[key]) for key, binding in self.fields.items()}

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (Mapping, BaseModel))


@dataclass
class TupleBinding(Binding):
    """``Tuple``: a fixed-length sequence, one binding per position."""

    space: spaces.Tuple[Any]
    items: tuple[Binding, ...]

    def to_gym(self, value: Any) -> Any:
        values = list(value)
        if len(values) != len(self.items):
            raise SpaceConversionError(
                f"expected {len(self.items)} items for {self.space}, got {len(values)}"
            )
        return tuple(binding.to_gym(v) for binding, v in zip(self.items, values, strict=True))

    def from_gym(self, sample: Any) -> Any:
        return tuple(binding.from_gym(s) for binding, s in zip(self.items, sample, strict=True))

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (list, tuple)) and len(value) == len(self.items)


@dataclass
class SequenceBinding(Binding):
    """``Sequence``: a list of any length; stacked into one array when ``stack`` is set."""

    space: spaces.Sequence
    item: Binding

    def to_gym(self, value: Any) -> Any:
        items = [self.item.to_gym(v) for v in value]
        if not self.space.stack:
            return tuple(items)
        feature = self.space.feature_space
        out: Any = create_empty_array(feature, n=len(items))
        return concatenate(feature, items, out)

    def from_gym(self, sample: Any) -> Any:
        if self.space.stack:
            sample = iterate(self.space.stacked_feature_space, sample)
        return [self.item.from_gym(s) for s in sample]

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (list, tuple))


@dataclass
class OneOfBinding(Binding):
    """``OneOf``: a union; the sample is ``(branch index, branch sample)``."""

    space: spaces.OneOf[Any]
    branches: tuple[Binding, ...]

    def to_gym(self, value: Any) -> Any:
        for index, branch in enumerate(self.branches):
            if branch.accepts(value):
                return (index, branch.to_gym(value))
        raise SpaceConversionError(f"{value!r} matches no branch of {self.space}")

    def from_gym(self, sample: Any) -> Any:
        index, inner = sample
        return self.branches[int(index)].from_gym(inner)

    def accepts(self, value: Any) -> bool:
        return any(branch.accepts(value) for branch in self.branches)


@dataclass
class ModelBinding(Binding):
    """A whole contract model (action or observation) as one space.

    A model with a single field is that field's space (a served Gymnasium environment's
    ``action``/``observation``, or e.g. Wordle's ``guess``); a model with several fields
    is a ``Dict`` of them. ``to_gym`` takes the model's dump, ``from_gym`` returns the
    dict to validate the model from.
    """

    space: spaces.Space[Any]
    fields: dict[str, Binding]

    @property
    def single(self) -> str | None:
        """The field name when the model has exactly one field, else None."""
        return next(iter(self.fields)) if len(self.fields) == 1 else None

    def to_gym(self, value: Any) -> Any:
        mapping = _mapping(value)
        name = self.single
        if name is not None:
            return self.fields[name].to_gym(mapping[name])
        return {key: binding.to_gym(mapping[key]) for key, binding in self.fields.items()}

    def from_gym(self, sample: Any) -> Any:
        name = self.single
        if name is not None:
            return {name: self.fields[name].from_gym(sample)}
        return {key: binding.from_gym(sample[key]) for key, binding in self.fields.items()}

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (Mapping, BaseModel))


def _mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, BaseModel):
        dumped: dict[str, Any] = value.model_dump(mode="python", by_alias=True)
        return dumped
    if isinstance(value, Mapping):
        return value
    raise SpaceConversionError(f"expected a mapping or a model, got {type(value).__name__}")


def _array(value: Any) -> np.ndarray[Any, Any]:
    if isinstance(value, dict):
        from corral.contract.arrays import ArraySpec

        return ArraySpec().validate(value)
    return np.asarray(value)


# -- describing spaces in JSON ------------------------------------------------------------


def _bound_list(values: np.ndarray[Any, Any]) -> Any:
    """A bound array in JSON: one number when uniform, nested lists otherwise; inf is null."""
    flat = values.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return _bound_item(flat[0])
    return _nested(values.tolist())


def _bound_item(value: Any) -> Any:
    item = value.item() if hasattr(value, "item") else value
    if isinstance(item, float) and not np.isfinite(item):
        return None
    return item


def _nested(value: Any) -> Any:
    if isinstance(value, list):
        return [_nested(v) for v in value]
    return _bound_item(value)


def _bound_array(value: Any, shape: tuple[int, ...], dtype: np.dtype[Any], sign: float) -> Any:
    """Rebuild a bound written by :func:`_bound_list`; ``sign`` is the infinity for null."""

    def fill(v: Any) -> Any:
        if isinstance(v, list):
            return [fill(x) for x in v]
        return sign * np.inf if v is None else v

    raw = np.asarray(fill(value), dtype=np.float64 if dtype.kind == "f" else None)
    return np.broadcast_to(raw, shape).astype(dtype)


def describe_space(space: spaces.Space[Any]) -> dict[str, Any]:
    """The ``x-gym-space`` description of a leaf space (what standard keywords miss)."""
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {"type": "Box", "low": _bound_list(space.low), "high": _bound_list(space.high)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": _bound_list(space.nvec),
            "start": _bound_list(space.start),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": [int(n) for n in np.atleast_1d(space.n)]}
    if isinstance(space, spaces.Text):
        return {
            "type": "Text",
            "min_length": space.min_length,
            "max_length": space.max_length,
            "charset": "".join(sorted(space.character_set)),
        }
    if isinstance(space, spaces.Sequence):
        return {"type": "Sequence", "stack": space.stack}
    raise SpaceConversionError(f"{space} is not a leaf space")


def _char_class(charset: str) -> str:
    return "".join("\\" + c if c in "\\]^-[" else c for c in charset)


class GymSchema:
    """Adds ``x-gym-space`` (and any other keywords) to a type's JSON Schema."""

    def __init__(self, extra: dict[str, Any]) -> None:
        self.extra = extra

    def __repr__(self) -> str:
        return f"GymSchema({self.extra!r})"

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = dict(handler(schema))
        json_schema.update(self.extra)
        return json_schema


class GymDictModel(WireModel):
    """Base of the models generated for ``Dict`` spaces: the space's keys are aliases."""

    model_config = ConfigDict(
        extra="forbid", serialize_by_alias=True, validate_by_alias=True, validate_by_name=True
    )


def _field_name(key: str, index: int) -> str:
    safe = (
        key.isidentifier()
        and not keyword.iskeyword(key)
        and not key.startswith("_")
        and not hasattr(BaseModel, key)
    )
    return key if safe else f"field_{index}"


# -- serving side: space -> field type ----------------------------------------------------


def field_for_space(space: spaces.Space[Any], path: str) -> tuple[Any, Binding]:
    """The contract field type for ``space`` and the binding of its samples.

    Args:
        space: a Gymnasium space (see the module docstring for the supported kinds).
        path: where the space sits (``"Observation.observation.position"``); it names
            generated models and appears in errors.

    Raises:
        SpaceConversionError: for a space with no contract counterpart (``Graph``, ``OneOf``,
            custom spaces), naming ``path``.
    """
    gym_schema = GymSchema({GYM_SPACE_KEY: describe_space(space)}) if _is_leaf(space) else None
    if isinstance(space, spaces.Discrete):
        low, high = int(space.start), int(space.start + space.n - 1)
        annotation: Any = Annotated[
            int, annotated_types.Ge(low), annotated_types.Le(high), gym_schema
        ]
        return annotation, DiscreteBinding(space)
    if isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
        dtype = space.dtype
        assert dtype is not None
        annotation = Annotated[Array(dtype.str, space.shape), gym_schema]
        return annotation, ArrayBinding(space)
    if isinstance(space, spaces.Text):
        charset = "".join(sorted(space.character_set))
        extra = {
            GYM_SPACE_KEY: describe_space(space),
            "pattern": f"^[{_char_class(charset)}]{{{space.min_length},{space.max_length}}}$",
        }
        annotation = Annotated[
            str,
            annotated_types.MinLen(space.min_length),
            annotated_types.MaxLen(space.max_length),
            GymSchema(extra),
        ]
        return annotation, TextBinding(space)
    if isinstance(space, spaces.Dict):
        return _dict_field(space, path)
    if isinstance(space, spaces.Tuple):
        if not space.spaces:
            raise SpaceConversionError(f"{path}: an empty Tuple space has no contract counterpart")
        parts = [field_for_space(s, f"{path}[{i}]") for i, s in enumerate(space.spaces)]
        annotation = tuple.__class_getitem__(tuple(a for a, _ in parts))
        return annotation, TupleBinding(space, tuple(b for _, b in parts))
    if isinstance(space, spaces.Sequence):
        item_type, item = field_for_space(space.feature_space, f"{path}[]")
        return Annotated[list[item_type], gym_schema], SequenceBinding(space, item)  # type: ignore[valid-type]
    raise SpaceConversionError(
        f"{path}: {type(space).__name__} spaces cannot be served; use Discrete, Box, "
        "MultiDiscrete, MultiBinary, Text, Dict, Tuple or Sequence"
    )


def _is_leaf(space: spaces.Space[Any]) -> bool:
    return isinstance(
        space,
        (
            spaces.Discrete,
            spaces.Box,
            spaces.MultiDiscrete,
            spaces.MultiBinary,
            spaces.Text,
            spaces.Sequence,
        ),
    )


def _dict_field(space: spaces.Dict, path: str) -> tuple[Any, Binding]:
    definitions: dict[str, Any] = {}
    bindings: dict[str, Binding] = {}
    for index, (key, subspace) in enumerate(space.spaces.items()):
        if not isinstance(key, str):
            raise SpaceConversionError(
                f"{path}: Dict keys must be strings to cross the wire, got {key!r}"
            )
        annotation, binding = field_for_space(subspace, f"{path}.{key}")
        definitions[_field_name(key, index)] = (annotation, Field(alias=key))
        bindings[key] = binding
    model_name = "".join(part.capitalize() for part in re.split(r"[^0-9A-Za-z]+", path) if part)
    model = create_model(model_name or "GymDict", __base__=GymDictModel, **definitions)
    return model, DictBinding(space, bindings)


# -- client side: JSON Schema -> space ----------------------------------------------------


@dataclass(frozen=True)
class _Context:
    defs: Mapping[str, Any]
    max_text_length: int


def model_binding(
    schema: Mapping[str, Any],
    *,
    exclude: Sequence[str] = (),
    only: Sequence[str] | None = None,
    max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
) -> ModelBinding:
    """The space of a whole model from its JSON Schema (see :class:`ModelBinding`).

    Args:
        schema: the model's JSON Schema (``model_json_schema()`` or ``/schema``).
        exclude: fields left out of the space (an observation's base fields).
        only: keep just these fields (in this order); must not name excluded ones.
        max_text_length: ``Text.max_length`` for strings without ``maxLength``.

    Raises:
        SpaceConversionError: a field has no Gymnasium counterpart, or ``only`` names an unknown
            or excluded field, or no field is left.
    """
    ctx = _Context(schema.get("$defs", {}), max_text_length)
    properties: Mapping[str, Any] = schema.get("properties", {})
    title = schema.get("title", "model")
    names = [name for name in properties if name not in exclude]
    if only is not None:
        unknown = [name for name in only if name not in names]
        if unknown:
            raise SpaceConversionError(
                f"{title} has no field(s) {unknown} to put in the space; choose from {names}"
            )
        names = list(only)
    if not names:
        raise SpaceConversionError(f"{title} has no fields to make a space from")
    fields = {
        name: binding_for_schema(properties[name], ctx.defs, f"{title}.{name}", max_text_length)
        for name in names
    }
    if len(fields) == 1:
        space: spaces.Space[Any] = next(iter(fields.values())).space
    else:
        space = spaces.Dict({name: b.space for name, b in fields.items()}, sort_keys=False)
    return ModelBinding(space, fields)


def binding_for_schema(
    schema: Mapping[str, Any],
    defs: Mapping[str, Any],
    path: str,
    max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
) -> Binding:
    """The binding of one field from its JSON Schema (``defs``: the root's ``$defs``).

    Raises:
        SpaceConversionError: the schema has no Gymnasium counterpart; the message names ``path``.
    """
    return _binding(schema, _Context(defs, max_text_length), path)


def _resolve(schema: Mapping[str, Any], ctx: _Context, path: str) -> Mapping[str, Any]:
    """``schema`` with its references followed (one rule: :mod:`corral.contract.refs`).

    Raises:
        SpaceConversionError: a reference does not resolve, or references form a cycle.
    """
    try:
        return SchemaReader.of_defs(ctx.defs).deref(schema)
    except RefError as exc:
        if exc.kind == "cycle":
            raise SpaceConversionError(
                f"{path}: recursive schema references have no Gymnasium space ({exc})"
            ) from None
        raise SpaceConversionError(f"{path}: cannot resolve schema reference: {exc}") from None


def _binding(schema: Mapping[str, Any], ctx: _Context, path: str) -> Binding:
    schema = _resolve(schema, ctx, path)
    gym = schema.get(GYM_SPACE_KEY)
    if isinstance(gym, Mapping):
        return _exact(schema, gym, ctx, path)
    ndarray = schema.get("x-corral-ndarray")
    if isinstance(ndarray, Mapping):
        return _box_from_ndarray(ndarray, path)
    for union_key in ("anyOf", "oneOf"):
        if union_key in schema:
            return _union([_resolve(s, ctx, path) for s in schema[union_key]], ctx, path)
    if "enum" in schema or "const" in schema:
        values = tuple(schema["enum"]) if "enum" in schema else (schema["const"],)
        if not values:
            raise SpaceConversionError(f"{path}: an empty enum has no Gymnasium space")
        return DiscreteBinding(spaces.Discrete(len(values)), values)
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([{**schema, "type": k} for k in kind], ctx, path)
    if kind == "null":
        return NullBinding()
    if kind == "boolean":
        return DiscreteBinding(spaces.Discrete(2), (False, True))
    if kind == "integer":
        return _integer(schema)
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum", -np.inf))
        high = schema.get("maximum", schema.get("exclusiveMaximum", np.inf))
        return ScalarBinding(spaces.Box(float(low), float(high), shape=(), dtype=np.float64))
    if kind == "string":
        if schema.get("format") in ("binary", "base64", "base64url") or "contentEncoding" in schema:
            raise SpaceConversionError(
                f"{path}: bytes fields have no Gymnasium space; send text or an array"
            )
        return TextBinding(_text(schema, ctx.max_text_length))
    if kind == "array":
        return _array_binding(schema, ctx, path)
    if kind == "object":
        return _object(schema, ctx, path)
    raise SpaceConversionError(f"{path}: schema {dict(schema)!r} has no Gymnasium space")


def _integer(schema: Mapping[str, Any]) -> Binding:
    low = schema.get("minimum")
    if low is None and "exclusiveMinimum" in schema:
        low = int(schema["exclusiveMinimum"]) + 1
    high = schema.get("maximum")
    if high is None and "exclusiveMaximum" in schema:
        high = int(schema["exclusiveMaximum"]) - 1
    if low is not None and high is not None and 0 <= high - low < _MAX_DISCRETE:
        return DiscreteBinding(spaces.Discrete(int(high - low + 1), start=int(low)))
    return ScalarBinding(
        spaces.Box(
            INT_MIN if low is None else int(low),
            INT_MAX if high is None else int(high),
            shape=(),
            dtype=np.int64,
        )
    )


_PATTERN = re.compile(r"^\^\[(?P<cls>(?:\\.|[^\]\\])+)\](?P<q>\*|\+|\{\d+\}|\{\d+,\d*\})?\$$")


def _parse_class(body: str) -> str | None:
    """The characters of a regex character class body, or None if it is not simple."""
    if body.startswith("^"):
        return None
    chars: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 >= len(body) or body[i + 1].isalnum():
                return None  # \d, \w, \s ... are not simple characters
            c = body[i + 1]
            i += 1
        if i + 2 < len(body) and body[i + 1] == "-" and body[i + 2] != "\\":
            start, end = ord(c), ord(body[i + 2])
            if end < start:
                return None
            chars.extend(chr(o) for o in range(start, end + 1))
            i += 3
            continue
        chars.append(c)
        i += 1
    return "".join(sorted(set(chars)))


def _text(schema: Mapping[str, Any], max_text_length: int) -> spaces.Text:
    min_length = int(schema.get("minLength", 0))
    max_length = schema.get("maxLength")
    charset: str | None = None
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and (match := _PATTERN.match(pattern)):
        charset = _parse_class(match["cls"])
        quantifier = match["q"] or "{1}"
        if charset is not None and quantifier == "+":
            min_length = max(min_length, 1)
        elif charset is not None and quantifier.startswith("{"):
            low, _, high = quantifier[1:-1].partition(",")
            min_length = max(min_length, int(low))
            if not _:
                high = low
            if high:
                max_length = min(int(high), max_length) if max_length is not None else int(high)
    if max_length is None:
        max_length = max(max_text_length, min_length)
    return spaces.Text(int(max_length), min_length=min_length, charset=charset or DEFAULT_CHARSET)


def _box_from_ndarray(info: Mapping[str, Any], path: str) -> Binding:
    dtype_str, shape = info.get("dtype"), info.get("shape")
    if dtype_str is None or shape is None or any(n is None for n in shape):
        raise SpaceConversionError(
            f"{path}: an array field needs a fixed dtype and shape to have a Gymnasium space; "
            "declare it as Array(dtype, shape)"
        )
    dtype = np.dtype(dtype_str)
    dims = tuple(int(n) for n in shape)
    if dtype.kind == "b":
        return ArrayBinding(spaces.Box(0, 1, shape=dims, dtype=dtype))
    if dtype.kind in "iu":
        info_ = np.iinfo(dtype)
        return ArrayBinding(spaces.Box(info_.min, info_.max, shape=dims, dtype=dtype))
    if dtype.kind == "f":
        return ArrayBinding(spaces.Box(-np.inf, np.inf, shape=dims, dtype=dtype))
    raise SpaceConversionError(f"{path}: arrays of dtype {dtype} have no Gymnasium space")


_EXACT_KINDS = frozenset({"Discrete", "Text", "Sequence", "Box", "MultiDiscrete", "MultiBinary"})


def _exact(schema: Mapping[str, Any], gym: Mapping[str, Any], ctx: _Context, path: str) -> Binding:
    """Rebuild the space a served Gymnasium environment described."""
    kind = gym.get("type")
    if kind not in _EXACT_KINDS:
        raise SpaceConversionError(f"{path}: unknown {GYM_SPACE_KEY} type {kind!r}")
    try:
        if kind == "Discrete":
            return DiscreteBinding(spaces.Discrete(int(gym["n"]), start=int(gym.get("start", 0))))
        if kind == "Text":
            return TextBinding(
                spaces.Text(
                    int(gym["max_length"]),
                    min_length=int(gym.get("min_length", 1)),
                    charset=str(gym["charset"]),
                )
            )
        if kind == "Sequence":
            item = _binding(schema.get("items", {}), ctx, f"{path}[]")
            return SequenceBinding(spaces.Sequence(item.space, stack=bool(gym.get("stack"))), item)
        ndarray = schema.get("x-corral-ndarray") or {}
        dtype = np.dtype(ndarray["dtype"])
        shape = tuple(int(n) for n in ndarray["shape"])
        if kind == "Box":
            low = _bound_array(gym["low"], shape, dtype, -1.0)
            high = _bound_array(gym["high"], shape, dtype, 1.0)
            return ArrayBinding(spaces.Box(low, high, shape=shape, dtype=dtype))
        if kind == "MultiDiscrete":
            nvec = _bound_array(gym["nvec"], shape, dtype, 1.0)
            start = _bound_array(gym.get("start", 0), shape, dtype, 1.0)
            return ArrayBinding(spaces.MultiDiscrete(nvec, dtype=dtype, start=start))
        if kind == "MultiBinary":
            n = [int(v) for v in gym["n"]]
            return ArrayBinding(spaces.MultiBinary(n[0] if len(n) == 1 else n))
    except (KeyError, TypeError, ValueError) as exc:
        raise SpaceConversionError(
            f"{path}: malformed {GYM_SPACE_KEY} {dict(gym)!r}: {exc}"
        ) from None
    raise AssertionError(f"unhandled {GYM_SPACE_KEY} type {kind!r}")  # pragma: no cover


def _union(options: list[Mapping[str, Any]], ctx: _Context, path: str) -> Binding:
    if not options:
        raise SpaceConversionError(f"{path}: an empty union has no Gymnasium space")
    branches = tuple(_binding(option, ctx, f"{path}|{i}") for i, option in enumerate(options))
    if len(branches) == 1:
        return branches[0]
    return OneOfBinding(spaces.OneOf([b.space for b in branches]), branches)


def _array_binding(schema: Mapping[str, Any], ctx: _Context, path: str) -> Binding:
    prefix = schema.get("prefixItems")
    if prefix:
        items = tuple(_binding(s, ctx, f"{path}[{i}]") for i, s in enumerate(prefix))
        return TupleBinding(spaces.Tuple([b.space for b in items]), items)
    item = _binding(schema.get("items", {}), ctx, f"{path}[]")
    return SequenceBinding(spaces.Sequence(item.space), item)


def _object(schema: Mapping[str, Any], ctx: _Context, path: str) -> Binding:
    properties: Mapping[str, Any] = schema.get("properties") or {}
    if not properties:
        raise SpaceConversionError(
            f"{path}: a free-form object (dict) has no Gymnasium space; give it a model with "
            "fields, or leave the field out of the space"
        )
    fields = {name: _binding(sub, ctx, f"{path}.{name}") for name, sub in properties.items()}
    space = spaces.Dict({name: b.space for name, b in fields.items()}, sort_keys=False)
    return DictBinding(space, fields)

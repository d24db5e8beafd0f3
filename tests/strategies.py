"""Hypothesis strategies for corral contracts: random model classes and their instances.

For codec, schema and protocol property tests that must hold for *any* contract, not only
the handful of example environments::

    from hypothesis import given
    from tests.strategies import CONTRACT_SETTINGS, models_and_instances

    @CONTRACT_SETTINGS
    @given(models_and_instances(base=Observation))
    def test_json_round_trip(pair):
        cls, obj = pair
        assert cls.model_validate_json(obj.model_dump_json()) == obj

- :func:`model_classes` draws pydantic model classes derived from corral's ``Action``,
  ``Observation`` or ``State`` (or any ``WireModel``). Field types are drawn from ``str``,
  ``int`` (up to ±2**63), ``float`` (huge, tiny, subnormal, ``-0.0``; never NaN or
  infinite), ``bool``, ``bytes``, ``datetime`` (naive and with fixed offsets),
  ``Literal[...]``, generated ``Enum`` classes, and, nested up to ``max_depth``,
  ``Optional[X]``, ``list[X]``, ``dict[str, X]`` and generated nested models. Fields
  have no default, a drawn default, or an empty-container ``default_factory``.
- :func:`instances` draws valid instances of a model class: the generated ones, and any
  model made of the types above plus ``Any``, ``date``, ``time``, ``timedelta``, ``UUID``,
  ``set``/``frozenset``/``tuple`` and length or bound constraints (``EchoAction`` works).
  Text covers all of Unicode but surrogates, astral characters and ``""`` included.
- :func:`models_and_instances` draws a class and one of its instances.
- :func:`values` is the per-type strategy :func:`instances` is built from.

Generating a class per example is slower than generating data: use
:data:`CONTRACT_SETTINGS` (the suite's profile decides how many examples: see
``tests/conftest.py``).
Nested models derive from :class:`corral.contract.WireModel` by default, because a plain
``BaseModel`` dumps ``bytes`` as UTF-8 text and cannot carry arbitrary bytes in JSON.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import itertools
import keyword
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import annotated_types
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo

from corral.contract import Action, Observation, State, WireModel

__all__ = [
    "CONTRACT_SETTINGS",
    "INT64_MAX",
    "INT64_MIN",
    "instances",
    "json_values",
    "model_classes",
    "models_and_instances",
    "text",
    "values",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63
"""Integers are drawn from ``[INT64_MIN, INT64_MAX]``: what msgpack and orjson both carry."""

CONTRACT_SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
"""Settings for tests drawing model classes: no per-example deadline, no slowness checks
(the number of examples comes from the profile: ``--long`` for the full run)."""

_ASTRAL = st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF)
_ANY_CHAR = st.characters(blacklist_categories=("Cs",))


def text(min_size: int = 0, max_size: int | None = 20) -> st.SearchStrategy[str]:
    """Unicode text without surrogates; often with astral characters, often empty."""
    return st.one_of(
        st.text(_ANY_CHAR, min_size=min_size, max_size=max_size),
        st.text(_ASTRAL, min_size=min_size, max_size=max_size),
        st.text(st.sampled_from('aé€😀\x00\n"\\𝄞'), min_size=min_size, max_size=max_size),
    )


_FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 1e16]),
)
_INTS = st.one_of(
    st.integers(INT64_MIN, INT64_MAX),
    st.sampled_from([0, -1, INT64_MIN, INT64_MAX, 2**53 + 1, 2**32]),
)
# pydantic-core cannot match a multi-member int Literal/Enum against a value above int64.
_CHOICE_INTS = st.integers(INT64_MIN, INT64_MAX - 1)
_OFFSETS = st.sampled_from(
    [dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(-dt.timedelta(hours=8))]
)


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """JSON-compatible values (what a ``dict[str, Any]`` field such as ``metadata`` holds)."""
    leaves = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, text())
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(text(max_size=8), inner, max_size=3)
        ),
        max_leaves=max_leaves,
    )


# --- values of a type --------------------------------------------------------------------------


@dataclasses.dataclass
class _Bounds:
    min_len: int | None = None
    max_len: int | None = None
    ge: Any = None
    le: Any = None
    gt: Any = None
    lt: Any = None

    @classmethod
    def of(cls, metadata: typing.Iterable[Any]) -> _Bounds:
        bounds = cls()
        for m in metadata:
            if isinstance(m, annotated_types.MinLen):
                bounds.min_len = m.min_length
            elif isinstance(m, annotated_types.MaxLen):
                bounds.max_len = m.max_length
            elif isinstance(m, annotated_types.Ge):
                bounds.ge = m.ge
            elif isinstance(m, annotated_types.Le):
                bounds.le = m.le
            elif isinstance(m, annotated_types.Gt):
                bounds.gt = m.gt
            elif isinstance(m, annotated_types.Lt):
                bounds.lt = m.lt
        return bounds

    def sizes(self, cap: int) -> tuple[int, int]:
        low = self.min_len or 0
        return low, max(low, min(cap, self.max_len if self.max_len is not None else cap))


def _ints(bounds: _Bounds) -> st.SearchStrategy[int]:
    low = bounds.ge if bounds.ge is not None else INT64_MIN
    high = bounds.le if bounds.le is not None else INT64_MAX
    if bounds.gt is not None:
        low = max(low, bounds.gt + 1)
    if bounds.lt is not None:
        high = min(high, bounds.lt - 1)
    return st.integers(low, high)


def _floats(bounds: _Bounds) -> st.SearchStrategy[float]:
    if all(b is None for b in (bounds.ge, bounds.le, bounds.gt, bounds.lt)):
        return _FLOATS
    return st.floats(
        min_value=bounds.gt if bounds.gt is not None else bounds.ge,
        max_value=bounds.lt if bounds.lt is not None else bounds.le,
        exclude_min=bounds.gt is not None,
        exclude_max=bounds.lt is not None,
        allow_nan=False,
        allow_infinity=False,
    )


_SIMPLE: dict[Any, Callable[[_Bounds], st.SearchStrategy[Any]]] = {
    type(None): lambda b: st.none(),
    bool: lambda b: st.booleans(),
    int: _ints,
    float: _floats,
    str: lambda b: text(*b.sizes(20)),
    bytes: lambda b: st.binary(min_size=b.sizes(24)[0], max_size=b.sizes(24)[1]),
    dt.datetime: lambda b: st.datetimes(timezones=st.none() | _OFFSETS),
    dt.date: lambda b: st.dates(),
    dt.time: lambda b: st.times(),
    dt.timedelta: lambda b: st.timedeltas(),
    uuid.UUID: lambda b: st.uuids(),
}


def values(
    annotation: Any, metadata: typing.Iterable[Any] = (), *, max_size: int = 4
) -> st.SearchStrategy[Any]:
    """A strategy for valid values of the field type ``annotation``.

    Args:
        annotation: a field type (``model_fields[name].annotation``).
        metadata: the field's constraints (``model_fields[name].metadata``): ``MinLen``,
            ``MaxLen``, ``Ge``, ``Gt``, ``Le``, ``Lt`` are honoured.
        max_size: the largest container drawn.

    Raises:
        TypeError: for a type with no strategy here (pass an override to
            :func:`instances` for such a field).
    """
    metadata = list(metadata)
    if get_origin(annotation) is Annotated:
        base, *extra = get_args(annotation)
        return values(base, [*extra, *metadata], max_size=max_size)
    bounds = _Bounds.of(metadata)
    if annotation is Any:
        return json_values()
    if annotation in _SIMPLE:
        return _SIMPLE[annotation](bounds)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, types.UnionType):
        return st.one_of(*(values(a, max_size=max_size) for a in args))
    low, high = bounds.sizes(max_size)
    if origin is list:
        return st.lists(values(args[0], max_size=max_size), min_size=low, max_size=high)
    if origin in (set, frozenset):
        items = st.sets(values(args[0], max_size=max_size), min_size=low, max_size=high)
        return items if origin is set else items.map(frozenset)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(values(args[0]), min_size=low, max_size=high).map(tuple)
        return st.tuples(*(values(a, max_size=max_size) for a in args))
    if origin is dict:
        key = values(args[0]) if args else text()
        value = values(args[1], max_size=max_size) if args else json_values()
        return st.dictionaries(key, value, min_size=low, max_size=high)
    if annotation is dict:
        return st.dictionaries(text(), json_values(), max_size=high)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return st.sampled_from(list(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return instances(annotation)
    raise TypeError(
        f"tests.strategies.values has no strategy for {annotation!r}; "
        "pass instances(cls, overrides={field: strategy}) for that field"
    )


def instances(
    model_cls: type[BaseModel],
    *,
    use_defaults: bool = True,
    overrides: Mapping[str, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[BaseModel]:
    """Valid instances of ``model_cls``, built through its constructor (so validated).

    Args:
        model_cls: a model made of the types :func:`values` knows.
        use_defaults: sometimes leave out fields that have a default.
        overrides: ``{field name: strategy}`` for fields of other types.
    """
    overrides = dict(overrides or {})
    fields: dict[str, tuple[str, st.SearchStrategy[Any], bool]] = {}
    for name, info in model_cls.model_fields.items():
        strategy = overrides.get(name) or values(info.annotation, info.metadata)
        optional = use_defaults and not info.is_required()
        fields[name] = (info.alias or name, strategy, optional)

    @st.composite
    def build(draw: st.DrawFn) -> BaseModel:
        kwargs: dict[str, Any] = {}
        for key, strategy, optional in fields.values():
            if optional and draw(st.booleans()):
                continue
            kwargs[key] = draw(strategy)
        return model_cls(**kwargs)

    return build()


# --- model classes ----------------------------------------------------------------------------


_BASE_FIELDS = set(Observation.model_fields) | set(State.model_fields)
_FIELD_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True).filter(
    lambda n: (
        not keyword.iskeyword(n)
        and not n.startswith("model_")
        and not hasattr(BaseModel, n)
        and n not in _BASE_FIELDS
    )
)
_CLASS_NAMES = st.from_regex(r"[A-Z][A-Za-z0-9]{0,9}", fullmatch=True)


class _Namer:
    """Unique class names within one generated model tree (so ``$defs`` keys are stable)."""

    def __init__(self, stem: str) -> None:
        self.stem = stem
        self._counter = itertools.count()

    def __call__(self, kind: str) -> str:
        return f"{self.stem}{kind}{next(self._counter)}"


@st.composite
def _literal(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        choices: list[Any] = draw(st.lists(text(max_size=6), min_size=1, max_size=4, unique=True))
    else:
        choices = draw(st.lists(_CHOICE_INTS, min_size=1, max_size=4, unique=True))
    return Literal[tuple(choices)]


@st.composite
def _enum(draw: st.DrawFn, namer: _Namer) -> type[enum.Enum]:
    if draw(st.booleans()):
        raw: list[Any] = draw(st.lists(text(max_size=6), min_size=1, max_size=4, unique=True))
    else:
        raw = draw(st.lists(_CHOICE_INTS, min_size=1, max_size=4, unique=True))
    members = [(f"M{i}", v) for i, v in enumerate(raw)]
    return enum.Enum(namer("Choice"), members, module=__name__)  # type: ignore[return-value]


_LEAF_KINDS = ("str", "int", "float", "bool", "bytes", "datetime", "literal", "enum")
_NESTED_KINDS = ("optional", "list", "dict", "model")


@st.composite
def _annotation(draw: st.DrawFn, depth: int, namer: _Namer, nested_base: type[BaseModel]) -> Any:
    kinds = _LEAF_KINDS + (_NESTED_KINDS if depth > 0 else ())
    kind = draw(st.sampled_from(kinds))
    simple = {"str": str, "int": int, "float": float, "bool": bool, "bytes": bytes}
    if kind in simple:
        return simple[kind]
    if kind == "datetime":
        return dt.datetime
    if kind == "literal":
        return draw(_literal())
    if kind == "enum":
        return draw(_enum(namer))
    if kind == "model":
        return draw(_model(nested_base, depth - 1, namer, nested_base, namer("Nested")))
    inner = draw(_annotation(depth - 1, namer, nested_base))
    if kind == "optional":
        return Optional[inner]  # noqa: UP045 - inner may be a Literal, which | rejects
    if kind == "list":
        return list[inner]  # type: ignore[valid-type]
    return dict[str, inner]  # type: ignore[valid-type]


@st.composite
def _field(draw: st.DrawFn, annotation: Any) -> tuple[Any, FieldInfo]:
    choice = draw(st.sampled_from(["required", "default", "factory"]))
    origin = get_origin(annotation)
    if choice == "factory" and origin in (list, dict):
        return annotation, Field(default_factory=origin)
    if choice == "required":
        return annotation, Field()
    return annotation, Field(default=draw(values(annotation)))


@st.composite
def _model(
    draw: st.DrawFn,
    base: type[BaseModel],
    depth: int,
    namer: _Namer,
    nested_base: type[BaseModel],
    name: str,
) -> type[BaseModel]:
    names = draw(st.lists(_FIELD_NAMES, max_size=6, unique=True))
    fields: dict[str, Any] = {}
    for field_name in names:
        annotation = draw(_annotation(depth, namer, nested_base))
        fields[field_name] = draw(_field(annotation))
    return create_model(name, __base__=base, __module__=__name__, **fields)


def model_classes(
    base: type[BaseModel] = Action,
    *,
    max_depth: int = 2,
    nested_base: type[BaseModel] = WireModel,
) -> st.SearchStrategy[type[BaseModel]]:
    """Random model classes derived from ``base`` (wire-safe, so definable).

    Args:
        base: ``Action``, ``Observation``, ``State`` or another ``WireModel`` subclass.
        max_depth: how deep containers and nested models go (0: only leaf types).
        nested_base: the base of generated nested models.

    Class names are unique within one class and its nested models, and field names are
    valid identifiers that shadow nothing of pydantic's or corral's bases.
    """

    @st.composite
    def build(draw: st.DrawFn) -> type[BaseModel]:
        stem = draw(_CLASS_NAMES)
        namer = _Namer(stem)
        return draw(_model(base, max_depth, namer, nested_base, stem))

    return build()


def models_and_instances(
    base: type[BaseModel] = Action, **kwargs: Any
) -> st.SearchStrategy[tuple[type[BaseModel], BaseModel]]:
    """A random model class derived from ``base`` and one instance of it.

    ``kwargs`` go to :func:`model_classes`.
    """
    return model_classes(base, **kwargs).flatmap(
        lambda cls: st.tuples(st.just(cls), instances(cls))
    )

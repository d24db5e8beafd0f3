"""The wire-safety check: what it rejects (and how it says so), what it lets through."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import enum
import io
import ipaddress
import re
import socket
import threading
import typing
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Generic, Literal, NamedTuple, NewType, TypeVar

import numpy as np
import pytest
import typing_extensions
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    PlainSerializer,
    PlainValidator,
    create_model,
)
from pydantic_core import core_schema

from corral.contract import (
    Action,
    Environment,
    Observation,
    State,
    WireModel,
    WireSafetyError,
)
from corral.contract.arrays import NDArray
from corral.contract.wiresafe import check_model, make_wire_safe

pytestmark = pytest.mark.filterwarnings("ignore::pydantic.warnings.ArbitraryTypeWarning")


def define(annotation: Any, base: type[BaseModel] = Action, name: str = "Bad") -> type[BaseModel]:
    """Define ``class <name>(base): field: annotation`` at run time."""
    return type(name, (base,), {"__annotations__": {"field": annotation}, "__module__": __name__})


def rejection(annotation: Any, base: type[BaseModel] = Action) -> WireSafetyError:
    with pytest.raises(WireSafetyError) as info:
        define(annotation, base)
    return info.value


class Opaque:
    """A plain class with no JSON form."""


T = TypeVar("T")


class Box(Generic[T]):
    """A plain generic class with no JSON form."""


# (annotation, the type as named in the message, reason fragment, fix fragment)
REJECTED: list[tuple[Any, str, str, str]] = [
    (io.TextIOWrapper, "_io.TextIOWrapper", "file handle", "contents"),
    (io.BytesIO, "_io.BytesIO", "file handle", "contents"),
    (typing.IO, "typing.IO", "file handle", "contents"),
    (typing.IO[str], "typing.IO[str]", "file handle", "contents"),
    (typing.TextIO, "typing.TextIO", "file handle", "contents"),
    (socket.socket, "socket.socket", "socket", "connection inside the environment"),
    (threading.Thread, "threading.Thread", "thread", "private attributes"),
    (threading.Lock, "threading.Lock", "lock", "private attributes"),
    (type(threading.Lock()), "_thread.lock", "lock", "private attributes"),
    (threading.RLock, "threading.RLock", "lock", "private attributes"),
    (threading.Event, "threading.Event", "synchronization", "private attributes"),
    (Callable, "Callable", "callable", "send a name"),
    (Callable[[int], int], "Callable[[int], int]", "callable", "send a name"),
    (typing.Callable[..., Any], "Callable[..., typing.Any]", "callable", "send a name"),
    (Opaque, f"{__name__}.Opaque", "arbitrary class", "to_json"),
    (Box[int], "Box[int]", "arbitrary class", "to_json"),
    (type[int], "type[int]", "class object", "class name"),
    (typing.Type[Opaque], "Type", "class object", "class name"),  # noqa: UP006
    (dict[tuple[int, int], int], "tuple[int, int]", "mapping key", "str (or int) keys"),
    (dict[float, str], "float", "mapping key", "str (or int) keys"),
    (np.ndarray, "numpy.ndarray", "dtype/shape", "NDArray"),
    (re.match, "re.match", "function, not a type", "annotate the field with the type"),
]
KEY_ERRORS = {dict[tuple[int, int], int], dict[float, str]}


def _nested_model(annotation: Any) -> Any:
    return create_model(
        "Holder",
        __config__=ConfigDict(arbitrary_types_allowed=True),
        __module__=__name__,
        x=(annotation, ...),
    )


def _dataclass(annotation: Any) -> Any:
    return dataclasses.make_dataclass("Cell", [("x", annotation)])


# (how to wrap the bad type, the field path the error names)
WRAPPERS: list[tuple[str, Callable[[Any], Any], str]] = [
    ("top", lambda t: t, "field"),
    ("list", lambda t: list[t], "field"),
    ("dict value", lambda t: dict[str, t], "field"),
    ("Optional", lambda t: typing.Optional[t], "field"),  # noqa: UP045
    ("union", lambda t: typing.Union[int, t], "field"),  # noqa: UP007 - t may be a function
    ("nested list", lambda t: list[dict[str, list[t]]], "field"),
    ("nested model", _nested_model, "field.x"),
    ("dataclass", _dataclass, "field.x"),
    ("Annotated", lambda t: Annotated[t, "doc"], "field"),
]


def stable_id(annotation: Any) -> str:
    """``repr`` without the object's address: every pytest-xdist worker must collect the
    same test ids."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(annotation))


@pytest.mark.parametrize(("wrapper", "wrap", "path"), WRAPPERS, ids=[w[0] for w in WRAPPERS])
@pytest.mark.parametrize(
    ("annotation", "type_name", "reason", "fix"), REJECTED, ids=[stable_id(r[0]) for r in REJECTED]
)
def test_rejected_everywhere_with_model_field_type_and_fix(
    annotation: Any,
    type_name: str,
    reason: str,
    fix: str,
    wrapper: str,
    wrap: Callable[[Any], Any],
    path: str,
) -> None:
    error = rejection(wrap(annotation))
    assert isinstance(error, TypeError)
    (problem,) = error.problems
    assert problem.model == "Bad"
    expected_path = f"{path}[key]" if annotation in KEY_ERRORS else path
    assert problem.field == expected_path
    assert type_name in problem.type
    assert reason in problem.reason
    assert fix in problem.fix
    message = str(error)
    assert f"Bad.{expected_path}:" in message
    assert type_name in message
    assert f"Fix: {problem.fix}" in message


def test_every_bad_field_is_reported_at_once() -> None:
    class Many(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        a: socket.socket
        ok: int
        b: list[Opaque]

    with pytest.raises(WireSafetyError) as info:
        make_wire_safe(Many)
    assert [(p.model, p.field) for p in info.value.problems] == [("Many", "a"), ("Many", "b")]


@pytest.mark.parametrize(
    "annotation",
    [
        collections.deque[socket.socket],
        collections.OrderedDict[str, socket.socket],
        collections.defaultdict[str, list[Opaque]],
        typing.Iterable[type(threading.Lock())],
        typing.MutableSet[threading.Thread],
        typing.Sequence[io.StringIO],
        NewType("Conn", socket.socket),
        list[NewType("Handle", io.TextIOWrapper)],
        typing.Optional[Callable[[], None]],  # noqa: UP045
        tuple[int, socket.socket],
        tuple[socket.socket, ...],
        frozenset[Opaque],
    ],
    ids=repr,
)
def test_rejected_inside_other_generic_forms(annotation: Any) -> None:
    (problem,) = rejection(annotation).problems
    assert problem.field == "field"


class Conn(NamedTuple):
    host: str
    sock: socket.socket


class Spec(typing_extensions.TypedDict):
    name: str
    handle: typing_extensions.NotRequired[io.TextIOWrapper]


def test_rejected_inside_named_tuples_and_typed_dicts() -> None:
    (problem,) = rejection(Conn).problems
    assert (problem.field, problem.type) == ("field.sock", "`socket.socket`")
    (problem,) = rejection(Spec).problems
    assert problem.field == "field.handle"
    assert "file handle" in problem.reason


def test_pydantic_validators_or_serializers_alone_do_not_make_a_type_safe() -> None:
    # pydantic's own metadata carries __get_pydantic_core_schema__ too, but wraps the
    # type's schema: the socket still has to cross.
    for meta in (
        AfterValidator(lambda v: v),
        PlainSerializer(lambda v: "x"),
        PlainValidator(lambda v: v),
    ):
        (problem,) = rejection(Annotated[socket.socket, meta]).problems
        assert problem.type == "`socket.socket`"
        (problem,) = rejection(list[Annotated[Opaque, meta]]).problems
        assert "arbitrary class" in problem.reason


# --- escapes ----------------------------------------------------------------------------------


class Point:
    """Crosses the wire through to_json/from_json."""

    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

    def to_json(self) -> list[int]:
        return [self.x, self.y]

    @classmethod
    def from_json(cls, data: list[int]) -> Point:
        return cls(*data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __hash__(self) -> int:
        return hash((self.x, self.y))


class Shapes(Observation):
    at: Point
    path: list[Point] = []
    maybe: Point | None = None
    named: dict[str, Point] = {}


def test_to_json_from_json_classes_cross_the_wire() -> None:
    shapes = Shapes(at=Point(1, 2), path=[Point(3, 4)], maybe=Point(5, 6), named={"o": Point(0, 0)})
    dumped = shapes.model_dump(mode="json")
    assert dumped["at"] == [1, 2]
    assert dumped["path"] == [[3, 4]]
    assert dumped["maybe"] == [5, 6]
    assert dumped["named"] == {"o": [0, 0]}
    assert Shapes.model_validate(dumped) == shapes
    assert Shapes.model_validate_json(shapes.model_dump_json()) == shapes
    assert Shapes(at=[7, 8]).at == Point(7, 8)  # type: ignore[arg-type]
    assert Shapes.model_validate(dumped | {"maybe": None}).maybe is None


def test_to_json_classes_keep_working_in_subclasses() -> None:
    class MoreShapes(Shapes):
        extra: int = 0

    more = MoreShapes(at=Point(1, 1))
    assert MoreShapes.model_validate_json(more.model_dump_json()) == more


def test_to_json_inside_a_nested_wire_model_crosses() -> None:
    class Holder(WireModel):
        p: Point

    class Outer(Action):
        inner: Holder
        many: list[Holder] = []

    outer = Outer(inner=Holder(p=Point(1, 2)), many=[Holder(p=Point(3, 4))])
    assert outer.model_dump(mode="json") == {"inner": {"p": [1, 2]}, "many": [{"p": [3, 4]}]}
    assert Outer.model_validate_json(outer.model_dump_json()) == outer


def test_to_json_inside_plain_models_and_dataclasses_is_flagged() -> None:
    # corral rewrites annotations only on its own models; a plain container would accept
    # the class and then fail at the first dump.
    class PlainHolder(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        p: Point

    @dataclasses.dataclass
    class Cell:
        p: Point

    for container, kind in ((PlainHolder, "pydantic model"), (Cell, "class")):
        (problem,) = rejection(list[container]).problems
        assert problem.field == "field.p"
        assert f"plain {kind}" in problem.reason
        assert "WireModel" in problem.fix


Meters = Annotated[
    Opaque,
    PlainSerializer(lambda v: 1.0, return_type=float),
    PlainValidator(lambda v: v if isinstance(v, Opaque) else Opaque()),
]


def test_annotated_serializer_validator_pairs_cross_the_wire() -> None:
    class Measured(Action):
        top: Meters
        many: list[Meters] = []
        maybe: Meters | None = None

    m = Measured(top=Opaque(), many=[Opaque()], maybe=None)
    assert m.model_dump(mode="json") == {"top": 1.0, "many": [1.0], "maybe": None}
    back = Measured.model_validate_json(m.model_dump_json())
    assert isinstance(back.top, Opaque) and isinstance(back.many[0], Opaque)


class Celsius:
    """Crosses the wire through its own pydantic core schema."""

    def __init__(self, degrees: float) -> None:
        self.degrees = degrees

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.float_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(lambda c: c.degrees),
        )


def test_classes_with_their_own_core_schema_cross_the_wire() -> None:
    class Weather(Observation):
        temperature: Celsius
        history: list[Celsius] = []

    w = Weather(temperature=21.5, history=[1.0])  # type: ignore[arg-type]
    dumped = w.model_dump(mode="json")
    assert dumped["temperature"] == 21.5
    assert Weather.model_validate(dumped).history[0].degrees == 1.0


def test_ndarray_fields_declared_with_ndarray_cross_the_wire() -> None:
    class Frame(Observation):
        pixels: NDArray
        maybe: NDArray | None = None

    frame = Frame(pixels=np.arange(6, dtype=np.uint8).reshape(2, 3))
    back = Frame.model_validate_json(frame.model_dump_json())
    assert np.array_equal(back.pixels, frame.pixels)
    assert back.pixels.dtype == np.uint8


class Suit(enum.Enum):
    HEARTS = "h"


class Pair(NamedTuple):
    a: int
    b: str


class Record(typing_extensions.TypedDict):
    name: str
    size: typing_extensions.NotRequired[int]


class Nested(WireModel):
    n: int = 0


UserId = NewType("UserId", int)

# (annotation, a value) pairs: accepted, and the value survives a JSON round trip.
ACCEPTED: list[tuple[Any, Any]] = [
    (int, 2**63),
    (bytes, b"\x00\xff"),
    (dt.datetime, dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),
    (uuid.UUID, uuid.UUID(int=7)),
    (re.Pattern, re.compile("a+")),
    (ipaddress.IPv4Network, ipaddress.IPv4Network("10.0.0.0/8")),
    (Literal["a", "b"], "b"),
    (Suit, Suit.HEARTS),
    (Any, {"free": [1, "form"]}),
    (list, [1, "x"]),
    (dict, {"k": None}),
    (collections.deque[int], collections.deque([1, 2])),
    (collections.Counter[str], collections.Counter("aab")),
    (typing.Sequence[int], [1, 2]),
    (frozenset[str], frozenset({"x"})),
    (tuple[int, ...], (1, 2)),
    (dict[Literal["x"], int], {"x": 1}),
    (dict[Annotated[str, "key"], int], {"k": 1}),
    (dict[int, Nested], {1: Nested(n=2)}),
    (UserId, 5),
    (Pair, Pair(1, "x")),
    (Record, {"name": "a"}),
    (Nested | None, Nested(n=3)),
    (list[Point], [Point(1, 2)]),
]


@pytest.mark.parametrize(("annotation", "value"), ACCEPTED, ids=[stable_id(a[0]) for a in ACCEPTED])
def test_accepted_types_really_cross_the_wire(annotation: Any, value: Any) -> None:
    model = define(annotation, name="Good")
    obj = model(field=value)
    assert model.model_validate_json(obj.model_dump_json()).field == value  # type: ignore[attr-defined]


# --- where the check runs ---------------------------------------------------------------------


def test_the_check_runs_when_any_contract_model_is_subclassed() -> None:
    for base in (Action, Observation, State, WireModel):
        (problem,) = rejection(socket.socket, base).problems
        assert problem.model == "Bad"


def test_check_model_reports_without_changing_the_model() -> None:
    class Plain(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        p: Point

    rewrites = check_model(Plain)
    assert set(rewrites) == {"p"}
    assert Plain.model_fields["p"].annotation is Point
    make_wire_safe(Plain)
    assert Plain(p=Point(1, 2)).model_dump(mode="json") == {"p": [1, 2]}


class GoodAction(Action):
    n: int = 0


class GoodObservation(Observation):
    pass


class LockedState(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    lock: type(threading.Lock())  # type: ignore[valid-type]


def test_environment_checks_its_declared_models() -> None:
    with pytest.raises(WireSafetyError, match=r"LockedState\.lock"):

        class FromGenerics(Environment[GoodAction, GoodObservation, LockedState]):  # type: ignore[type-var]
            pass

    with pytest.raises(WireSafetyError, match=r"LockedState\.lock"):

        class FromAttributes(Environment):  # type: ignore[type-arg]
            action_type = GoodAction
            observation_type = GoodObservation
            state_type = LockedState  # type: ignore[assignment]


def test_environment_wires_in_to_json_fields_of_plain_models() -> None:
    class PlainObservation(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        at: Point

    class Env(Environment[GoodAction, PlainObservation, State]):  # type: ignore[type-var]
        pass

    assert Env.observation_type(at=Point(1, 2)).model_dump(mode="json") == {"at": [1, 2]}

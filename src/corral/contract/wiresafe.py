"""The wire-safety check: only types that can cross the wire may appear in a contract.

A field whose type is a file handle, thread, lock, socket, callable or an arbitrary class
without a JSON form is rejected with a :class:`WireSafetyError` that names the model, the
field, the type and the fix. A custom class crosses the wire only through an explicit
serializer: ``to_json(self)`` plus a ``from_json(cls, data)`` classmethod (corral wires
them into pydantic for you), a pydantic serializer/validator pair in ``Annotated``, or its
own ``__get_pydantic_core_schema__``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import io
import ipaddress
import pathlib
import socket
import threading
import types
import typing
import uuid
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, PlainSerializer, PlainValidator, WrapSerializer
from pydantic.fields import FieldInfo
from pydantic.functional_validators import AfterValidator, BeforeValidator, WrapValidator


class WireSafetyError(TypeError):
    """A model field's type cannot cross the wire.

    Attributes:
        problems: one :class:`WireProblem` per offending field.
    """

    def __init__(self, problems: list[WireProblem]) -> None:
        self.problems = problems
        lines = [p.describe() for p in problems]
        super().__init__("model is not wire-safe:\n  " + "\n  ".join(lines))


@dataclasses.dataclass(frozen=True)
class WireProblem:
    """One field that cannot cross the wire, with the fix."""

    model: str
    field: str
    type: str
    reason: str
    fix: str

    def describe(self) -> str:
        """One line: where, what, why and how to fix it."""
        return f"{self.model}.{self.field}: {self.type} {self.reason}. Fix: {self.fix}"


_LEAVES: tuple[type, ...] = (
    str,
    int,
    float,
    bool,
    bytes,
    type(None),
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    uuid.UUID,
    decimal.Decimal,
    pathlib.PurePath,
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
)
_CONTAINERS = {list, tuple, set, frozenset, dict}
_ABC_CONTAINERS = {
    typing.Sequence,
    typing.MutableSequence,
    typing.Mapping,
    typing.MutableMapping,
    typing.AbstractSet,
}


def _is_handle(tp: type) -> str | None:
    """Name the kind of live resource ``tp`` is, or None."""
    kinds: list[tuple[tuple[type, ...], str]] = [
        ((io.IOBase,), "is a file handle"),
        ((socket.socket,), "is a socket"),
        ((threading.Thread,), "is a thread"),
        ((type(threading.Lock()), type(threading.RLock()), threading.Condition), "is a lock"),
        ((threading.Event, threading.Semaphore), "is a synchronization primitive"),
        ((types.GeneratorType, types.CoroutineType), "is a generator or coroutine"),
        ((types.ModuleType,), "is a module"),
    ]
    for bases, kind in kinds:
        try:
            if issubclass(tp, bases):
                return kind
        except TypeError:
            return None
    return None


def _fix_for(kind: str) -> str:
    if "file" in kind:
        return "send the contents (str or bytes) or the path (str) instead of the open file"
    if "socket" in kind:
        return "keep the connection inside the environment and send only data it produced"
    if "lock" in kind or "synchron" in kind or "thread" in kind:
        return "keep concurrency objects as private attributes of the environment, not fields"
    if "callable" in kind:
        return "send a name (str or Literal) that the environment maps to the function"
    return "send plain data (str, bytes, numbers, lists, dicts, pydantic models)"


def _has_json_methods(tp: type) -> bool:
    return callable(getattr(tp, "to_json", None)) and callable(getattr(tp, "from_json", None))


def _json_method_annotation(tp: type) -> Any:
    """Wrap a class with ``to_json``/``from_json`` into a pydantic validator/serializer pair."""

    def validate(value: Any) -> Any:
        return value if isinstance(value, tp) else tp.from_json(value)  # type: ignore[attr-defined]

    def serialize(value: Any) -> Any:
        return value.to_json()

    return Annotated[tp, PlainValidator(validate), PlainSerializer(serialize)]


_SERIALIZERS = (PlainSerializer, WrapSerializer)
_VALIDATORS = (PlainValidator, BeforeValidator, WrapValidator, AfterValidator)


class _Checker:
    """Walks one model's field types; collects problems and rewrites escapes."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        self.problems: list[WireProblem] = []
        self._seen: set[type] = set()

    def problem(self, path: str, tp: Any, reason: str, fix: str) -> None:
        self.problems.append(WireProblem(self.model.__name__, path, _type_name(tp), reason, fix))

    def walk(self, tp: Any, path: str) -> Any:
        """Return ``tp``, rewritten where a to_json/from_json class needs wrapping."""
        if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
            return tp
        if isinstance(tp, (str, typing.ForwardRef)):
            return tp  # unresolved: pydantic reports it on its own
        origin = get_origin(tp)
        if origin is Annotated:
            base, *meta = get_args(tp)
            has_ser = any(isinstance(m, _SERIALIZERS) for m in meta)
            has_val = any(
                isinstance(m, (PlainValidator, WrapValidator, BeforeValidator)) for m in meta
            )
            own_schema = any(hasattr(m, "__get_pydantic_core_schema__") for m in meta)
            if (has_ser and has_val) or own_schema:
                return tp
            new_base = self.walk(base, path)
            return tp if new_base is base else Annotated[(new_base, *meta)]
        if origin is Literal:
            return tp
        if origin in (typing.Union, types.UnionType):
            return self._rebuild(tp, path, origin)
        if origin in _CONTAINERS or origin in _ABC_CONTAINERS or _abc_origin(origin):
            args = get_args(tp)
            mapping = origin in (dict, typing.Mapping, typing.MutableMapping) or _is_mapping(origin)
            if mapping and args:
                self._check_key(args[0], path)
            return self._rebuild(tp, path, origin)
        if origin is not None and isinstance(origin, type) and issubclass(origin, BaseModel):
            return tp  # parametrized generic model: checked when it was defined
        if origin is not None and (origin is type or origin is typing.Type):  # noqa: UP006
            self.problem(path, tp, "is a class object", "send the class name (str or Literal)")
            return tp
        if _is_callable_type(tp):
            self.problem(path, tp, "is a callable", _fix_for("callable"))
            return tp
        if not isinstance(tp, type):
            return tp
        return self._leaf(tp, path)

    def _leaf(self, tp: type, path: str) -> Any:
        if issubclass(tp, _LEAVES) or issubclass(tp, enum.Enum):
            return tp
        if issubclass(tp, BaseModel):
            self._nested(tp, path)
            return tp
        if hasattr(tp, "__get_pydantic_core_schema__"):
            return tp
        kind = _is_handle(tp)
        if kind is not None:
            self.problem(path, tp, f"{kind} and cannot cross the wire", _fix_for(kind))
            return tp
        if _has_json_methods(tp):
            return _json_method_annotation(tp)
        if dataclasses.is_dataclass(tp) or typing.is_typeddict(tp):
            self._nested(tp, path)
            return tp
        if tp.__module__ == "numpy" and tp.__name__ == "ndarray":
            self.problem(
                path,
                tp,
                "has no declared dtype/shape form on the wire",
                "annotate the field with corral.contract.arrays.NDArray (or Array(dtype, shape))",
            )
            return tp
        self.problem(
            path,
            tp,
            "is an arbitrary class with no JSON form",
            f"give {tp.__name__} to_json(self) and a from_json(cls, data) classmethod, "
            "use a pydantic model, or annotate it with a PlainSerializer+PlainValidator pair",
        )
        return tp

    def _nested(self, tp: type, path: str) -> None:
        if tp in self._seen:
            return
        self._seen.add(tp)
        for name, hint in _field_hints(tp):
            self.walk(hint, f"{path}.{name}")

    def _check_key(self, key: Any, path: str) -> None:
        ok = key in (str, int, Any) or (isinstance(key, type) and issubclass(key, (str, int)))
        if get_origin(key) is Literal:
            ok = True
        if not ok:
            self.problem(
                f"{path}[key]",
                key,
                "is not a valid mapping key on the wire",
                "use str (or int) keys",
            )

    def _rebuild(self, tp: Any, path: str, origin: Any) -> Any:
        args = get_args(tp)
        new_args = tuple(self.walk(a, path) if a is not Ellipsis else a for a in args)
        if new_args == args:
            return tp
        if origin in (typing.Union, types.UnionType):
            return typing.Union[new_args]  # noqa: UP007
        return origin[new_args]


def _abc_origin(origin: Any) -> bool:
    import collections.abc as abc

    return origin in (abc.Sequence, abc.MutableSequence, abc.Mapping, abc.MutableMapping, abc.Set)


def _is_mapping(origin: Any) -> bool:
    import collections.abc as abc

    return origin in (abc.Mapping, abc.MutableMapping)


def _is_callable_type(tp: Any) -> bool:
    import collections.abc as abc

    return tp is Callable or tp is abc.Callable or get_origin(tp) is abc.Callable


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return (
            f"`{tp.__module__}.{tp.__qualname__}`"
            if tp.__module__ != "builtins"
            else f"`{tp.__name__}`"
        )
    return f"`{tp!r}`"


def _field_hints(tp: type) -> Iterator[tuple[str, Any]]:
    if issubclass(tp, BaseModel):
        for name, info in tp.model_fields.items():
            yield name, _full_annotation(info)
    elif dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            yield f.name, hints.get(f.name, f.type)
    else:
        yield from typing.get_type_hints(tp).items()


def _full_annotation(info: FieldInfo) -> Any:
    """The field's type with the ``Annotated`` metadata pydantic split off it."""
    if info.metadata:
        return Annotated[(info.annotation, *info.metadata)]
    return info.annotation


def check_model(model: type[BaseModel]) -> dict[str, Any]:
    """Check every field of ``model``; return the rewritten annotations of escapes.

    Raises:
        WireSafetyError: naming each field that cannot cross the wire.
    """
    checker = _Checker(model)
    checker._seen.add(model)
    rewrites: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        full = _full_annotation(info)
        if checker.walk(full, name) is not full:
            rewrites[name] = checker.walk(info.annotation, name)
    if checker.problems:
        raise WireSafetyError(checker.problems)
    return rewrites


def make_wire_safe(model: type[BaseModel]) -> None:
    """Check ``model`` and wire its ``to_json``/``from_json`` fields into pydantic.

    Called for every subclass of corral's contract models when the class is defined;
    call it yourself for other pydantic models you serve.

    Raises:
        WireSafetyError: naming each field that cannot cross the wire.
    """
    rewrites = check_model(model)
    if not rewrites:
        return
    for name, annotation in rewrites.items():
        model.model_fields[name].annotation = annotation
    model.model_rebuild(force=True)

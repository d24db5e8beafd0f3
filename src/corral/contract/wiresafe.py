"""The wire-safety check: only types that can cross the wire may appear in a contract.

A field whose type is a file handle, thread, lock, socket, callable or an arbitrary class
without a JSON form is rejected with a :class:`WireSafetyError` that names the model, the
field, the type and the fix. A custom class crosses the wire only through an explicit
serializer: ``to_json(self)`` plus a ``from_json(cls, data)`` classmethod (corral wires
them into pydantic for you), a pydantic serializer/validator pair in ``Annotated``, or its
own ``__get_pydantic_core_schema__``.
"""

from __future__ import annotations

import collections
import collections.abc as abc
import dataclasses
import datetime as dt
import decimal
import enum
import functools
import io
import ipaddress
import pathlib
import re
import socket
import threading
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, Literal, get_args, get_origin

import typing_extensions
from pydantic import BaseModel, PlainSerializer, PlainValidator, WrapSerializer
from pydantic.functional_validators import BeforeValidator, WrapValidator

from corral.errors import UsageError


class WireSafetyError(UsageError, TypeError):
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
    re.Pattern,
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    ipaddress.IPv4Network,
    ipaddress.IPv6Network,
    ipaddress.IPv4Interface,
    ipaddress.IPv6Interface,
)
# Generic containers pydantic validates item by item (as bare classes or as the origin of
# ``list[int]``, ``typing.Sequence[int]``...): their type arguments are checked in turn.
_CONTAINERS: frozenset[Any] = frozenset(
    {
        list,
        tuple,
        set,
        frozenset,
        dict,
        collections.deque,
        collections.OrderedDict,
        collections.Counter,
        collections.defaultdict,
        abc.Sequence,
        abc.MutableSequence,
        abc.Set,
        abc.MutableSet,
        abc.Mapping,
        abc.MutableMapping,
        abc.Iterable,
    }
)
# Not the ABCs: issubclass() against them accepts any class with __iter__ (numpy arrays...).
_CONCRETE_CONTAINERS = (list, tuple, set, frozenset, dict, collections.deque)
_MAPPINGS: frozenset[Any] = frozenset(
    {
        dict,
        collections.OrderedDict,
        collections.Counter,
        collections.defaultdict,
        abc.Mapping,
        abc.MutableMapping,
    }
)
# Before Python 3.13, ``threading.Lock`` and ``threading.RLock`` are factory functions, so
# an annotation ``lock: threading.Lock`` is not a class and needs naming explicitly.
_LOCK_FACTORIES: dict[Any, str] = {
    threading.Lock: "threading.Lock",
    threading.RLock: "threading.RLock",
}
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)
_TYPED_DICT_WRAPPERS = frozenset({"Required", "NotRequired", "ReadOnly"})


def _is_handle(tp: type) -> str | None:
    """Name the kind of live resource ``tp`` is, or None."""
    kinds: list[tuple[tuple[type, ...], str]] = [
        ((io.IOBase, typing.IO), "is a file handle"),
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
    if "callable" in kind or "function" in kind:
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
_VALIDATORS = (PlainValidator, WrapValidator, BeforeValidator)


def _own_schema(meta: Any) -> bool:
    """True for ``Annotated`` metadata that builds the whole pydantic schema itself.

    corral's ``ArraySpec`` is one. pydantic's own validators and serializers carry the same
    hook but wrap the annotated type's schema, so they do not make that type wire-safe.
    """
    return (
        not isinstance(meta, type)
        and hasattr(meta, "__get_pydantic_core_schema__")
        and not type(meta).__module__.startswith(("pydantic", "annotated_types"))
    )


def _is_escape(metadata: Iterable[Any]) -> bool:
    """True when ``metadata`` alone decides how the annotated type crosses the wire.

    That is a serializer plus a validator that replaces (or precedes) the type's own, or
    metadata with its own schema: the user declared the wire form, whatever the type is.
    """
    meta = list(metadata)
    if any(_own_schema(m) for m in meta):
        return True
    return any(isinstance(m, _SERIALIZERS) for m in meta) and any(
        isinstance(m, _VALIDATORS) for m in meta
    )


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
        supertype = getattr(tp, "__supertype__", None)
        if supertype is not None and not isinstance(tp, type):
            # typing.NewType: only static checkers see it; pydantic validates the supertype.
            new = self.walk(supertype, path)
            return tp if new is supertype else new
        if type(tp).__name__ == "TypeAliasType" and hasattr(tp, "__value__"):
            new = self.walk(tp.__value__, path)
            return tp if new is tp.__value__ else new
        origin = get_origin(tp)
        if origin is Annotated:
            base, *meta = get_args(tp)
            if _is_escape(meta):
                return tp
            new_base = self.walk(base, path)
            return tp if new_base is base else Annotated[(new_base, *meta)]
        if getattr(origin, "_name", None) in _TYPED_DICT_WRAPPERS:
            (inner,) = get_args(tp)
            new = self.walk(inner, path)
            return tp if new is inner else origin[new]
        if origin is Literal:
            return tp
        if origin in (typing.Union, types.UnionType):
            return self._rebuild(tp, path, origin)
        if origin is type:
            self.problem(path, tp, "is a class object", "send the class name (str or Literal)")
            return tp
        if _is_callable_type(tp):
            self.problem(path, tp, "is a callable", _fix_for("callable"))
            return tp
        if origin is not None:
            return self._generic(tp, path, origin)
        if not isinstance(tp, type):
            return self._not_a_type(tp, path)
        return self._leaf(tp, path)

    def _generic(self, tp: Any, path: str, origin: Any) -> Any:
        """A parametrized type such as ``list[int]``, ``typing.IO[str]`` or ``Box[int]``."""
        if origin in _CONTAINERS:
            if origin in _MAPPINGS and get_args(tp):
                self._check_key(get_args(tp)[0], path)
            return self._rebuild(tp, path, origin)
        if isinstance(origin, type):
            if issubclass(origin, BaseModel):
                return tp  # parametrized generic model: checked when it was defined
            before = len(self.problems)
            new_origin = self._leaf(origin, path, shown=tp)
            if len(self.problems) > before:
                return tp
            if new_origin is not origin:
                return new_origin  # a to_json/from_json generic class: parameters unused
        return self._rebuild(tp, path, origin)

    def _not_a_type(self, tp: Any, path: str) -> Any:
        if any(tp is factory for factory in _LOCK_FACTORIES):
            self.problem(path, _LOCK_FACTORIES[tp], "is a lock", _fix_for("lock"))
        elif isinstance(tp, _FUNCTIONS):
            self.problem(
                path,
                tp,
                "is a function, not a type",
                "annotate the field with the type of its value; " + _fix_for("function"),
            )
        return tp

    def _leaf(self, tp: type, path: str, shown: Any = None) -> Any:
        """Check the class ``tp``; problems name ``shown`` (the annotation as written)."""
        shown = tp if shown is None else shown
        if issubclass(tp, _LEAVES) or issubclass(tp, enum.Enum) or tp in _CONTAINERS:
            return tp
        if issubclass(tp, BaseModel):
            self._nested(tp, path)
            return tp
        if hasattr(tp, "__get_pydantic_core_schema__"):
            return tp
        kind = _is_handle(tp)
        if kind is not None:
            self.problem(path, shown, f"{kind} and cannot cross the wire", _fix_for(kind))
            return tp
        if _has_json_methods(tp):
            return _json_method_annotation(tp)
        if (
            dataclasses.is_dataclass(tp)
            or typing_extensions.is_typeddict(tp)
            or (issubclass(tp, tuple) and hasattr(tp, "_fields"))
        ):
            self._nested(tp, path)
            return tp
        if issubclass(tp, _CONCRETE_CONTAINERS):
            return tp  # e.g. a list subclass: pydantic validates and dumps it as a list
        if tp.__module__ == "numpy" and tp.__name__ == "ndarray":
            self.problem(
                path,
                shown,
                "has no declared dtype/shape form on the wire",
                "annotate the field with corral.contract.arrays.NDArray (or Array(dtype, shape))",
            )
            return tp
        self.problem(
            path,
            shown,
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
            where = f"{path}.{name}"
            if self.walk(hint, where) is not hint:
                # The class crosses the wire only through a rewrite of the field's
                # annotation, which corral makes on its own contract models alone.
                kind = "pydantic model" if issubclass(tp, BaseModel) else "class"
                self.problem(
                    where,
                    hint,
                    f"has to_json/from_json, which corral wires in only on its own models, "
                    f"and {tp.__name__} is a plain {kind}",
                    f"derive {tp.__name__} from corral.contract.WireModel, or annotate the "
                    "field with Annotated[..., PlainSerializer(...), PlainValidator(...)]",
                )

    def _check_key(self, key: Any, path: str) -> None:
        while True:
            if get_origin(key) is Annotated:
                key = get_args(key)[0]
            elif getattr(key, "__supertype__", None) is not None and not isinstance(key, type):
                key = key.__supertype__
            else:
                break
        ok = (
            key is Any
            or isinstance(key, typing.TypeVar)
            or get_origin(key) is Literal
            or (isinstance(key, type) and issubclass(key, (str, int)))
        )
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
        if all(new is old for new, old in zip(new_args, args, strict=True)):
            return tp
        if origin in (typing.Union, types.UnionType):
            return typing.Union[new_args]  # noqa: UP007
        return origin[new_args]


def _is_callable_type(tp: Any) -> bool:
    return tp is Callable or tp is abc.Callable or get_origin(tp) is abc.Callable


def _type_name(tp: Any) -> str:
    if isinstance(tp, str):
        return f"`{tp}`"
    if isinstance(tp, type):
        if tp.__module__ == "builtins":
            return f"`{tp.__name__}`"
        return f"`{tp.__module__}.{tp.__qualname__}`"
    if isinstance(tp, _FUNCTIONS) and hasattr(tp, "__qualname__"):
        return f"`{tp.__module__}.{tp.__qualname__}`"
    return f"`{tp!r}`"


def _type_hints(tp: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(tp, include_extras=True)
    except (NameError, TypeError):
        # Unresolvable forward references: check what is resolved, as pydantic will.
        return dict(getattr(tp, "__annotations__", {}))


def _field_hints(tp: type) -> Iterator[tuple[str, Any]]:
    if issubclass(tp, BaseModel):
        for name, info in tp.model_fields.items():
            if info.metadata:
                yield name, Annotated[(info.annotation, *info.metadata)]
            else:
                yield name, info.annotation
    elif dataclasses.is_dataclass(tp):
        hints = _type_hints(tp)
        for f in dataclasses.fields(tp):
            yield f.name, hints.get(f.name, f.type)
    else:
        yield from _type_hints(tp).items()


def check_model(model: type[BaseModel]) -> dict[str, Any]:
    """Check every field of ``model``; return the rewritten annotations of escapes.

    Raises:
        WireSafetyError: naming each field that cannot cross the wire.
    """
    checker = _Checker(model)
    checker._seen.add(model)
    rewrites: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if _is_escape(info.metadata):
            continue  # e.g. Annotated[X, PlainSerializer(...), PlainValidator(...)]
        new = checker.walk(info.annotation, name)
        if new is not info.annotation:
            rewrites[name] = new
    if checker.problems:
        raise WireSafetyError(checker.problems)
    return rewrites


def _validates_default(tp: Any) -> bool:
    """True when ``tp`` holds metadata asking for its defaults to be validated (an array
    field: its default, nested lists, must become an array like any value)."""
    if get_origin(tp) is Annotated:
        base, *meta = get_args(tp)
        return any(getattr(m, "validates_default", False) is True for m in meta) or (
            _validates_default(base)
        )
    return any(_validates_default(arg) for arg in get_args(tp) if arg is not Ellipsis)


def _unvalidated_defaults(model: type[BaseModel]) -> list[str]:
    """The fields with a default that must be validated but is not yet."""
    names = []
    for name, info in model.model_fields.items():
        if info.validate_default or (info.default_factory is None and info.default is None):
            continue
        if info.is_required():
            continue
        annotation = (
            Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        )
        if _validates_default(annotation):
            names.append(name)
    return names


def make_wire_safe(model: type[BaseModel]) -> None:
    """Check ``model`` and wire its ``to_json``/``from_json`` fields into pydantic; make
    the defaults of its array fields validated (so a list default becomes an array).

    Called for every subclass of corral's contract models when the class is defined;
    call it yourself for other pydantic models you serve.

    Raises:
        WireSafetyError: naming each field that cannot cross the wire.
    """
    rewrites = check_model(model)
    defaults = _unvalidated_defaults(model)
    if not rewrites and not defaults:
        return
    for name, annotation in rewrites.items():
        model.model_fields[name].annotation = annotation
    for name in defaults:
        model.model_fields[name].validate_default = True
    model.model_rebuild(force=True)

"""Typed pydantic models rebuilt from the JSON Schemas pydantic produces.

A client that knows only a server's ``/schema`` calls :func:`contract_models` (or
:func:`model_from_schema` for one model) and decodes replies into real, validated models,
without hand-written parsing code::

    Act, Obs, St = contract_models(schemas)          # schemas = GET /schema
    obs = Obs.model_validate(reply["observation"])   # typed, validated

What is mapped (``Model.model_json_schema()`` output, plus common JSON Schema):

- ``$defs``/``definitions`` and ``$ref`` (any JSON pointer into the document): object
  definitions become nested models, enum definitions become :class:`enum.Enum` classes,
  other definitions become :class:`pydantic.RootModel` subclasses. Recursive references
  are resolved once every model exists.
- ``anyOf``/``oneOf`` (``null`` members make the type optional; a ``discriminator`` makes
  a discriminated union), single-member ``allOf``, ``type`` lists, ``enum`` and ``const``
  (as ``Literal``), ``type`` ``string``/``integer``/``number``/``boolean``/``null``/
  ``array`` (``items``; ``prefixItems`` → ``tuple``; ``uniqueItems`` → ``set``)/``object``
  (``properties`` → a model; ``additionalProperties``/``propertyNames`` → ``dict[K, V]``).
- The string ``format`` values pydantic emits (``date-time``, ``date``, ``time``,
  ``duration``, ``uuid``, ``path``, IP addresses/networks/interfaces, ``uri``, ``password``,
  ``binary``/``base64``/``base64url`` bytes...). Unknown formats are validated as ``str`` and
  kept in the model's schema.
- Numeric, length, item-count and pattern constraints, as pydantic ``Field`` constraints.
- corral's ndarray fields (the ``x-corral-ndarray`` marker), as
  ``corral.contract.arrays.Array(dtype, shape)`` when numpy is installed.
- Per field: ``title``, ``description``, ``examples``, ``deprecated``, unknown (``x-...``)
  keywords (``x-corral-omit-empty``: left out of dumps when empty, as the original);
  ``required``, and defaults: a field that is not required keeps its schema
  default, or gets an empty container (``dict``/``list``/``set`` types) or ``None``.
- Per model: ``title`` (the class name), ``description`` (the docstring) and
  ``additionalProperties`` (``false`` → ``extra="forbid"``, ``true`` → ``"allow"``, a schema →
  typed extra fields, absent → ``"ignore"``).

Anything else maps to ``Any``: an unknown keyword never makes the translation fail.

Round trip and fingerprints: for a model ``M`` made of the types above,
``model_from_schema(M.model_json_schema())`` validates ``M``'s JSON dumps and dumps them back
unchanged, and its schema has the same :func:`~corral.contract.schema.fingerprint`. Where the
Python type cannot be recovered the schema still is: ``tuple[X, ...]`` and ``frozenset[X]``
come back as ``list[X]`` and ``set[X]`` (same schema), ``Decimal`` as ``float | str`` (same
schema; the JSON form survives). The fingerprint differs when the schema uses what is not
mapped: ``not``, ``if``/``then``/``else``, multi-member ``allOf``, ``prefixItems`` with
``items``, references outside the document, defaults holding a ``$ref`` key, unknown
keywords below the field level, patterns neither regex engine compiles, constraints on
format types beyond the type's own (they are not enforced either), and aliased fields of
the original model (their properties come back as fields named by the alias).

One module (~900 lines) because it is one recursive translation, JSON Schema to pydantic
types: every keyword handler calls back into the same walk and shares its reference
resolution.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime as dt
import enum
import functools
import ipaddress
import keyword
import pathlib
import re
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional, TypeVar, Union, cast, overload

import pydantic
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    RootModel,
    TypeAdapter,
    WithJsonSchema,
)
from pydantic_core import SchemaError, SchemaValidator, core_schema

from corral.contract.models import OMIT_EMPTY, Action, Observation, State, omitted_when_empty
from corral.contract.refs import RefError, SchemaReader, pointer_parts
from corral.contract.schema import canonical_schema

ModelT = TypeVar("ModelT", bound=BaseModel)

_MODULE = __name__

# Keywords this module reads, or knowingly ignores as standard JSON Schema; anything else
# found on a property is passed through ``json_schema_extra`` so the schema survives.
_STANDARD_KEYS = frozenset(
    {
        "$id",
        "$schema",
        "$ref",
        "$defs",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$vocabulary",
        "definitions",
        "type",
        "format",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "discriminator",
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "minContains",
        "maxContains",
        "minItems",
        "maxItems",
        "uniqueItems",
        "unevaluatedItems",
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "default",
        "title",
        "description",
        "examples",
        "deprecated",
        "nullable",
    }
)
# Annotation keywords copied verbatim onto a field's schema when present.
_CARRIED_KEYS = ("readOnly", "writeOnly", "$comment", "contentEncoding", "contentMediaType")
_ANNOTATIONS = frozenset({"title", "description", "examples", "$comment", "default"})


# --- bytes -----------------------------------------------------------------------------------


def _b64decode(alphabet: Callable[[bytes], bytes]) -> Callable[[Any], Any]:
    def decode(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        raw = value.encode("ascii", "strict") if value.isascii() else None
        if raw is None:
            raise ValueError("base64 text must be ASCII")
        try:
            return alphabet(raw + b"=" * (-len(raw) % 4))
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"invalid base64: {exc}") from exc

    return decode


def _urlsafe_decode(raw: bytes) -> bytes:
    # Accept either alphabet: a peer may encode with the standard one.
    return base64.urlsafe_b64decode(raw.replace(b"+", b"-").replace(b"/", b"_"))


def _standard_decode(raw: bytes) -> bytes:
    return base64.b64decode(raw.replace(b"-", b"+").replace(b"_", b"/"), validate=True)


def _utf8_encode(value: Any) -> Any:
    return value.encode() if isinstance(value, str) else value


def _bytes_type(fmt: str) -> Any:
    """Bytes that travel as text in JSON (``fmt``) and stay raw in Python mode.

    The encoding is part of the type rather than of the model config, so a field keeps its
    wire form whatever model it ends up in, and Python-mode validation accepts both the raw
    bytes (msgpack) and the text form (JSON).
    """
    schema = {"type": "string", "format": fmt}
    if fmt == "base64url":
        decode, encode = _b64decode(_urlsafe_decode), base64.urlsafe_b64encode
    elif fmt == "base64":
        decode, encode = _b64decode(_standard_decode), base64.b64encode
    else:
        return Annotated[
            bytes,
            BeforeValidator(_utf8_encode),
            PlainSerializer(lambda b: b.decode(), return_type=str, when_used="json"),
            WithJsonSchema(schema),
        ]
    return Annotated[
        bytes,
        BeforeValidator(decode),
        PlainSerializer(lambda b: encode(b).decode("ascii"), return_type=str, when_used="json"),
        WithJsonSchema(schema),
    ]


# --- string formats ----------------------------------------------------------------------------


def _format_types() -> dict[str, tuple[Any, bytes]]:
    """``format`` → (type, canonical schema of that type), from pydantic itself.

    Asking pydantic keeps the table right across pydantic versions.
    """
    candidates: list[Any] = [
        dt.datetime,
        dt.date,
        dt.time,
        dt.timedelta,
        uuid.UUID,
        pydantic.UUID1,
        pydantic.UUID3,
        pydantic.UUID4,
        pydantic.UUID5,
        pathlib.Path,
        ipaddress.IPv4Address,
        ipaddress.IPv6Address,
        ipaddress.IPv4Network,
        ipaddress.IPv6Network,
        ipaddress.IPv4Interface,
        ipaddress.IPv6Interface,
        pydantic.IPvAnyAddress,
        pydantic.IPvAnyNetwork,
        pydantic.IPvAnyInterface,
        pydantic.AnyUrl,
        pydantic.SecretStr,
        re.Pattern,
    ]
    table: dict[str, tuple[Any, bytes]] = {}
    for tp in candidates:
        try:
            schema = TypeAdapter(tp).json_schema()
        except Exception:  # a type this pydantic version cannot describe
            continue
        fmt = schema.get("format")
        if schema.get("type") == "string" and isinstance(fmt, str) and fmt not in table:
            table[fmt] = (tp, canonical_schema(schema))
    for fmt in ("binary", "base64", "base64url"):
        tp = _bytes_type(fmt)
        table[fmt] = (tp, canonical_schema(TypeAdapter(tp).json_schema()))
    # Existence checks belong to the server's filesystem, not to a client decoding replies.
    for fmt in ("file-path", "directory-path"):
        table.setdefault(
            fmt,
            (
                Annotated[pathlib.Path, WithJsonSchema({"type": "string", "format": fmt})],
                canonical_schema({"type": "string", "format": fmt}),
            ),
        )
    return table


_FORMATS = _format_types()


# --- helpers -----------------------------------------------------------------------------------


def _has_ref(value: Any) -> bool:
    if isinstance(value, dict):
        return "$ref" in value or any(_has_ref(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_ref(v) for v in value)
    return False


def _passable(keywords: dict[str, Any]) -> dict[str, Any]:
    """The keywords that can be copied verbatim into a regenerated schema.

    pydantic resolves every ``$ref`` it finds in a schema, so a copied value holding one
    (which could point anywhere, or nowhere) would break ``model_json_schema()``.
    """
    return {k: v for k, v in keywords.items() if not _has_ref(v)}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _numeric_constraints(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, arg in (
        ("minimum", "ge"),
        ("maximum", "le"),
        ("exclusiveMinimum", "gt"),
        ("exclusiveMaximum", "lt"),
        ("multipleOf", "multiple_of"),
    ):
        if _number(node.get(key)):
            out[arg] = node[key]
    # Draft 4 spelled exclusive bounds as booleans next to minimum/maximum.
    if node.get("exclusiveMinimum") is True and "ge" in out:
        out["gt"] = out.pop("ge")
    if node.get("exclusiveMaximum") is True and "le" in out:
        out["lt"] = out.pop("le")
    if out.get("multiple_of") == 0:
        del out["multiple_of"]
    return out


def _length_constraints(node: dict[str, Any], low: str, high: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if _count(node.get(low)):
        out["min_length"] = node[low]
    if _count(node.get(high)):
        out["max_length"] = node[high]
    return out


def _constrained(tp: Any, constraints: dict[str, Any]) -> Any:
    return Annotated[tp, Field(**constraints)] if constraints else tp


def _array_type(marker: Any) -> Any:
    """``Array(dtype, shape)`` for corral's ndarray schema marker, if numpy is installed."""
    if not isinstance(marker, dict):
        return None
    try:
        from corral.contract.arrays import Array
    except ImportError:  # numpy is optional: the array stays a {dtype, shape, data} model
        return None
    dtype, shape = marker.get("dtype"), marker.get("shape")
    if not (dtype is None or isinstance(dtype, str)):
        return None
    if not (shape is None or (isinstance(shape, list) and all(_dimension(n) for n in shape))):
        return None
    try:
        return Array(dtype, shape)
    except (TypeError, ValueError):
        return None


def _dimension(n: Any) -> bool:
    return n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0)


def _metaclass(base: type[BaseModel]) -> Any:
    # Calling the metaclass is how pydantic's own create_model builds classes; it is the
    # only way to pass a namespace with both a config and a base.
    return type(base)


def _optional(tp: Any) -> Any:
    # typing.Optional rather than ``|``: ``tp`` may be a forward reference (a str).
    return Optional[tp]  # noqa: UP045


def _literal_value(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _rust_regex_ok(pattern: str) -> bool:
    try:
        SchemaValidator(core_schema.str_schema(pattern=pattern))
    except SchemaError:
        return False
    return True


def _python_regex_ok(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def _empty_factory(node: dict[str, Any]) -> Callable[[], Any]:
    types_ = node.get("type")
    if types_ == "object" and not node.get("properties"):
        return dict
    if types_ == "array" and "prefixItems" not in node:
        return set if node.get("uniqueItems") is True else list
    return _none


def _none() -> None:
    return None


_RESERVED = frozenset(dir(BaseModel)) | {"model_config", "model_fields", "model_computed_fields"}


def _python_name(prop: str, taken: set[str]) -> str:
    """A valid, free Python attribute name for the JSON property ``prop``."""
    name = re.sub(r"\W", "_", prop).lstrip("_") or "field"
    if name[0].isdigit() or name.startswith("model_"):
        name = "f_" + name
    if keyword.iskeyword(name) or name in _RESERVED:
        name += "_"
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    return candidate


def _qualname(text: str) -> str:
    # Pydantic names $defs entries after the class's __qualname__, so using the original
    # definition key keeps the regenerated schema (and its fingerprint) identical.
    return re.sub(r"[^A-Za-z0-9_\-]", "_", text) or "Model"


# --- the translator ----------------------------------------------------------------------------


class _Translator:
    """Translates one schema document; caches each definition; resolves recursion."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.reader = SchemaReader(document)
        self.types: dict[str, Any] = {}
        self.refnames: dict[str, str] = {}
        self.building: set[str] = set()
        self.namespace: dict[str, Any] = {}
        self.models: list[type[BaseModel]] = []
        self.python_re = False
        self.root_key: str | None = None
        self.root_base: type[BaseModel] = BaseModel
        self.root_name: str | None = None

    # references

    def resolve(self, ref: str) -> dict[str, Any] | None:
        # One reference at a time: a chain is followed by translating each target, whose
        # cycles the ``building`` set turns into forward references (recursive models).
        try:
            target = self.reader.target(ref)
        except RefError:
            return None
        return target if isinstance(target, dict) else None

    def ref(self, ref: str) -> Any:
        if ref in self.types:
            return self.types[ref]
        if ref in self.building:
            # A cycle: refer to the definition by name; models are rebuilt at the end.
            name = self.refnames.setdefault(ref, f"_corral_ref_{len(self.refnames)}")
            return name
        target = self.resolve(ref)
        if target is None:
            return Any
        parts = pointer_parts(ref) or []
        key = parts[-1] if parts else str(target.get("title") or "Model")
        self.building.add(ref)
        try:
            if ref == self.root_key:
                tp: Any = self.model(
                    target, qualname=_qualname(key), base=self.root_base, name=self.root_name
                )
            else:
                tp = self.definition(target, _qualname(key))
        finally:
            self.building.discard(ref)
        self.types[ref] = tp
        if ref in self.refnames:
            self.namespace[self.refnames[ref]] = tp
        return tp

    def definition(self, node: dict[str, Any], qualname: str) -> Any:
        """A named definition: a model, an Enum or a RootModel."""
        title = node.get("title") if isinstance(node.get("title"), str) else qualname
        if self.is_model(node):
            return self.model(node, qualname=qualname, base=BaseModel)
        values = node.get("enum")
        if isinstance(values, list) and values and all(_literal_value(v) for v in values):
            return self.make_enum(str(title), qualname, values, node)
        saved, self.python_re = self.python_re, False
        try:
            root = self.annotation(node, owner=qualname)
            config = ConfigDict(regex_engine="python-re") if self.python_re else ConfigDict()
        finally:
            self.python_re = saved
        namespace: dict[str, Any] = {
            "__module__": _MODULE,
            "__qualname__": qualname,
            "__annotations__": {"root": root},
            "model_config": config,
        }
        if isinstance(node.get("description"), str):
            namespace["__doc__"] = node["description"]
        model: type[BaseModel] = _metaclass(RootModel)(str(title), (RootModel,), namespace)
        self.models.append(model)
        return model

    @staticmethod
    def is_model(node: dict[str, Any]) -> bool:
        return node.get("type") == "object" and isinstance(node.get("properties"), dict)

    @staticmethod
    def make_enum(title: str, qualname: str, values: list[Any], node: dict[str, Any]) -> Any:
        members: list[tuple[str, Any]] = []
        used: set[str] = set()
        for i, value in enumerate(values):
            name = value if isinstance(value, str) and value.isidentifier() else f"V{i}"
            if name.startswith("_") or name in ("mro", "name", "value"):
                name = f"V{i}"
            while name in used:
                name += "_"
            used.add(name)
            members.append((name, value))
        cls = enum.Enum(title, members, module=_MODULE, qualname=qualname)  # type: ignore[misc]
        if isinstance(node.get("description"), str):
            cls.__doc__ = node["description"]
        return cls

    # types

    def annotation(self, node: Any, *, owner: str) -> Any:
        """The Python annotation for the schema ``node``."""
        if node is True or node == {}:
            return Any
        if not isinstance(node, dict):
            return Any
        if isinstance(node.get("$ref"), str):
            return self.ref(node["$ref"])
        array = _array_type(node.get("x-corral-ndarray"))
        if array is not None:
            return array
        if "const" in node:
            return Literal[node["const"]] if _literal_value(node["const"]) else Any
        if isinstance(node.get("enum"), list) and node["enum"]:
            values = node["enum"]
            return Literal[tuple(values)] if all(_literal_value(v) for v in values) else Any
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and node[key]:
                return self.union(node, node[key], owner)
        all_of = node.get("allOf")
        if isinstance(all_of, list) and all_of:
            if len(all_of) == 1 and isinstance(all_of[0], dict):
                merged = {k: v for k, v in node.items() if k != "allOf"} | all_of[0]
                return self.annotation(merged, owner=owner)
            return Any
        types_ = node.get("type")
        if isinstance(types_, list) and types_:
            members = [self.annotation(node | {"type": t}, owner=owner) for t in types_]
            return Union[tuple(members)]  # noqa: UP007 - built at run time
        tp = self.typed(node, types_, owner)
        # OpenAPI 3.0 spelling of an optional value.
        return _optional(tp) if node.get("nullable") is True and tp is not Any else tp

    def union(self, node: dict[str, Any], members: list[Any], owner: str) -> Any:
        types_: list[Any] = []
        nullable = False
        for member in members:
            if isinstance(member, dict) and member.get("type") == "null" and len(member) == 1:
                nullable = True
                continue
            tp = self.annotation(member, owner=owner)
            if tp is Any:
                return Any
            types_.append(tp)
        if not types_:
            return type(None)
        tp = types_[0] if len(types_) == 1 else Union[tuple(types_)]  # noqa: UP007
        discriminator = node.get("discriminator")
        if (
            len(types_) > 1
            and not nullable
            and isinstance(discriminator, dict)
            and isinstance(discriminator.get("propertyName"), str)
            and discriminator["propertyName"].isidentifier()
            and all(isinstance(m, dict) and isinstance(m.get("$ref"), str) for m in members)
        ):
            tp = Annotated[tp, Field(discriminator=discriminator["propertyName"])]
        return _optional(tp) if nullable else tp

    def typed(self, node: dict[str, Any], types_: Any, owner: str) -> Any:
        if types_ == "string":
            return self.string(node)
        if types_ in ("integer", "number"):
            return _constrained(int if types_ == "integer" else float, _numeric_constraints(node))
        if types_ == "boolean":
            return bool
        if types_ == "null":
            return type(None)
        if types_ == "array":
            return self.array(node, owner)
        if types_ == "object":
            return self.mapping(node, owner)
        return Any

    def string(self, node: dict[str, Any]) -> Any:
        fmt = node.get("format")
        if isinstance(fmt, str):
            known = _FORMATS.get(fmt)
            type_level = _passable({k: v for k, v in node.items() if k not in _ANNOTATIONS})
            if known is not None:
                tp, canonical = known
                if canonical_schema(type_level) == canonical:
                    return tp
                return Annotated[tp, WithJsonSchema(type_level)]
            return Annotated[str, WithJsonSchema(type_level)]
        constraints = _length_constraints(node, "minLength", "maxLength")
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            if _rust_regex_ok(pattern):
                constraints["pattern"] = pattern
            elif _python_regex_ok(pattern):
                self.python_re = True
                constraints["pattern"] = pattern
        return _constrained(str, constraints)

    def array(self, node: dict[str, Any], owner: str) -> Any:
        prefix = node.get("prefixItems")
        items = node.get("items")
        if isinstance(prefix, list):
            if "items" in node and items is not False:
                return list[Any]
            return tuple[tuple(self.annotation(p, owner=owner) for p in prefix)]  # type: ignore[misc]
        if items is None and node.get("maxItems") == 0:
            return tuple[()]
        item = self.annotation(items, owner=owner) if items is not None else Any
        lengths = _length_constraints(node, "minItems", "maxItems")
        if node.get("uniqueItems") is True and self.hashable(items):
            return _constrained(set[item], lengths)  # type: ignore[valid-type]
        return _constrained(list[item], lengths)  # type: ignore[valid-type]

    def hashable(self, node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if isinstance(node.get("$ref"), str):
            target = self.resolve(node["$ref"])
            return target is not None and "enum" in target
        if "enum" in node or "const" in node:
            return True
        if node.get("type") in ("string", "integer", "number", "boolean", "null"):
            return True
        members = node.get("anyOf") or node.get("oneOf")
        return isinstance(members, list) and all(self.hashable(m) for m in members)

    def mapping(self, node: dict[str, Any], owner: str) -> Any:
        if isinstance(node.get("properties"), dict) and node["properties"]:
            title = node.get("title")
            name = title if isinstance(title, str) else f"{owner}Item"
            return self.model(node, qualname=_qualname(name), base=BaseModel)
        extra = node.get("additionalProperties", True)
        value = self.annotation(extra, owner=owner) if extra is not False else Any
        names = node.get("propertyNames")
        key: Any = str
        if isinstance(names, dict):
            key = self.annotation({"type": "string"} | names, owner=owner)
        lengths = _length_constraints(node, "minProperties", "maxProperties")
        return _constrained(dict[key, value], lengths)  # type: ignore[valid-type]

    # models

    def model(
        self,
        node: dict[str, Any],
        *,
        qualname: str,
        base: type[BaseModel],
        name: str | None = None,
    ) -> type[BaseModel]:
        """Build the model class described by the object schema ``node``."""
        title = node.get("title")
        class_name = name or (title if isinstance(title, str) and title else qualname)
        saved, self.python_re = self.python_re, False
        try:
            namespace = self.model_namespace(node, class_name, base)
            if self.python_re:
                namespace["model_config"]["regex_engine"] = "python-re"
        finally:
            self.python_re = saved
        namespace["__qualname__"] = qualname if name is None else _qualname(name)
        model: type[BaseModel] = _metaclass(base)(class_name, (base,), namespace)
        self.models.append(model)
        return model

    def model_namespace(
        self, node: dict[str, Any], class_name: str, base: type[BaseModel]
    ) -> dict[str, Any]:
        properties = node.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required_list = node.get("required")
        required = set(required_list) if isinstance(required_list, list) else set()
        inherited = _inherited(base, properties, required)
        taken = set(base.model_fields) | _RESERVED
        annotations: dict[str, Any] = {}
        namespace: dict[str, Any] = {"__module__": _MODULE}
        aliased = False
        for prop, sub in properties.items():
            if prop in inherited:
                continue
            pyname = prop if prop in base.model_fields else _python_name(prop, taken)
            taken.add(pyname)
            sub = sub if isinstance(sub, dict) else {}
            annotations[pyname] = self.annotation(sub, owner=class_name)
            namespace[pyname] = _field(
                sub, required=prop in required, alias=prop if pyname != prop else None
            )
            aliased = aliased or pyname != prop
        config = ConfigDict()
        extra = node.get("additionalProperties")
        if extra is False:
            config["extra"] = "forbid"
        elif extra is True or isinstance(extra, dict):
            config["extra"] = "allow"
            if isinstance(extra, dict) and extra:
                value = self.annotation(extra, owner=class_name)
                annotations["__pydantic_extra__"] = dict[str, value]  # type: ignore[valid-type]
                namespace["__pydantic_extra__"] = Field(init=False)
        else:
            config["extra"] = "ignore"
        if aliased:
            config["serialize_by_alias"] = True
        schema_extra = _passable({k: v for k, v in node.items() if k not in _STANDARD_KEYS})
        if schema_extra:
            config["json_schema_extra"] = schema_extra
        namespace["__annotations__"] = annotations
        namespace["model_config"] = config
        namespace["__doc__"] = (
            node["description"] if isinstance(node.get("description"), str) else None
        )
        return namespace

    def finish(self) -> None:
        """Rebuild the models that referred to a definition still being built."""
        pending = [m for m in self.models if not m.__pydantic_complete__]
        while pending:
            for model in pending:
                model.model_rebuild(_types_namespace=self.namespace, raise_errors=False)
            still = [m for m in pending if not m.__pydantic_complete__]
            if len(still) == len(pending):
                names = ", ".join(m.__name__ for m in still)
                raise TypeError(f"could not resolve the recursive definitions of {names}")
            pending = still


@functools.cache
def _base_properties(base: type[BaseModel]) -> tuple[dict[str, Any], frozenset[str]]:
    schema = base.model_json_schema()
    return schema.get("properties", {}), frozenset(schema.get("required", []))


def _inherited(base: type[BaseModel], properties: dict[str, Any], required: set[str]) -> set[str]:
    """The properties the base model already defines exactly as the schema describes them."""
    if not base.model_fields:
        return set()
    base_props, base_required = _base_properties(base)
    same: set[str] = set()
    for prop, sub in properties.items():
        mine = base_props.get(prop)
        if (
            isinstance(mine, dict)
            and isinstance(sub, dict)
            and "$ref" not in str(mine)
            and (prop in required) == (prop in base_required)
            and canonical_schema(mine) == canonical_schema(sub)
        ):
            same.add(prop)
    return same


def _field(node: dict[str, Any], *, required: bool, alias: str | None) -> Any:
    kwargs: dict[str, Any] = {}
    if alias is not None:
        kwargs["alias"] = alias
    for key, arg in (("title", "title"), ("description", "description")):
        if isinstance(node.get(key), str):
            kwargs[arg] = node[key]
    if isinstance(node.get("examples"), list):
        kwargs["examples"] = node["examples"]
    if isinstance(node.get("deprecated"), (bool, str)) and node["deprecated"]:
        kwargs["deprecated"] = node["deprecated"]
    extra = _passable(
        {k: v for k, v in node.items() if k not in _STANDARD_KEYS or k in _CARRIED_KEYS}
    )
    if extra:
        kwargs["json_schema_extra"] = extra
    if node.get(OMIT_EMPTY) is True:
        kwargs["exclude_if"] = omitted_when_empty
    if required:
        return Field(**kwargs)
    if "default" in node:
        # The default is in JSON form: validating it turns "2024-01-01" into a datetime,
        # {"a": 1} into a nested model and base64 text into bytes.
        default = node["default"]
        if _has_ref(default):
            # pydantic would read a "$ref" inside the default as a reference of its own when
            # the schema is regenerated; a factory keeps the value and leaves it out of it.
            return Field(
                default_factory=functools.partial(copy.deepcopy, default),
                validate_default=True,
                **kwargs,
            )
        return Field(default=default, validate_default=default is not None, **kwargs)
    # A factory, unlike a default, does not appear in the regenerated schema.
    return Field(default_factory=_empty_factory(node), **kwargs)


# --- public API --------------------------------------------------------------------------------


@overload
def model_from_schema(schema: dict[str, Any], *, name: str | None = None) -> type[BaseModel]: ...


@overload
def model_from_schema(
    schema: dict[str, Any], *, base: type[ModelT], name: str | None = None
) -> type[ModelT]: ...


def model_from_schema(
    schema: dict[str, Any],
    *,
    base: type[BaseModel] = BaseModel,
    name: str | None = None,
) -> type[BaseModel]:
    """Build a pydantic model class from the JSON Schema of an object model.

    Args:
        schema: a JSON Schema as ``Model.model_json_schema()`` produces it (``$defs`` at the
            top level; a recursive model's schema may be a bare ``$ref``).
        base: the class the model derives from. Fields the base already defines the way the
            schema does (e.g. corral's ``done``/``reward``/``metadata`` on
            :class:`~corral.contract.Observation`) are inherited rather than redefined, and
            so are the base's validators and config; ``extra`` follows the schema.
        name: the class name; by default the schema's ``title``.

    Returns:
        The model class. Nested definitions become nested models, enums and root models.

    Raises:
        TypeError: if ``schema`` is not a dict or ``base`` not a pydantic model class.
        ValueError: if ``schema`` does not describe an object.
    """
    if not isinstance(schema, dict):
        raise TypeError(
            f"model_from_schema needs a JSON Schema dict, got {type(schema).__name__}; "
            "pass Model.model_json_schema() or one entry of GET /schema"
        )
    if not (isinstance(base, type) and issubclass(base, BaseModel)):
        raise TypeError(f"base must be a pydantic BaseModel subclass, got {base!r}")
    translator = _Translator(schema)
    translator.root_base = base
    translator.root_name = name
    root = schema
    if isinstance(schema.get("$ref"), str) and "properties" not in schema:
        target = translator.resolve(schema["$ref"])
        if target is not None:
            translator.root_key = schema["$ref"]
            root = target
    if not (root.get("type", "object") == "object" and "enum" not in root):
        raise ValueError(
            f"the schema describes a {root.get('type', 'non-object')!r}, not an object model: "
            "model_from_schema builds models from object schemas (with 'properties')"
        )
    if translator.root_key is not None:
        model = translator.ref(translator.root_key)
    else:
        translator.root_key = "#"
        translator.building.add("#")
        title = schema.get("title")
        qualname = _qualname(name or (title if isinstance(title, str) else "Model"))
        model = translator.model(schema, qualname=qualname, base=base, name=name)
        translator.types["#"] = model
        if "#" in translator.refnames:
            translator.namespace[translator.refnames["#"]] = model
    translator.finish()
    return cast(type[BaseModel], model)


_CONTRACT_KEYS = ("action", "observation", "state")


def contract_models(
    schemas: dict[str, dict[str, Any]],
) -> tuple[type[Action], type[Observation], type[State]]:
    """Build the Action, Observation and State models of a contract from its schemas.

    Args:
        schemas: ``{"action": ..., "observation": ..., "state": ...}`` as returned by
            :func:`corral.contract.schema.model_schemas` and served at ``/schema``.

    Returns:
        Subclasses of corral's :class:`Action`, :class:`Observation` and :class:`State`.

    Raises:
        ValueError: if a key is missing or an entry is not an object schema.
    """
    missing = [k for k in _CONTRACT_KEYS if not isinstance(schemas.get(k), dict)]
    if missing:
        raise ValueError(
            f"contract schemas lack {', '.join(missing)}: pass the dict of "
            "corral.contract.schema.model_schemas(...) or GET /schema, with keys "
            "action/observation/state"
        )
    return (
        model_from_schema(schemas["action"], base=Action),
        model_from_schema(schemas["observation"], base=Observation),
        model_from_schema(schemas["state"], base=State),
    )

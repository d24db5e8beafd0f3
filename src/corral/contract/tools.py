"""Tools: environment methods an agent may call by name (MCP ``tools/list`` / ``tools/call``).

    class Calculator(Environment[CalcAction, CalcObservation, State]):
        @tool
        def add(self, a: int, b: int = 0) -> int:
            '''Add two integers.'''
            return a + b

A tool is a method of the environment, so it runs on the session's own instance (and on
its thread, for environments with thread affinity). Its arguments are validated by a
pydantic model built from the signature; that model's JSON Schema is the tool's input
schema, and the return annotation (when there is one) gives its output schema. Both are
checked for wire safety like any contract model, when the tools are first listed.

The registry is transport-agnostic: :func:`tools_of` returns the :class:`Tool` specs of
an environment class; the OpenEnv ``mcp`` frames, ``POST /mcp`` and a full MCP server
all use the same specs.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model
from pydantic_core import to_jsonable_python

from corral.contract.wiresafe import WireSafetyError, make_wire_safe

F = TypeVar("F", bound=Callable[..., Any])

TOOL_ATTR = "__corral_tool__"
"""Attribute the :func:`tool` decorator sets on a method."""

RESERVED_NAMES = frozenset({"reset", "step", "state", "close"})
"""Tool names that would shadow the environment API (OpenEnv reserves the same)."""

_CALL_KEYWORDS = frozenset({"method", "timeout"})
"""Keyword-only parameter names the session runner's call signature already uses."""

_REGISTRY_ATTR = "__corral_tools__"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@dataclass(frozen=True, slots=True)
class ToolMark:
    """What :func:`tool` records on a method: the public name and description overrides."""

    name: str | None
    description: str | None


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(*, name: str | None = None, description: str | None = None) -> Callable[[F], F]: ...


def tool(
    fn: F | None = None, /, *, name: str | None = None, description: str | None = None
) -> F | Callable[[F], F]:
    """Mark an environment method as a tool (usable bare, ``@tool``, or ``@tool(name=...)``).

    Args:
        fn: the method (sync or ``async def``).
        name: the tool's public name (default: the method name).
        description: shown to agents (default: the method's docstring).
    """

    def mark(method: F) -> F:
        if not callable(method) or isinstance(method, (staticmethod, classmethod)):
            raise TypeError(
                f"@tool decorates plain environment methods, got {method!r}; "
                "move the logic into an instance method"
            )
        setattr(method, TOOL_ATTR, ToolMark(name=name, description=description))
        return method

    if fn is not None:
        return mark(fn)
    return mark


class ToolArguments(BaseModel):
    """Base of the argument models built from tool signatures: unknown arguments fail."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


@dataclass(frozen=True)
class Tool:
    """One tool of an environment class.

    Attributes:
        name: the public name agents call.
        description: what it does (from the docstring unless overridden).
        method: the attribute name of the method on the environment.
        arguments: the pydantic model validating the call's arguments.
        returns: the return annotation (``Any`` when there is none).
        is_async: the method is ``async def``.
        positional: argument names passed positionally, in signature order.
    """

    name: str
    description: str
    method: str
    arguments: type[BaseModel]
    returns: Any
    is_async: bool
    positional: tuple[str, ...]

    @cached_property
    def input_schema(self) -> dict[str, Any]:
        """JSON Schema of the arguments object."""
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        return schema

    @cached_property
    def output_schema(self) -> dict[str, Any] | None:
        """JSON Schema of the return value, or None when the method is not annotated."""
        if self.returns is Any:
            return None
        return TypeAdapter(self.returns).json_schema()

    @cached_property
    def _result_adapter(self) -> TypeAdapter[Any] | None:
        return None if self.returns is Any else TypeAdapter(self.returns)

    def bind(self, arguments: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Validate ``arguments`` and return ``(args, kwargs)`` for the method call.

        Raises:
            pydantic.ValidationError: an argument is missing, unknown or mistyped.
        """
        model = self.arguments.model_validate(dict(arguments))
        values = {name: getattr(model, name) for name in type(model).model_fields}
        args = tuple(values.pop(name) for name in self.positional)
        return args, values

    def dump_result(self, value: Any) -> Any:
        """The JSON-compatible form of a return value (validated by the return type).

        Raises:
            pydantic.ValidationError / PydanticSerializationError: the value does not
            match the return annotation or has no JSON form.
        """
        adapter = self._result_adapter
        if adapter is None:
            return to_jsonable_python(value)
        return adapter.dump_python(adapter.validate_python(value), mode="json")


def tools_of(env_type: type) -> Mapping[str, Tool]:
    """The tools of an environment class, keyed by public name (built once, then cached).

    Raises:
        TypeError: a tool's name is reserved or duplicated, or its signature cannot be
            described (``*args``/``**kwargs``, unresolvable annotations, types that
            cannot cross the wire).
    """
    cached: dict[str, Tool] | None = env_type.__dict__.get(_REGISTRY_ATTR)
    if cached is not None:
        return cached
    tools: dict[str, Tool] = {}
    seen_methods: set[str] = set()
    for klass in env_type.__mro__:
        for attr, value in vars(klass).items():
            if attr in seen_methods:
                continue
            seen_methods.add(attr)
            mark = getattr(value, TOOL_ATTR, None)
            if not isinstance(mark, ToolMark):
                continue
            spec = _build(env_type, attr, value, mark)
            if spec.name in tools:
                raise TypeError(
                    f"{env_type.__name__} defines two tools named {spec.name!r} "
                    f"({tools[spec.name].method} and {attr}); give one of them @tool(name=...)"
                )
            tools[spec.name] = spec
    registry = dict(sorted(tools.items()))
    setattr(env_type, _REGISTRY_ATTR, registry)
    return registry


def _build(env_type: type, attr: str, fn: Callable[..., Any], mark: ToolMark) -> Tool:
    where = f"tool {env_type.__name__}.{attr}"
    name = mark.name or attr
    if name in RESERVED_NAMES:
        raise TypeError(f"{where}: the name {name!r} is reserved; use @tool(name='...')")
    if not _NAME.fullmatch(name):
        raise TypeError(f"{where}: the name {name!r} is not 1-128 letters, digits, '_', '-' or '.'")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise TypeError(f"{where}: cannot resolve its annotations ({exc})") from None
    params = list(inspect.signature(fn).parameters.values())[1:]  # drop self
    fields: dict[str, Any] = {}
    positional: list[str] = []
    for param in params:
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(
                f"{where}: *{param.name} / **{param.name} cannot be described as a JSON "
                "object; list each argument explicitly"
            )
        if param.kind is inspect.Parameter.KEYWORD_ONLY and param.name in _CALL_KEYWORDS:
            raise TypeError(
                f"{where}: a keyword-only argument may not be named {param.name!r}; "
                "rename it or make it positional"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
        if param.kind is not inspect.Parameter.KEYWORD_ONLY:
            positional.append(param.name)
    described = argument_docs(inspect.getdoc(fn) or "")
    for pname, (annotation, default) in list(fields.items()):
        if pname in described:
            fields[pname] = (annotation, Field(default, description=described[pname]))
    model_name = "".join(part.capitalize() for part in attr.split("_")) + "Arguments"
    try:
        arguments = create_model(model_name, __base__=ToolArguments, **fields)
        make_wire_safe(arguments)
        returns = hints.get("return", Any)
        if returns is not Any and returns is not type(None):
            result = create_model(
                f"{model_name.removesuffix('Arguments')}Result",
                __base__=ToolArguments,
                value=(returns, ...),
            )
            make_wire_safe(result)
    except WireSafetyError as exc:
        raise TypeError(f"{where}: {exc}") from None
    except Exception as exc:  # pydantic's schema errors for unsupported annotations
        raise TypeError(f"{where}: its signature cannot be described: {exc}") from None
    description = mark.description or _summary(inspect.getdoc(fn) or "")
    return Tool(
        name=name,
        description=description,
        method=attr,
        arguments=arguments,
        returns=returns,
        is_async=inspect.iscoroutinefunction(fn),
        positional=tuple(positional),
    )


_SECTION = re.compile(r"^(Args|Arguments|Parameters):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def argument_docs(doc: str) -> dict[str, str]:
    """Argument descriptions from a Google-style ``Args:`` section of a docstring."""
    out: dict[str, str] = {}
    lines = doc.splitlines()
    inside, indent, current = False, 0, ""
    for line in lines:
        stripped = line.strip()
        if not inside:
            inside = bool(_SECTION.match(stripped))
            continue
        if not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        if indent == 0:
            indent = depth
        if depth < indent or (depth == 0 and stripped.endswith(":")):
            break
        match = _ENTRY.match(stripped) if depth == indent else None
        if match:
            current = match.group(1).lstrip("*")
            out[current] = match.group(3).strip()
        elif current:
            out[current] = f"{out[current]} {stripped}".strip()
    return out


def _summary(doc: str) -> str:
    """The docstring without its ``Args:`` section (that goes into the input schema)."""
    kept: list[str] = []
    skipping = False
    for line in doc.splitlines():
        if _SECTION.match(line.strip()):
            skipping = True
            continue
        if skipping and line.strip() and not line.startswith((" ", "\t")):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept).strip()


__all__ = [
    "RESERVED_NAMES",
    "Tool",
    "ToolArguments",
    "ToolMark",
    "argument_docs",
    "tool",
    "tools_of",
]

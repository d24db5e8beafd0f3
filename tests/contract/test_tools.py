"""The tool registry: @tool methods, argument models, schemas, results."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from corral.contract import Action, Environment, Observation, State
from corral.contract.tools import TOOL_ATTR, ToolMark, tool, tools_of


class Act(Action):
    x: int = 0


class Point(BaseModel):
    x: float
    y: float


class Tools(Environment[Act, Observation, State]):
    @tool
    def add(self, a: int, b: int = 2) -> int:
        """Add two integers."""
        return a + b

    @tool(name="geo.norm", description="Length of a point.")
    def norm(self, p: Point, *, scale: float = 1.0) -> float:
        return (p.x**2 + p.y**2) ** 0.5 * scale

    @tool
    async def later(self, text: str) -> str:
        return text.upper()

    @tool
    def anything(self, value: Any = None):  # type: ignore[no-untyped-def]
        return {"value": value}

    def not_a_tool(self) -> None:
        """Plain methods are not tools."""


def test_discovery_names_descriptions_and_flags():
    tools = tools_of(Tools)
    assert list(tools) == ["add", "anything", "geo.norm", "later"]
    assert tools["add"].description == "Add two integers."
    assert tools["geo.norm"].description == "Length of a point."
    assert tools["geo.norm"].method == "norm"
    assert tools["later"].is_async and not tools["add"].is_async
    assert isinstance(getattr(Tools.add, TOOL_ATTR), ToolMark)
    assert tools_of(Tools) is tools  # built once


def test_schemas():
    tools = tools_of(Tools)
    add = tools["add"].input_schema
    assert add["type"] == "object" and add["required"] == ["a"]
    assert add["properties"]["b"]["default"] == 2
    assert add["additionalProperties"] is False and "title" not in add
    norm = tools["geo.norm"].input_schema
    assert "$defs" in norm and norm["properties"]["p"] == {"$ref": "#/$defs/Point"}
    assert tools["add"].output_schema == {"type": "integer"}
    assert tools["anything"].output_schema is None


def test_bind_validates_and_splits_positional_from_keyword():
    tools = tools_of(Tools)
    assert tools["add"].bind({"a": 1}) == ((1, 2), {})
    args, kwargs = tools["geo.norm"].bind({"p": {"x": 3, "y": 4}, "scale": 2})
    assert args == (Point(x=3, y=4),) and kwargs == {"scale": 2.0}
    for bad in ({}, {"a": "x"}, {"a": 1, "c": 3}):
        with pytest.raises(ValidationError):
            tools["add"].bind(bad)


def test_results_are_checked_against_the_return_type():
    add = tools_of(Tools)["add"]
    assert add.dump_result(3) == 3
    with pytest.raises(ValidationError):
        add.dump_result("three")
    assert tools_of(Tools)["anything"].dump_result({"p": Point(x=1, y=2)}) == {
        "p": {"x": 1.0, "y": 2.0}
    }


def test_calling_the_method_still_works():
    env = Tools()
    args, kwargs = tools_of(Tools)["add"].bind({"a": 5})
    assert env.add(*args, **kwargs) == 7


def test_subclasses_inherit_and_override_tools():
    class More(Tools):
        @tool
        def add(self, a: int, b: int = 10) -> int:
            return a * b

    tools = tools_of(More)
    assert tools["add"].bind({"a": 1}) == ((1, 10), {})
    assert "geo.norm" in tools
    assert tools_of(Tools)["add"].bind({"a": 1}) == ((1, 2), {})


def test_an_env_without_tools_has_none():
    class Plain(Environment[Act, Observation, State]):
        pass

    assert tools_of(Plain) == {}


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("def reset(self) -> None: ...", "reserved"),
        ("def bad(self, *args: int) -> None: ...", r"\*args"),
        ("def bad(self, **kw: int) -> None: ...", r"\*kw"),
        ("def bad(self, *, timeout: float) -> None: ...", "may not be named 'timeout'"),
        ("def bad(self, t: threading.Thread) -> None: ...", "cannot cross the wire"),
        ("def bad(self) -> threading.Thread: ...", "cannot cross the wire"),
        ("def bad(self, x: 'Missing') -> None: ...", "cannot resolve"),
    ],
)
def test_undescribable_tools_fail_with_the_reason(body, match):
    namespace: dict[str, Any] = {"threading": threading}
    exec(f"def make():\n    {body}\n    return {body.split('(')[0][4:]}", namespace)
    method = tool(namespace["make"]())

    klass = type("Broken", (Environment,), {method.__name__: method})
    with pytest.raises(TypeError, match=match) as info:
        tools_of(klass)
    assert "Broken" in str(info.value)


def test_duplicate_and_malformed_names():
    class Dup(Environment[Act, Observation, State]):
        @tool(name="same")
        def one(self) -> None: ...

        @tool(name="same")
        def two(self) -> None: ...

    with pytest.raises(TypeError, match="two tools named 'same'"):
        tools_of(Dup)

    class Spaces(Environment[Act, Observation, State]):
        @tool(name="has space")
        def one(self) -> None: ...

    with pytest.raises(TypeError, match="not 1-128 letters"):
        tools_of(Spaces)


def test_tool_rejects_non_methods():
    with pytest.raises(TypeError, match="plain environment methods"):
        tool(staticmethod(lambda: None))  # type: ignore[arg-type]

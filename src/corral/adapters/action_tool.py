"""An environment's action as a tool a model calls: its name and what it says (TRL, MCP).

TRL's ``environment_factory`` class and the MCP endpoint offer an environment the same
way: ``reset`` starts an episode, and one tool *named after the action* steps it, its
arguments the Action model's fields. The name is the Action model's name without
``Action``, in snake case (``WordleAction`` → ``wordle``, ``TicTacToeMove`` →
``tic_tac_toe_move``), unless the caller picks one; the description is the model's
docstring. What each face builds from them (a typed Python method, an MCP tool
descriptor) is its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

RESERVED = frozenset({"reset", "get_reward", "state", "close", "step"})
"""Names the action tool may not take (TRL's, MCP's and the environment API's)."""

IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
"""What a tool name must look like to be a Python method name too."""


def action_title(schema: Mapping[str, Any]) -> str:
    """The Action model's name, from its JSON Schema."""
    return str(schema.get("title") or "Action")


def action_stem(schema: Mapping[str, Any]) -> str:
    """The Action model's name without ``Action`` (``Act`` when nothing is left)."""
    return action_title(schema).removesuffix("Action") or "Act"


def action_tool_name(schema: Mapping[str, Any], chosen: str | None = None) -> str:
    """The action tool's name: ``chosen``, or the snake-case stem of the Action model.

    Raises:
        ValueError: the name is reserved or not an identifier (the message says how to
            choose another).
    """
    name = chosen or snake(action_stem(schema))
    if name in RESERVED or not IDENTIFIER.match(name):
        raise ValueError(
            f"the action tool's name {name!r} is reserved ({', '.join(sorted(RESERVED))}) or "
            "not a Python identifier; choose another (tool_name=...)"
        )
    return name


def action_summary(schema: Mapping[str, Any]) -> str:
    """What the action tool does, in one paragraph: the Action model's description."""
    text = str(schema.get("description") or f"Take one {action_title(schema)}.")
    return " ".join(text.split())


def snake(text: str) -> str:
    """``TicTacToe`` → ``tic_tac_toe`` (non-alphanumerics become single underscores)."""
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text)
    return re.sub(r"[^0-9A-Za-z]+", "_", words).strip("_").lower() or "act"


def describe_field(field: str, node: Mapping[str, Any]) -> str:
    """One argument's line for a model to read: its description plus the constraints
    to respect (bounds, lengths, pattern, default)."""
    text = str(node.get("description") or node.get("title") or field)
    text = " ".join(text.split())
    notes: list[str] = []
    for key, label in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("exclusiveMaximum", "<"),
    ):
        if key in node:
            notes.append(f"{label} {node[key]}")
    if "minLength" in node or "maxLength" in node:
        notes.append(f"length {node.get('minLength', 0)}..{node.get('maxLength', 'any')}")
    if "pattern" in node:
        notes.append(f"matching {node['pattern']}")
    if "properties" in node:
        notes.append(f"an object with fields {sorted(node['properties'])}")
    if "default" in node:
        notes.append(f"default {node['default']!r}")
    return text + (f" ({'; '.join(notes)})" if notes else "")


__all__ = [
    "IDENTIFIER",
    "RESERVED",
    "action_stem",
    "action_summary",
    "action_title",
    "action_tool_name",
    "describe_field",
    "snake",
]

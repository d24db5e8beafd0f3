"""Instances from JSON Schemas: a small valid example, and an action the schema rejects.

``corral validate`` plays an environment it knows only by its schemas: it needs an action
to send (:func:`example_for`, which prefers the schema's own ``examples``, ``default``,
``const`` or ``enum``, else the smallest value the constraints allow) and one the server
must refuse (:func:`invalid_action_for`). Checking an instance against a schema
(:func:`schema_problem`) needs the optional ``jsonschema`` package (``corral[validate]``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from corral.contract.refs import RefError, SchemaReader


def schema_validator(schema: dict[str, Any]) -> Any:
    """A JSON Schema (2020-12) validator of ``schema``.

    Raises:
        ImportError: jsonschema is not installed; the message says how to install it.
    """
    try:
        from jsonschema import Draft202012Validator
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError("schema checks need jsonschema: pip install 'corral[validate]'") from None
    return Draft202012Validator(schema)


def schema_problem(schema: dict[str, Any], instance: Any) -> str | None:
    """The first way ``instance`` violates ``schema`` (``"path: message"``), or None.

    Raises:
        ImportError: jsonschema is not installed.
    """
    errors = sorted(schema_validator(schema).iter_errors(instance), key=lambda e: list(e.path))
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(p) for p in first.path) or "(root)"
    return f"{where}: {first.message}"


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its references followed.

    Raises:
        RefError: a reference does not resolve or is a cycle (a ``ValueError``).
    """
    return dict(SchemaReader(schema).deref(node))


def example_for(schema: dict[str, Any], node: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A small instance of ``node`` (default: the whole ``schema``), or raise ValueError.

    Uses ``examples``/``default``/``const``/``enum`` where the schema gives them, else
    the smallest value its constraints allow. The caller validates the result. A
    reference that does not resolve, or a cycle of references, is a ``ValueError``
    (:class:`~corral.contract.refs.RefError`), never a ``RecursionError``.
    """
    node = _resolve(schema, schema if node is None else node)
    if depth > 12:
        raise ValueError("schema nests too deeply to synthesize an example")
    for key in ("examples",):
        if isinstance(node.get(key), list) and node[key]:
            return node[key][0]
    if "const" in node:
        return node["const"]
    if isinstance(node.get("enum"), list) and node["enum"]:
        return node["enum"][0]
    if "default" in node:
        return node["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = node.get(key)
        if isinstance(options, list) and options:
            for option in options:
                with contextlib.suppress(ValueError):
                    return example_for(schema, option, depth + 1)
            raise ValueError(f"no {key} branch could be synthesized")
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in node:
        props = node.get("properties", {})
        return {
            name: example_for(schema, props.get(name, {}), depth + 1)
            for name in node.get("required", [])
        }
    if kind == "string":
        return "a" * max(1, int(node.get("minLength", 1)))
    if kind in ("integer", "number"):
        low = node.get("minimum", node.get("exclusiveMinimum", 0))
        value = low + 1 if "exclusiveMinimum" in node else low
        high = node.get("maximum")
        if high is not None and value > high:
            value = high
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    if kind == "array":
        items = node.get("items", {})
        return [example_for(schema, items, depth + 1) for _ in range(int(node.get("minItems", 0)))]
    if kind == "null":
        return None
    raise ValueError(f"cannot synthesize a value for schema {node!r}")


def invalid_action_for(schema: dict[str, Any], valid: dict[str, Any]) -> dict[str, Any] | None:
    """An action the schema rejects (an unknown field, or a mistyped one), or None."""
    candidates: list[dict[str, Any]] = []
    if schema.get("additionalProperties") is False:
        candidates.append({**valid, "__corral_validate_unknown__": 1})
    for name, prop in schema.get("properties", {}).items():
        try:
            kind = _resolve(schema, prop).get("type")
        except RefError:
            continue
        wrong = {"string": 12345, "integer": "x", "number": "x", "boolean": "x"}.get(str(kind))
        if wrong is not None:
            candidates.append({**valid, name: wrong})
            candidates.append({**valid, name: [[], {}]})
    for candidate in candidates:
        if schema_problem(schema, candidate) is not None:
            return candidate
    return None

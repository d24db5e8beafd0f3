"""Values as people and language models read them: arrays as numbers, never base64.

    readable(obs)          # {"board": [[0, 1, -1], [0, 0, 0], [1, 0, 0]], "turn": "x"}
    readable_json(obs)     # the same as one line of JSON text

The wire carries an array as ``{"dtype", "shape", "data": <base64>}`` (JSON) or raw bytes
(msgpack): right for machines, unreadable for a model prompted with it or a person looking
at a tool result. :func:`readable` is the one conversion every text face uses (TRL's tool
results, MCP's ``content`` and ``structuredContent``, the web UI): a model's fields (all of
them: leave out what you do not want shown with ``exclude``), with each array as nested
lists of numbers. An array of more than ``max_values`` numbers is cut to its first rows
and says so::

    {"dtype": "uint8", "shape": [84, 84, 3], "values": [[[...], ...], ...],
     "cut": "first 3 of 84 rows shown (756 of 21,168 values)"}

An array already in its JSON wire form (a dict of exactly ``dtype``, ``shape`` and a
base64 ``data`` string, as a value that crossed the wire in JSON is) reads the same as
the array. Floats print as their shortest round-trip form at their own precision (a
``float32`` 0.3 is ``0.3``, not ``0.30000001192092896``); non-finite ones, which JSON
cannot hold, are the strings ``"nan"``, ``"inf"`` and ``"-inf"``.

:func:`readable_schema` rewrites a JSON Schema the same way (each array field becomes
"nested lists, or the cut form"), so a structured result still matches the output schema
it is published with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel

from corral.contract.arrays import ArraySpec

MAX_VALUES = 1000
"""Numbers of one array shown before it is cut (a prompt's worth, ~3-4k tokens)."""

NDARRAY_KEY = "x-corral-ndarray"
"""The JSON Schema keyword marking an array field (:mod:`corral.contract.arrays`)."""

_WIRE_KEYS = frozenset({"dtype", "shape", "data"})
_ANY = ArraySpec()


def readable(value: Any, *, max_values: int = MAX_VALUES, exclude: Sequence[str] = ()) -> Any:
    """``value`` as plain JSON-able data with arrays as numbers (see the module docstring).

    Args:
        value: a pydantic model (its fields, by alias), a mapping, a sequence, an array,
            or a scalar.
        max_values: numbers of one array shown before it is cut.
        exclude: top-level fields of a model or mapping to leave out.
    """
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="python", by_alias=True, exclude=set(exclude) or None)
    elif exclude and isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in exclude}
    return _walk(value, max_values)


def readable_json(value: Any, *, max_values: int = MAX_VALUES, exclude: Sequence[str] = ()) -> str:
    """:func:`readable` as one line of JSON text."""
    return orjson.dumps(readable(value, max_values=max_values, exclude=exclude)).decode()


OBSERVATION_OUTCOME_FIELDS = ("done", "truncated", "reward", "reward_components", "metadata")
"""An Observation's base fields: the outcome of a step, not what the agent observes."""


def observation_text(observation: BaseModel, *, max_values: int = MAX_VALUES) -> str:
    """An observation as a model or a person reads it after an action: its own fields as
    one line of JSON (arrays as numbers; the outcome fields ``done``, ``reward``,
    ``metadata``... left out), plus a line saying so when the episode is over.

    The default text of TRL's tool results and of the MCP tools' ``content``.
    """
    own = [f for f in OBSERVATION_OUTCOME_FIELDS if f in type(observation).model_fields]
    text = readable_json(observation, max_values=max_values, exclude=own)
    if getattr(observation, "done", False):
        truncated = getattr(observation, "truncated", False)
        text += "\nThe episode is over" + (" (truncated)." if truncated else ".")
    return text


def readable_array(array: np.ndarray[Any, Any], max_values: int = MAX_VALUES) -> Any:
    """One array as nested lists, or the cut form when it holds more than ``max_values``."""
    if array.size <= max_values:
        return _numbers(array)
    index, rows = _head(array.shape, max_values)
    head = array[index]
    total = f"{array.size:,}"
    if rows is None:
        where = "the start of the first row"
    else:
        where = f"first {rows} of {array.shape[0]:,} rows" if array.ndim > 1 else ""
    shown = f"{head.size:,} of {total} values"
    return {
        "dtype": array.dtype.name,
        "shape": list(array.shape),
        "values": _numbers(head),
        "cut": f"{where} shown ({shown})" if where else f"first {shown} shown",
    }


def readable_schema(schema: Mapping[str, Any], *, max_values: int = MAX_VALUES) -> dict[str, Any]:
    """``schema`` with each array node (``x-corral-ndarray``) describing what
    :func:`readable` makes of it: nested lists of numbers, or the cut form."""
    out = _schema(schema, max_values)
    assert isinstance(out, dict)
    return out


# -- values ---------------------------------------------------------------------------


def _walk(value: Any, max_values: int) -> Any:
    if isinstance(value, np.ndarray):
        return readable_array(value, max_values)
    if isinstance(value, BaseModel):
        return _walk(value.model_dump(mode="python", by_alias=True), max_values)
    if isinstance(value, Mapping):
        if _is_wire_array(value):
            try:
                return readable_array(_ANY.validate(dict(value)), max_values)
            except ValueError:
                pass  # not an array after all: shown as the mapping it is
        return {str(k): _walk(v, max_values) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_walk(v, max_values) for v in value]
    if isinstance(value, np.generic):
        return _scalar(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else _non_finite(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value):,} bytes>"
    if value is None or isinstance(value, (str, int)):
        return value
    from pydantic_core import to_jsonable_python  # dates, enums, UUIDs, paths...

    return to_jsonable_python(value)


def _is_wire_array(value: Mapping[Any, Any]) -> bool:
    return (
        len(value) == 3
        and set(value) == _WIRE_KEYS
        and isinstance(value["dtype"], str)
        and isinstance(value["data"], str)
        and isinstance(value["shape"], list)
    )


def _numbers(array: np.ndarray[Any, Any]) -> Any:
    kind = array.dtype.kind
    if kind == "f" and array.dtype.itemsize < 8:
        # tolist() widens to float64 and shows float32's rounding error; numpy's str of
        # the array's own scalar is its shortest round-trip form.
        return _nest([_float(float(str(v))) for v in array.reshape(-1)], array.shape)
    if kind == "c":
        return _nest([str(v) for v in array.reshape(-1).tolist()], array.shape)
    values = array.tolist()
    if kind == "f" and not bool(np.isfinite(array).all()):
        return _finite(values)
    return values


def _nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    if not shape:
        return flat[0]
    for size in reversed(shape[1:]):
        flat = [flat[i : i + size] for i in range(0, len(flat), size)] if size else []
    return flat


def _finite(values: Any) -> Any:
    if isinstance(values, list):
        return [_finite(v) for v in values]
    return _float(values)


def _float(value: float) -> Any:
    return value if math.isfinite(value) else _non_finite(value)


def _non_finite(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _scalar(value: np.generic) -> Any:
    if isinstance(value, np.floating):
        return _float(float(str(value)))
    if isinstance(value, np.complexfloating):
        return str(value)
    return value.item()


def _head(shape: tuple[int, ...], max_values: int) -> tuple[tuple[slice, ...], int | None]:
    """The index of the leading part of an array of ``shape`` holding at most
    ``max_values`` numbers, and how many rows (first-axis items) it keeps whole (None
    when even one row is too big and only the start of the first is kept)."""
    index: list[slice] = []
    for axis, length in enumerate(shape):
        inner = math.prod(shape[axis + 1 :])
        if inner <= max_values:
            keep = max(1, min(length, max_values // max(inner, 1)))
            index.append(slice(0, keep))
            return tuple(index), (keep if axis == 0 else None)
        index.append(slice(0, 1))  # one item of this axis, cut further inside it
    return tuple(index), None  # pragma: no cover - the last axis always fits


# -- schemas --------------------------------------------------------------------------


def _schema(node: Any, max_values: int) -> Any:
    if isinstance(node, Mapping):
        info = node.get(NDARRAY_KEY)
        if isinstance(info, Mapping):
            return _array_schema(info, node, max_values)
        return {k: _schema(v, max_values) for k, v in node.items()}
    if isinstance(node, list):
        return [_schema(v, max_values) for v in node]
    return node


_LEAVES: dict[str, dict[str, Any]] = {
    "b": {"type": "boolean"},
    "i": {"type": "integer"},
    "u": {"type": "integer"},
    "f": {"type": ["number", "string"]},  # "nan", "inf" and "-inf" are strings
    "c": {"type": "string"},
}
_ANY_LEAF: dict[str, Any] = {"type": ["boolean", "integer", "number", "string"]}


def _array_schema(info: Mapping[str, Any], node: Mapping[str, Any], max_values: int) -> Any:
    dtype = info.get("dtype")
    leaf = _LEAVES.get(np.dtype(dtype).kind, _ANY_LEAF) if isinstance(dtype, str) else _ANY_LEAF
    shape = info.get("shape")
    nested: dict[str, Any]
    if isinstance(shape, list):
        nested = leaf
        for size in reversed(shape):
            nested = {"type": "array", "items": nested}
            if isinstance(size, int):
                nested["minItems"] = nested["maxItems"] = size
    else:  # any number of dimensions
        nested = (
            {"type": ["array", *leaf["type"]]}
            if isinstance(leaf["type"], list)
            else {"type": ["array", leaf["type"]]}
        )
    cut = {
        "type": "object",
        "properties": {
            "dtype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "values": {"type": "array"},
            "cut": {"type": "string"},
        },
        "required": ["dtype", "shape", "values", "cut"],
    }
    out: dict[str, Any] = {
        "anyOf": [nested, cut],
        "description": str(node.get("description") or "")
        + (" " if node.get("description") else "")
        + f"(an array as nested lists of numbers; over {max_values:,} values, its first "
        "rows with a note of the cut)",
        NDARRAY_KEY: dict(info),
    }
    if "title" in node:
        out["title"] = node["title"]
    return out


__all__ = [
    "MAX_VALUES",
    "NDARRAY_KEY",
    "OBSERVATION_OUTCOME_FIELDS",
    "observation_text",
    "readable",
    "readable_array",
    "readable_json",
    "readable_schema",
]

"""Gymnasium ``info`` dicts on the wire.

``info`` values are often numpy scalars or arrays. On the serving side
:func:`wire_value` turns them into values both codecs carry (arrays stay arrays, so
msgpack sends them as raw bytes; the JSON codec gets base64 wire dicts through
:func:`json_value`); on the client side :func:`array_value` turns wire dicts back into
arrays, so ``info`` looks the same whichever codec carried it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from corral.contract.arrays import ArraySpec, to_wire_dict


def wire_value(value: Any) -> Any:
    """``value`` in a form both codecs carry: numpy scalars as Python, arrays kept.

    Used for Gymnasium ``info`` dicts: tuples become lists, non-string keys strings,
    and objects with no wire form their ``repr`` (so nothing disappears silently).
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biufc":
            return value
        return [wire_value(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, Mapping):
        return {str(k): wire_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [wire_value(v) for v in value]
    return repr(value)


def json_value(value: Any) -> Any:
    """``value`` with every ndarray replaced by its base64 wire dict (for JSON)."""
    if isinstance(value, np.ndarray):
        return to_wire_dict(value)
    if isinstance(value, Mapping):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_value(v) for v in value]
    return value


_WIRE_ARRAY_KEYS = frozenset({"dtype", "shape", "data"})


def array_value(value: Any) -> Any:
    """``value`` with every array wire dict (``{dtype, shape, data}``) decoded."""
    if isinstance(value, Mapping):
        if set(value) == _WIRE_ARRAY_KEYS:
            try:
                return ArraySpec().validate(dict(value))
            except ValueError:
                pass
        return {k: array_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [array_value(v) for v in value]
    return value

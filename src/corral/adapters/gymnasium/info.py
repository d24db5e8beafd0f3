"""Gymnasium ``info`` dicts on the wire.

``info`` values are often numpy scalars or arrays. On the serving side
:func:`wire_value` turns them into values both codecs carry (arrays stay arrays, so
msgpack sends them as raw bytes, and numpy scalars travel as 0-d arrays so that their
dtype survives; the JSON codec gets base64 wire dicts through :func:`json_value`). On the
client side :func:`array_value` turns wire dicts back into arrays and 0-d arrays back into
numpy scalars, so ``info`` looks the same whichever codec carried it.

What does not survive: tuples and sets come back as lists, non-string keys as strings, a
0-d array as a numpy scalar, and an object with no wire form as its ``repr``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from corral.contract.arrays import ArraySpec, to_wire_dict


def wire_value(value: Any) -> Any:
    """``value`` in a form both codecs carry (see the module docstring).

    Objects with no wire form become their ``repr``, so nothing disappears silently.
    """
    if type(value) is dict:  # every step's info: no ABC check (a third of the call)
        return {k if type(k) is str else str(k): wire_value(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biufc":
            return value
        return [wire_value(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return np.asarray(value) if value.dtype.kind in "biufc" else value.item()
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, Mapping):
        return {str(k): wire_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [wire_value(v) for v in value]
    return repr(value)


def json_value(value: Any) -> Any:
    """``value`` with every ndarray (and numpy scalar) replaced by its base64 wire dict."""
    if isinstance(value, (np.ndarray, np.generic)):
        return to_wire_dict(np.asarray(value))
    if isinstance(value, Mapping):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_value(v) for v in value]
    return value


_WIRE_ARRAY_KEYS = frozenset({"dtype", "shape", "data"})


def array_value(value: Any, *, scalars: bool = False) -> Any:
    """``value`` with every array wire dict (``{dtype, shape, data}``) decoded; with
    ``scalars``, 0-d arrays become numpy scalars (what the environment put in ``info``)."""
    if type(value) is dict and not value:  # most steps' info: no ABC check, no copy
        return value
    if isinstance(value, np.ndarray):
        return value[()] if scalars and value.ndim == 0 else value
    if isinstance(value, Mapping):
        if len(value) == len(_WIRE_ARRAY_KEYS) and value.keys() == _WIRE_ARRAY_KEYS:
            try:
                return array_value(ArraySpec().validate(dict(value)), scalars=scalars)
            except ValueError:
                pass
        return {k: array_value(v, scalars=scalars) for k, v in value.items()}
    if isinstance(value, list):
        return [array_value(v, scalars=scalars) for v in value]
    return value

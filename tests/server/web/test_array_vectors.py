"""The web UI's array vectors (``array_vectors.json``) are what numpy says.

The UI's node tests (``js/arrays.test.js``) check that the page decodes each vector's
``value`` (corral's JSON form of an array) to its ``values``; this checks those values
against numpy, so the two sides cannot drift: the numbers a person reads in the browser
are the array's. Floats are the shortest decimal that reads back as the same value of
their width (numpy's ``str``); 64-bit integers past 2**53 are text; complex values are
``re+imj`` text.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from corral.contract.arrays import to_wire_dict

VECTORS = json.loads((Path(__file__).with_name("array_vectors.json")).read_text())


def _shown_equals(shown: Any, value: Any, dtype: np.dtype[Any]) -> bool:
    if dtype.kind == "b":
        return shown is bool(value)
    if dtype.kind in "iu":
        exact = int(value)
        return shown == (exact if abs(exact) < 2**53 else str(exact))
    if dtype.kind == "f":
        # The same value of the dtype's width, and numpy's own shortest text for it.
        return bool(dtype.type(shown) == value) and shown == float(str(value))
    if dtype.kind == "c":
        parsed = complex(shown)
        part = np.float32 if dtype.itemsize == 8 else np.float64
        return bool(part(parsed.real) == value.real and part(parsed.imag) == value.imag)
    raise AssertionError(f"unexpected dtype {dtype}")


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_each_vector_is_what_numpy_reads(vector: dict[str, Any]) -> None:
    wire = vector["value"]
    dtype = np.dtype(wire["dtype"])
    array = np.frombuffer(base64.b64decode(wire["data"]), dtype=dtype).reshape(wire["shape"])
    assert to_wire_dict(array) == wire  # corral sends exactly this for that array
    flat = array.reshape(-1)
    assert len(vector["values"]) == flat.size
    for shown, value in zip(vector["values"], flat, strict=True):
        assert _shown_equals(shown, value, dtype), (vector["name"], shown, value)


def test_the_vectors_cover_every_kind_and_width_corral_sends() -> None:
    seen = {np.dtype(v["value"]["dtype"]).str[1:] for v in VECTORS}
    wanted = {"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"}
    assert wanted <= seen

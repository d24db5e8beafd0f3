"""The msgpack extension for numpy arrays: dtype + shape + raw bytes, zero-copy decode.

Layout of the extension payload (type code :data:`NDARRAY_EXT`)::

    u8 len(dtype.str) | dtype.str (ASCII) | u8 ndim | ndim x u64 LE shape | raw C-order bytes

numpy is imported only when an array is actually encoded or decoded, so the protocol
core does not require it.
"""

from __future__ import annotations

import struct
from typing import Any

from corral.errors import BadFrame

NDARRAY_EXT = 1
"""msgpack extension type code for numpy arrays."""

_WIRE_KINDS = frozenset("biufc")


def is_ndarray(value: Any) -> bool:
    """True for a numpy ndarray (checked without importing numpy)."""
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray"


def is_numpy_scalar(value: Any) -> bool:
    """True for a numpy scalar such as ``np.float32(1.0)``."""
    return type(value).__module__ == "numpy" and hasattr(value, "item")


_HEADERS: dict[tuple[Any, tuple[int, ...]], bytes] = {}
"""Payload headers by (dtype, shape): a batch of observations repeats one or a few."""

_MAX_HEADERS = 256
"""Past this many shapes (variable-length arrays), headers are packed, not kept."""


def encode_ndarray(array: Any) -> bytes:
    """The extension payload for ``array``.

    Raises:
        TypeError: for object or structured dtypes, which need pickle.
    """
    import numpy as np

    dtype = array.dtype
    if dtype.kind not in _WIRE_KINDS:
        raise TypeError(f"arrays of dtype {dtype} cannot cross the wire")
    # ascontiguousarray would turn a 0-d array into shape (1,): copy only when needed.
    contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    shape = contiguous.shape
    header = _HEADERS.get((dtype, shape))
    if header is None:
        # Packing the header costs four times the copy of a small array's data.
        name = dtype.str.encode("ascii")
        header = struct.pack(f"<B{len(name)}sB{len(shape)}Q", len(name), name, len(shape), *shape)
        if len(_HEADERS) < _MAX_HEADERS:
            _HEADERS[(dtype, shape)] = header
    return b"".join((header, contiguous.data))  # one copy of the data, not two


_LAYOUTS: dict[bytes, tuple[Any, tuple[int, ...], int]] = {}
"""Checked (dtype, shape, data size) by payload header, for the same reason as
:data:`_HEADERS`: parsing a header costs more than building the array."""


def decode_ndarray(payload: bytes) -> Any:
    """Rebuild an array from its payload without copying the data (read-only result).

    Raises:
        BadFrame: the payload is malformed.
    """
    import numpy as np

    try:
        dlen = payload[0]
        offset = 2 + dlen + 8 * payload[1 + dlen]
    except IndexError:
        raise BadFrame("malformed array extension: truncated header") from None
    header = bytes(payload[:offset])
    layout = _LAYOUTS.get(header)
    if layout is None:
        layout = _layout(payload, dlen, offset)
        if len(_LAYOUTS) < _MAX_HEADERS:
            _LAYOUTS[header] = layout
    dtype, shape, size = layout
    if len(payload) - offset != size:
        raise BadFrame(
            f"array extension has {len(payload) - offset} data bytes, shape {shape} "
            f"of {dtype} needs {size}"
        )
    # One constructor call over the payload: a third of frombuffer(...).reshape(...).
    return np.ndarray(shape, dtype, payload, offset)


def _layout(payload: bytes, dlen: int, offset: int) -> tuple[Any, tuple[int, ...], int]:
    """The dtype, shape and data size a payload's header announces, checked."""
    import numpy as np

    try:
        dtype = np.dtype(bytes(payload[1 : 1 + dlen]).decode("ascii"))
        ndim = payload[1 + dlen]
        shape = struct.unpack_from(f"<{ndim}Q", payload, 2 + dlen)
    except (struct.error, TypeError, ValueError, UnicodeDecodeError) as exc:
        raise BadFrame(f"malformed array extension: {exc}") from None
    if dtype.kind not in _WIRE_KINDS:
        raise BadFrame(f"array dtype {dtype} is not allowed on the wire")
    count = 1
    for n in shape:
        count *= n
    return dtype, shape, count * dtype.itemsize

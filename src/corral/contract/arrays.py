"""numpy arrays as first-class contract fields.

    class Frame(Observation):
        pixels: NDArray                        # any dtype and shape
        board: Array(dtype="int8", shape=(8, 8))  # checked dtype and shape

On the binary (msgpack) codec an array crosses as dtype + shape + raw bytes and is
decoded without a copy (the array is then read-only: ``.copy()`` it to write). On the
JSON codec it crosses as ``{"dtype", "shape", "data": <base64>}``. Never as lists of
floats. A dimension of ``None`` in ``shape`` accepts any length; ``dtype=None`` any dtype.
Validation accepts an ndarray, the wire dict, or nested lists (converted with the dtype),
defaults included (``default_factory=lambda: [[0, 0], [0, 0]]`` becomes an array).
Object and structured dtypes are refused: they cannot cross the wire without pickle.

Models with array fields compare equal when their arrays have the same dtype, shape and
values (:func:`values_equal`; ``==`` on arrays alone is element-wise and has no truth
value).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

WIRE_KINDS = frozenset("biufc")
"""numpy dtype kinds that cross the wire: bool, signed, unsigned, float, complex."""


def check_dtype(dtype: np.dtype[Any]) -> None:
    """Raise ``ValueError`` for a dtype that cannot cross the wire."""
    if dtype.kind not in WIRE_KINDS:
        raise ValueError(
            f"arrays of dtype {dtype} cannot cross the wire; use a numeric or bool dtype"
        )


class ArraySpec:
    """The pydantic schema of an array field with an optional dtype and shape."""

    validates_default = True
    """Read by :func:`~corral.contract.wiresafe.make_wire_safe`: a default of an array
    field (nested lists, often) is validated into an array like any value."""

    def __init__(self, dtype: str | None = None, shape: Sequence[int | None] | None = None):
        self.dtype = np.dtype(dtype) if dtype is not None else None
        if self.dtype is not None:
            check_dtype(self.dtype)
        self.shape = tuple(shape) if shape is not None else None
        fixed = self.dtype is not None and self.shape is not None and None not in self.shape
        self._exact = (self.dtype, self.shape) if fixed else None
        """The dtype and shape when both are fixed: an array with exactly them is valid
        as it is (the fast path of every observation)."""

    def __repr__(self) -> str:
        return f"Array(dtype={self.dtype and self.dtype.str!r}, shape={self.shape!r})"

    def validate(self, value: Any) -> np.ndarray[Any, Any]:
        """Turn an ndarray, a wire dict or nested lists into a checked ndarray."""
        exact = self._exact
        if (
            exact is not None
            and type(value) is np.ndarray
            and value.shape == exact[1]
            and value.dtype == exact[0]
        ):
            return value  # nothing to convert or check
        if isinstance(value, dict):
            array = _from_wire_dict(value)
        elif isinstance(value, np.ndarray):
            array = value
        else:
            try:
                array = np.asarray(value, dtype=self.dtype)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"cannot make an array from {type(value).__name__}: {exc}"
                ) from None
        check_dtype(array.dtype)
        if self.dtype is not None and array.dtype != self.dtype:
            if not np.can_cast(array.dtype, self.dtype, casting="same_kind"):
                raise ValueError(f"expected dtype {self.dtype}, got {array.dtype}")
            array = array.astype(self.dtype)
        if self.shape is not None and (
            array.ndim != len(self.shape)
            or any(
                want is not None and want != got
                for want, got in zip(self.shape, array.shape, strict=True)
            )
        ):
            raise ValueError(f"expected shape {self.shape}, got {array.shape}")
        return array

    @staticmethod
    def serialize(value: np.ndarray[Any, Any]) -> Any:
        """JSON mode base64s the array; python mode keeps it as it is (the binary codec
        packs it) without calling this (``when_used="json"``: no Python call per array
        of every observation dumped)."""
        return to_wire_dict(value)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            self.validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                self.serialize, when_used="json"
            ),
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        dtype: dict[str, Any] = {"type": "string"}
        if self.dtype is not None:
            dtype["const"] = self.dtype.str
        shape: dict[str, Any] = {"type": "array", "items": {"type": ["integer", "null"]}}
        if self.shape is not None:
            shape = {
                "type": "array",
                "prefixItems": [
                    {"type": "integer"} if n is None else {"const": n} for n in self.shape
                ],
                "minItems": len(self.shape),
                "maxItems": len(self.shape),
            }
        return {
            "type": "object",
            "title": "NDArray",
            "properties": {
                "dtype": dtype,
                "shape": shape,
                "data": {"type": "string", "contentEncoding": "base64"},
            },
            "required": ["dtype", "shape", "data"],
            "x-corral-ndarray": {
                "dtype": self.dtype.str if self.dtype is not None else None,
                "shape": list(self.shape) if self.shape is not None else None,
            },
        }


def to_wire_dict(array: np.ndarray[Any, Any]) -> dict[str, Any]:
    """The JSON form of an array: dtype string, shape list, base64 of C-order bytes."""
    # ascontiguousarray would turn a 0-d array into shape (1,): copy only when needed.
    contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    return {
        "dtype": contiguous.dtype.str,
        "shape": list(contiguous.shape),
        "data": base64.b64encode(contiguous.data).decode("ascii"),
    }


def _from_wire_dict(value: dict[str, Any]) -> np.ndarray[Any, Any]:
    try:
        dtype = np.dtype(value["dtype"])
        shape = tuple(int(n) for n in value["shape"])
        data = value["data"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"an array must be {{dtype, shape, data}}: {exc}") from None
    check_dtype(dtype)
    raw = base64.b64decode(data, validate=True) if isinstance(data, str) else bytes(data)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"array data has {len(raw)} bytes, shape {shape} needs {expected}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def values_equal(a: Any, b: Any) -> bool:
    """Deep equality of two field values where arrays compare by dtype, shape and values
    (NaN unequal to itself, as for a float field) and models field by field."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b))
        )
    if isinstance(a, BaseModel):
        return isinstance(b, BaseModel) and models_equal(a, b)
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(values_equal(v, b[k]) for k, v in a.items())
        )
    if isinstance(a, list | tuple):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(values_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    try:
        return bool(a == b)
    except ValueError:  # another element-wise type (a pandas object, say)
        return False


def models_equal(a: BaseModel, b: BaseModel) -> bool:
    """pydantic's model equality (same class, fields, extra and private attributes), with
    array fields compared by :func:`values_equal`."""
    if type(a) is not type(b):
        return False
    fields = type(a).model_fields
    return (
        all(values_equal(a.__dict__.get(name), b.__dict__.get(name)) for name in fields)
        and values_equal(a.__pydantic_extra__ or {}, b.__pydantic_extra__ or {})
        and values_equal(
            getattr(a, "__pydantic_private__", None) or {},
            getattr(b, "__pydantic_private__", None) or {},
        )
    )


def Array(dtype: str | None = None, shape: Sequence[int | None] | None = None) -> Any:
    """An ndarray field type with a checked dtype and/or shape (see module docstring)."""
    return Annotated[np.ndarray, ArraySpec(dtype, shape)]


NDArray = Annotated[np.ndarray, ArraySpec()]
"""An ndarray field of any dtype and shape."""

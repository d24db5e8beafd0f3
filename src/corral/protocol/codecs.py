"""Codecs: how messages become frames and back, and how models become wire objects.

Two codecs sit behind one interface. ``msgpack`` (binary frames, the default for corral
clients) keeps ``bytes`` as bytes; ``json`` (text frames, via orjson) is for debugging
and for peers without msgpack. The codec is chosen by the WebSocket subprotocol.

A codec does two jobs: ``encode``/``decode`` turn a message dict into a frame and back,
and ``dump``/``load`` turn a pydantic model into the wire object placed in a message
and back, in the representation that codec carries best.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import functools
import ipaddress
import pathlib
import uuid
from typing import Any, Protocol, TypeVar

import msgpack
import orjson
from pydantic import BaseModel, TypeAdapter

from corral.errors import BadFrame, BadMessage
from corral.protocol.arrays import (
    NDARRAY_EXT,
    decode_ndarray,
    encode_ndarray,
    is_ndarray,
    is_numpy_scalar,
)

M = TypeVar("M", bound=BaseModel)

Frame = bytes | str

PROTOCOL = "corral/1"
"""The native protocol version carried in the handshake."""


PYTHON_DUMP = "__corral_python_dump__"
"""A model class may set this attribute to a function of one of its instances returning
exactly the dict pydantic's python-mode dump gives (same keys in the same order, equal
values), made without pydantic's serializer: the binary codec then dumps instances of
exactly that class with it (never a subclass's, which may add fields). Served Gymnasium
observations do: pydantic takes ~2 µs to pass one ndarray field through, more than the
rest of the dump. The JSON codec ignores it (its dump differs: base64 arrays)."""


class Codec(Protocol):
    """Encodes messages to frames and models to wire objects (see module docstring)."""

    name: str
    subprotocol: str
    binary: bool

    def encode(self, message: dict[str, Any]) -> Frame:
        """Encode a message dict into one frame."""
        ...

    def decode(self, frame: Frame) -> dict[str, Any]:
        """Decode one frame into a message dict; raise ``BadFrame``/``BadMessage``."""
        ...

    def dump(self, model: BaseModel) -> Any:
        """The wire object for ``model``."""
        ...

    def load(self, model_type: type[M], obj: Any) -> M:
        """Validate a wire object into ``model_type``; raise pydantic's ValidationError."""
        ...

    def dump_many(self, model_type: type[BaseModel], models: list[Any]) -> list[Any]:
        """The wire objects of ``models``, all exactly of ``model_type`` (a batch's)."""
        ...

    def load_many(self, model_type: type[M], objs: list[Any]) -> list[M]:
        """Validate many wire objects into ``model_type``; raise pydantic's
        ValidationError when any is invalid (then load them one by one to learn which)."""
        ...


def _msgpack_default(value: Any) -> Any:
    if is_ndarray(value):
        # The tuple built directly: ExtType's own __new__ re-checks, in Python, the code
        # and bytes made right here (a third of an observation array's encoding).
        return tuple.__new__(msgpack.ExtType, (NDARRAY_EXT, encode_ndarray(value)))
    return _plain_default(value)


def _json_default(value: Any) -> Any:
    if is_ndarray(value):
        from corral.contract.arrays import to_wire_dict

        return to_wire_dict(value)
    return _plain_default(value)


def _plain_default(value: Any) -> Any:
    """Encode the non-JSON, non-msgpack values a python-mode dump may contain."""
    if is_numpy_scalar(value):
        return value.item()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (uuid.UUID, decimal.Decimal, pathlib.PurePath)):
        return str(value)
    if isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="python")
    raise TypeError(f"cannot encode {type(value).__qualname__} with msgpack")


@functools.lru_cache(maxsize=64)
def list_adapter(model_type: type[BaseModel]) -> TypeAdapter[list[Any]]:
    """A validator and serializer of ``list[model_type]``: one call for a batch's models,
    several times faster than one by one (a process has a few models: bounded cache)."""
    return TypeAdapter(list[model_type])  # type: ignore[valid-type]


def _msgpack_ext(code: int, data: bytes) -> Any:
    if code == NDARRAY_EXT:
        return decode_ndarray(data)
    raise BadFrame(f"unknown msgpack extension type {code}")


def _require_map(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BadMessage(
            f"a message must be a map/object, got {type(obj).__name__}",
            details={"expected": "object"},
        )
    return obj


class MsgpackCodec:
    """Binary frames with msgpack; bytes stay bytes, extension types for arrays."""

    name = "msgpack"
    subprotocol = "corral.v1.msgpack"
    binary = True

    def __init__(self) -> None:
        self._packer = msgpack.Packer(use_bin_type=True, default=_msgpack_default)

    def encode(self, message: dict[str, Any]) -> bytes:
        """Encode ``message`` as one msgpack map."""
        data: bytes = self._packer.pack(message)
        return data

    def decode(self, frame: Frame) -> dict[str, Any]:
        """Decode a msgpack frame; text frames are refused on this codec."""
        if isinstance(frame, str):
            raise BadFrame("text frame on the msgpack codec; send binary frames")
        try:
            obj = msgpack.unpackb(
                frame, raw=False, strict_map_key=False, ext_hook=_msgpack_ext, use_list=True
            )
        except BadFrame:
            raise
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise BadFrame(f"invalid msgpack frame: {exc}") from None
        return _require_map(obj)

    def dump(self, model: BaseModel) -> Any:
        """Python-mode dump: bytes, arrays and numbers keep their native form."""
        own = type(model).__dict__.get(PYTHON_DUMP)
        if own is not None:
            return own(model)
        # The core serializer directly: model_dump's keyword handling costs as much as
        # the dump itself for small models, and this runs for every step.
        return model.__pydantic_serializer__.to_python(model, mode="python")

    def load(self, model_type: type[M], obj: Any) -> M:
        """Validate a decoded msgpack object (raises pydantic's ValidationError)."""
        model: M = model_type.__pydantic_validator__.validate_python(obj)
        return model

    def dump_many(self, model_type: type[BaseModel], models: list[Any]) -> list[Any]:
        """Python-mode dumps of a batch's models in one serializer call.

        The same dicts as :meth:`dump` of each (the list schema holds the model's own),
        without its per-call overhead (~0.6 µs an item). Only for models exactly of
        ``model_type``: a subclass would be dumped by its parent's fields.
        """
        own = model_type.__dict__.get(PYTHON_DUMP)
        if own is not None:
            return [own(model) for model in models]
        dumped: list[Any] = list_adapter(model_type).dump_python(models, mode="python")
        return dumped

    def load_many(self, model_type: type[M], objs: list[Any]) -> list[M]:
        """Validate a batch's decoded objects in one validator call (~0.4 µs an item
        less than :meth:`load` of each); raises pydantic's ValidationError."""
        models: list[M] = list_adapter(model_type).validate_python(objs)
        return models


class JsonCodec:
    """Text frames with JSON (orjson); bytes fields travel as base64 strings."""

    name = "json"
    subprotocol = "corral.v1.json"
    binary = False

    def encode(self, message: dict[str, Any]) -> str:
        """Encode ``message`` as one JSON object."""
        return orjson.dumps(message, default=_json_default).decode()

    def decode(self, frame: Frame) -> dict[str, Any]:
        """Decode a JSON text (or UTF-8 binary) frame."""
        try:
            obj = orjson.loads(frame)
        except orjson.JSONDecodeError as exc:
            raise BadFrame(f"invalid JSON frame: {exc}") from None
        return _require_map(obj)

    def dump(self, model: BaseModel) -> Any:
        """JSON-mode dump (bytes as base64, datetimes as ISO strings)."""
        return model.model_dump(mode="json")

    def load(self, model_type: type[M], obj: Any) -> M:
        """Validate with pydantic's JSON semantics, so base64 bytes decode correctly."""
        return model_type.model_validate_json(orjson.dumps(obj, default=_json_default))

    def dump_many(self, model_type: type[BaseModel], models: list[Any]) -> list[Any]:
        """:meth:`dump` of each (JSON is the readable codec, not the fast one)."""
        return [self.dump(model) for model in models]

    def load_many(self, model_type: type[M], objs: list[Any]) -> list[M]:
        """:meth:`load` of each (raises pydantic's ValidationError at the first bad one)."""
        return [self.load(model_type, obj) for obj in objs]


CODECS: dict[str, type[MsgpackCodec] | type[JsonCodec]] = {
    MsgpackCodec.name: MsgpackCodec,
    JsonCodec.name: JsonCodec,
}
SUBPROTOCOLS: dict[str, str] = {
    MsgpackCodec.subprotocol: MsgpackCodec.name,
    JsonCodec.subprotocol: JsonCodec.name,
}


def get_codec(name: str) -> Codec:
    """Return a new codec by name (``"msgpack"`` or ``"json"``).

    Raises:
        ValueError: for an unknown codec name.
    """
    try:
        return CODECS[name]()
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; choose one of {sorted(CODECS)}") from None


def codec_for_subprotocols(offered: list[str]) -> Codec | None:
    """The codec for the first corral subprotocol in ``offered``, or None."""
    for sub in offered:
        name = SUBPROTOCOLS.get(sub)
        if name is not None:
            return get_codec(name)
    return None

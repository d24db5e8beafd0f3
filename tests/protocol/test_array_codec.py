"""numpy arrays on the wire: every dtype and shape, both codecs, zero-copy binary decode."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pydantic import ValidationError

from corral.contract import Observation
from corral.contract.arrays import Array, NDArray, to_wire_dict
from corral.errors import BadFrame
from corral.protocol.arrays import NDARRAY_EXT, decode_ndarray, encode_ndarray
from corral.protocol.codecs import JsonCodec, MsgpackCodec

DTYPES = [
    "?",
    "i1",
    "u1",
    "<i2",
    ">i2",
    "<u2",
    "<i4",
    ">i4",
    "<u4",
    "<i8",
    ">u8",
    "<f2",
    "<f4",
    ">f4",
    "<f8",
    ">f8",
    "<c8",
    "<c16",
]
SHAPES = [(), (0,), (1,), (7,), (3, 0, 2), (2, 3), (84, 84, 3), (2, 1, 2, 1, 2)]


class Anything(Observation):
    data: NDArray
    maybe: NDArray | None = None


class Image(Observation):
    pixels: Array(dtype="uint8", shape=(84, 84, 3))  # type: ignore[valid-type]


class Board(Observation):
    cells: Array(dtype="int8", shape=(None, 3))  # type: ignore[valid-type]


def sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    values = np.arange(count) % 5
    return values.astype(np.dtype(dtype)).reshape(shape)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_extension_round_trip(dtype, shape):
    array = sample(dtype, shape)
    back = decode_ndarray(encode_ndarray(array))
    assert same(array, back)
    assert not back.flags.writeable  # a view on the frame: copy() to write


@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_model_round_trip_on_both_codecs(codec, dtype):
    obs = Anything(data=sample(dtype, (2, 3)), maybe=sample(dtype, (4,)))
    frame = codec.encode({"type": "result", "observation": codec.dump(obs)})
    back = codec.load(Anything, codec.decode(frame)["observation"])
    assert same(obs.data, back.data) and same(obs.maybe, back.maybe)


def test_binary_decode_is_zero_copy():
    image = np.random.default_rng(0).integers(0, 255, (84, 84, 3), dtype=np.uint8)
    codec = MsgpackCodec()
    frame = codec.encode({"observation": codec.dump(Image(pixels=image))})
    decoded = codec.decode(frame)["observation"]["pixels"]
    payload = decoded.base
    while isinstance(payload, np.ndarray):
        payload = payload.base
    assert isinstance(payload, bytes) and len(payload) >= image.nbytes  # no copy of the data
    assert same(image, Image.model_validate({"pixels": decoded}).pixels)


def test_json_form_is_base64_not_lists():
    obs = Image(pixels=np.zeros((84, 84, 3), np.uint8))
    wire = JsonCodec().dump(obs)["pixels"]
    assert set(wire) == {"dtype", "shape", "data"}
    assert wire["dtype"] == "|u1" and wire["shape"] == [84, 84, 3]
    assert isinstance(wire["data"], str)


@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
def test_non_contiguous_arrays(codec):
    base = np.arange(60, dtype="<f8").reshape(3, 4, 5)
    for view in (base.T, base[:, ::2, 1:], np.asfortranarray(base), base[::-1]):
        obs = Anything(data=view)
        back = codec.load(Anything, codec.decode(codec.encode({"o": codec.dump(obs)}))["o"])
        assert same(np.ascontiguousarray(view), back.data)


def test_checked_dtype_and_shape():
    Board(cells=np.zeros((5, 3), np.int8))
    Board(cells=[[1, 2, 3]])  # lists are converted with the declared dtype
    assert Board(cells=np.zeros((2, 3), np.int16)).cells.dtype == np.int8  # same-kind cast
    with pytest.raises(ValidationError, match="expected shape"):
        Board(cells=np.zeros((5, 4), np.int8))
    with pytest.raises(ValidationError, match="expected dtype"):
        Board(cells=np.zeros((5, 3), np.float64))
    with pytest.raises(ValidationError, match="cannot cross the wire"):
        Anything(data=np.array([object()], dtype=object))
    wire = to_wire_dict(np.ones((2, 3), np.int8))
    assert same(Board.model_validate({"cells": wire}).cells, np.ones((2, 3), np.int8))
    with pytest.raises(ValidationError, match="needs"):
        Board.model_validate({"cells": {**wire, "shape": [3, 3]}})


def test_object_arrays_are_refused_by_the_codec():
    with pytest.raises(TypeError, match="cannot cross the wire"):
        encode_ndarray(np.array(["a"], dtype=object))


def _payload(dtype: bytes, ndim: int, shape: tuple[int, ...], data: bytes) -> bytes:
    return struct.pack(f"<B{len(dtype)}sB{len(shape)}Q", len(dtype), dtype, ndim, *shape) + data


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x05<i4",
        _payload(b"<i4", 1, (3,), b"\x00" * 11),
        _payload(b"<i4", 2, (2,), b""),
        _payload(b"zz", 1, (1,), b"\x00"),
        _payload(b"|O", 1, (1,), b"\x00" * 8),
        _payload(b"|V8", 1, (1,), b"\x00" * 8),
    ],
)
def test_malformed_extensions_are_bad_frames(payload):
    with pytest.raises(BadFrame):
        decode_ndarray(payload)
    frame = msgpack.packb({"o": msgpack.ExtType(NDARRAY_EXT, payload)})
    with pytest.raises(BadFrame):
        MsgpackCodec().decode(frame)


def test_unknown_extension_types_are_bad_frames():
    frame = msgpack.packb({"o": msgpack.ExtType(42, b"x")})
    with pytest.raises(BadFrame, match="unknown msgpack extension type 42"):
        MsgpackCodec().decode(frame)


wire_dtypes = st.sampled_from(DTYPES).map(np.dtype)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=wire_dtypes,
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
    )
)
def test_any_array_survives_both_codecs(array):
    for codec in (MsgpackCodec(), JsonCodec()):
        message = codec.decode(codec.encode({"o": codec.dump(Anything(data=array))}))
        back = codec.load(Anything, message["o"]).data
        assert back.dtype == array.dtype and back.shape == array.shape
        assert back.tobytes() == np.ascontiguousarray(array).tobytes()  # bit-exact, NaNs too

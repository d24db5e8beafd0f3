"""Codecs: frames, bad frames, model dumps, arrays."""

from __future__ import annotations

import datetime as dt
import uuid
from enum import Enum

import msgpack
import numpy as np
import pytest
from pydantic import ValidationError

from corral.contract import Observation
from corral.contract.arrays import NDArray
from corral.errors import BadFrame, BadMessage
from corral.protocol.arrays import decode_ndarray, encode_ndarray
from corral.protocol.codecs import (
    PYTHON_DUMP,
    JsonCodec,
    MsgpackCodec,
    codec_for_subprotocols,
    get_codec,
)


class Color(Enum):
    RED = "red"


class Rich(Observation):
    when: dt.datetime = dt.datetime(2026, 12, 2, 13, 0, tzinfo=dt.UTC)
    ident: uuid.UUID = uuid.UUID(int=5)
    color: Color = Color.RED
    data: bytes = b"\x00\xff\xfe"
    tags: set[str] = {"a"}
    span: dt.timedelta = dt.timedelta(seconds=1.5)
    grid: NDArray | None = None


@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
def test_rich_models_round_trip(codec):
    obs = Rich(grid=np.arange(12, dtype=np.int16).reshape(3, 4), metadata={"k": [1, None]})
    frame = codec.encode({"type": "result", "id": 1, "observation": codec.dump(obs)})
    assert isinstance(frame, bytes if codec.binary else str)
    back = codec.load(Rich, codec.decode(frame)["observation"])
    assert back.model_dump(exclude={"grid"}) == obs.model_dump(exclude={"grid"})
    assert back.grid.dtype == np.int16 and np.array_equal(back.grid, obs.grid)


@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
def test_a_batch_dumps_and_loads_as_its_items_one_by_one(codec):
    # The batch path (one serializer or validator call for a list) gives exactly what
    # dumping and loading each item does: empty reward components left out, extras kept.
    models = [
        Rich(reward=0.5, metadata={"i": i}, reward_components={"a": 1.0} if i else {})
        for i in range(3)
    ]
    dumped = codec.dump_many(Rich, models)
    assert repr(dumped) == repr([codec.dump(model) for model in models])
    assert "reward_components" not in dumped[0] and dumped[1]["reward_components"] == {"a": 1.0}
    wires = [codec.decode(codec.encode({"o": obj}))["o"] for obj in dumped]
    assert codec.load_many(Rich, wires) == [codec.load(Rich, wire) for wire in wires]
    with pytest.raises(ValidationError):
        codec.load_many(Rich, [*wires, {"reward": "lots"}])


def test_msgpack_arrays_decode_without_copy():
    arr = np.random.default_rng(0).integers(0, 255, (84, 84, 3), dtype=np.uint8)
    payload = encode_ndarray(arr)
    back = decode_ndarray(payload)
    assert np.array_equal(back, arr) and not back.flags.writeable  # a view on the frame
    assert len(payload) < arr.nbytes + 64  # raw bytes, not lists
    with pytest.raises(BadFrame):
        decode_ndarray(payload[:-1])
    with pytest.raises(BadFrame):
        decode_ndarray(b"\x02|O\x00")
    with pytest.raises(TypeError):
        encode_ndarray(np.array([object()]))


def test_bad_frames():
    mp, js = MsgpackCodec(), JsonCodec()
    for bad in (b"\xc1", b"\x92\x01", msgpack.packb({"a": 1})[:-1]):
        with pytest.raises(BadFrame):
            mp.decode(bad)
    with pytest.raises(BadFrame):
        mp.decode("text")
    with pytest.raises(BadFrame):
        mp.decode(msgpack.packb(msgpack.ExtType(42, b"x")))
    with pytest.raises(BadMessage):
        mp.decode(msgpack.packb([1, 2]))
    for bad in ("{", "nul", '{"a": }'):
        with pytest.raises(BadFrame):
            js.decode(bad)
    with pytest.raises(BadMessage):
        js.decode("[1]")
    assert js.decode(b'{"type": "x"}') == {"type": "x"}  # binary JSON frames are accepted


def test_codec_lookup():
    assert get_codec("json").name == "json"
    with pytest.raises(ValueError, match="unknown codec"):
        get_codec("xml")
    assert codec_for_subprotocols(["x", "corral.v1.json"]).name == "json"
    assert codec_for_subprotocols(["openenv"]) is None


class Own(Observation):
    count: int = 0


def _own_dump(model: Own) -> dict[str, object]:
    return {"own": model.count}


setattr(Own, PYTHON_DUMP, _own_dump)


class OwnChild(Own):
    extra: int = 1


def test_a_model_s_own_python_dump_is_the_binary_codec_s_for_exactly_its_class() -> None:
    msgpack_codec, json_codec = MsgpackCodec(), JsonCodec()
    assert msgpack_codec.dump(Own(count=2)) == {"own": 2}
    assert msgpack_codec.dump_many(Own, [Own(count=1), Own(count=3)]) == [{"own": 1}, {"own": 3}]
    # A subclass may add fields: pydantic dumps it; so does the JSON codec, always.
    assert msgpack_codec.dump(OwnChild(count=2))["extra"] == 1
    assert msgpack_codec.dump_many(OwnChild, [OwnChild()])[0]["extra"] == 1
    assert json_codec.dump(Own(count=2))["count"] == 2
    assert json_codec.dump_many(Own, [Own(count=2)])[0]["count"] == 2

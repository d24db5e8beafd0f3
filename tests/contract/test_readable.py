"""Values as people and models read them: arrays as numbers, cut with a note when large."""

from __future__ import annotations

import jsonschema
import numpy as np
import orjson
import pytest
from pydantic import Field

from corral.contract import Observation
from corral.contract.arrays import Array, NDArray
from corral.contract.readable import (
    observation_text,
    readable,
    readable_array,
    readable_json,
    readable_schema,
)


class Frame(Observation):
    board: Array("int8", (3, 3)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: np.zeros((3, 3), dtype=np.int8)
    )
    pixels: Array("uint8", (84, 84, 3)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: np.zeros((84, 84, 3), dtype=np.uint8)
    )
    levels: NDArray = Field(default_factory=lambda: np.array([0.1, 0.3], dtype=np.float32))
    label: str = "x"


def test_a_small_array_is_nested_lists_of_its_numbers() -> None:
    board = np.array([[0, 1, -1], [0, 0, 0], [1, 0, 0]], dtype=np.int8)
    assert readable(board) == [[0, 1, -1], [0, 0, 0], [1, 0, 0]]
    assert readable(np.array(True)) is True
    assert readable(np.array([0.1, 0.3], dtype=np.float32)) == [0.1, 0.3]  # not 0.1000000015
    assert readable(np.array([np.nan, np.inf, -np.inf])) == ["nan", "inf", "-inf"]
    assert readable(np.array([1 + 2j], dtype=np.complex64)) == ["(1+2j)"]
    assert readable(np.zeros((0, 4))) == []


def test_a_large_array_is_cut_to_its_first_rows_and_says_so() -> None:
    image = np.arange(84 * 84 * 3).astype(np.uint8).reshape(84, 84, 3)
    shown = readable_array(image)
    assert shown["cut"] == "first 3 of 84 rows shown (756 of 21,168 values)"
    assert (shown["dtype"], shown["shape"]) == ("uint8", [84, 84, 3])
    assert np.array_equal(np.array(shown["values"]), image[:3])
    wide = readable_array(np.ones((2, 5000)), max_values=100)
    assert wide["cut"] == "the start of the first row shown (100 of 10,000 values)"
    assert np.array(wide["values"]).shape == (1, 100)
    long = readable_array(np.arange(20), max_values=5)
    assert (long["values"], long["cut"]) == ([0, 1, 2, 3, 4], "first 5 of 20 values shown")


def test_models_mappings_and_wire_dicts_read_the_same() -> None:
    frame = Frame(board=np.eye(3, dtype=np.int8), reward=1.0)
    shown = readable(frame, exclude=["metadata"])
    assert shown["board"] == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert shown["levels"] == [0.1, 0.3] and "metadata" not in shown
    assert shown["pixels"]["cut"].startswith("first 3 of 84 rows")
    # What crossed the wire in JSON (arrays as base64 dicts) reads as the model does.
    assert readable(frame.model_dump(mode="json"), exclude=["metadata"]) == shown
    assert readable({"a": {"dtype": "nope", "shape": [1], "data": "AA=="}})["a"]["dtype"] == (
        "nope"
    )  # not an array after all: the mapping as it is
    assert readable({"when": np.int64(3), "raw": b"abc", "pair": (1, 2)}) == {
        "when": 3,
        "raw": "<3 bytes>",
        "pair": [1, 2],
    }
    assert orjson.loads(readable_json(frame)) == readable(frame)


def test_observation_text_is_the_own_fields_and_the_outcome() -> None:
    text = observation_text(Frame(label="y", done=True, truncated=True, reward=2.0))
    first, second = text.split("\n")
    assert orjson.loads(first)["board"] == [[0, 0, 0]] * 3
    assert "reward" not in orjson.loads(first) and "metadata" not in orjson.loads(first)
    assert second == "The episode is over (truncated)."
    assert "\n" not in observation_text(Frame())
    assert "AAAA" not in text  # no base64 anywhere


def test_readable_values_match_the_readable_schema() -> None:
    frame = Frame(board=np.eye(3, dtype=np.int8), levels=np.array([np.nan], dtype=np.float32))
    schema = readable_schema(Frame.model_json_schema())
    jsonschema.validate(readable(frame), schema)
    board = schema["properties"]["board"]["anyOf"][0]
    assert board["items"]["items"] == {"type": "integer"}
    assert (board["minItems"], board["maxItems"]) == (3, 3)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**readable(frame), "board": [[1, 2]]}, schema)

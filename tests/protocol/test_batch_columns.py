"""Columnar batch replies: the same results as the row form, for any batch; bad shapes refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.errors import BadMessage
from corral.protocol import batch as b
from corral.protocol.codecs import JsonCodec, MsgpackCodec
from corral.protocol.messages import parse_reply, parse_request

FIELDS = ("message", "count", "reward", "done", "truncated", "metadata", "pixels")

json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(min_value=0, max_value=9), max_size=2),
)
msgpack_values = st.one_of(json_values, st.binary(max_size=8))
CODECS = {"msgpack": (MsgpackCodec(), msgpack_values), "json": (JsonCodec(), json_values)}


@st.composite
def batches(draw: st.DrawFn, wire_values: st.SearchStrategy[object]) -> list[b.BatchItemReply]:
    """A batch reply's results: observations with one set of fields (some lacking a few
    of them, as a server leaves out empty ``reward_components``), and errors."""
    names = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=len(FIELDS)))
    sparse = draw(st.booleans())
    items: list[b.BatchItemReply] = []
    for k in range(draw(st.integers(min_value=1, max_value=12))):
        session = f"s{k}"
        if draw(st.booleans()) and draw(st.booleans()):
            code = draw(st.sampled_from(["INVALID_ACTION", "SESSION_LOST", "ENV_ERROR"]))
            items.append(b.ItemError(session, code, f"item {k} failed", {"item": k}))
        else:
            kept = [n for n in names if not (sparse and draw(st.booleans()))]
            items.append(b.ItemResult(session, {n: draw(wire_values) for n in kept}))
    return items


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(CODECS)).flatmap(lambda c: st.tuples(st.just(c), batches(CODECS[c][1])))
)
def test_columnar_equals_row_form_for_any_batch(case):
    name, results = case
    codec = CODECS[name][0]
    rows = codec.decode(codec.encode(b.BatchReply(7, results).to_wire()))
    columns = codec.decode(codec.encode(b.BatchReply(7, results, columnar=True).to_wire()))
    assert "results" in rows
    assert "columns" in columns and "results" not in columns
    from_rows = parse_reply(rows)
    from_columns = parse_reply(columns)
    assert isinstance(from_columns, b.BatchReply) and from_columns.columns is not None
    assert from_columns.results == from_rows.results
    assert from_columns == from_rows
    assert len(from_columns) == len(results)
    table = from_columns.columns
    assert table.ok == sum(isinstance(r, b.ItemResult) for r in results)
    for name, values in table.fields.items():
        wanted = [
            r.observation.get(name, b.ABSENT)
            for r in from_rows.results
            if isinstance(r, b.ItemResult)
        ]
        assert values == wanted


def test_columnar_keys_go_once_and_the_frame_is_smaller():
    results = [
        b.ItemResult(f"s{k}", {"message": "hi", "reward": 1.0, "done": False}) for k in range(64)
    ]
    codec = MsgpackCodec()
    rows = codec.encode(b.BatchReply(1, results).to_wire())
    columns = codec.encode(b.BatchReply(1, results, columnar=True).to_wire())
    assert len(columns) < 0.7 * len(rows)
    assert columns.count(b"message") == 1 and rows.count(b"message") == 64


def test_fields_some_observations_lack_are_listed_as_absent():
    results = [b.ItemResult("a", {"x": 1}), b.ItemResult("b", {"x": 2, "y": None})]
    wire = b.BatchReply(3, results, columnar=True).to_wire()
    assert wire["columns"] == {"x": [1, 2], "y": [None, None]}
    assert wire["absent"] == {"y": [0]}
    parsed = parse_reply(MsgpackCodec().decode(MsgpackCodec().encode(wire)))
    assert parsed.columns.fields["y"] == [b.ABSENT, None] and parsed.columns.sparse
    assert parsed.results == results  # "y" is left out of a's observation, None in b's


def test_observations_that_are_not_maps_go_in_rows():
    results = [b.ItemResult("a", [1, 2])]
    assert b.BatchColumns.of(results) is None
    wire = b.BatchReply(3, results, columnar=True).to_wire()
    assert "results" in wire and "columns" not in wire


def test_all_failed_batch_is_columnar_with_no_fields():
    failed = [b.ItemError("a", "SESSION_LOST", "gone"), b.ItemError(None, "BAD_MESSAGE", "?")]
    wire = b.BatchReply(4, failed, columnar=True).to_wire()
    assert wire["columns"] == {} and len(wire["errors"]) == 2
    assert parse_reply(wire).results == failed


def test_the_request_flag_round_trips_and_is_off_by_default():
    items = (b.StepItem("a", {"message": "x"}),)
    asked = b.StepBatch(1, items, columns=True).to_wire()
    assert asked["columns"] is True
    assert parse_request(asked).columns is True
    plain = b.StepBatch(1, items).to_wire()
    assert "columns" not in plain and parse_request(plain).columns is False
    reset = parse_request(b.ResetBatch(2, (b.ResetItem("a", 1),), columns=True).to_wire())
    assert isinstance(reset, b.ResetBatch) and reset.columns is True


def test_a_reply_holds_rows_or_columns_not_both():
    with pytest.raises(ValueError):
        b.BatchReply(1)
    with pytest.raises(ValueError):
        b.BatchReply(1, [], columns=b.BatchColumns([], {}))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sessions": "a"}, "columns"),
        ({"columns": [1]}, "columns"),
        ({"errors": {"0": {}}}, "errors"),
        ({"errors": [[0]]}, "errors"),
        ({"errors": [["0", {"code": "X"}]]}, "errors"),
        ({"errors": [[5, {"code": "X"}]]}, "errors"),
        ({"errors": [[0, {"code": "X"}], [0, {"code": "X"}]]}, "errors"),
        ({"columns": {"x": [1, 2, 3]}}, "columns"),
        ({"columns": {"x": "ab"}}, "columns"),
        ({"sessions": [1, "b"]}, None),
        ({"absent": [0]}, "absent"),
        ({"absent": {"z": [0]}}, "absent"),
        ({"absent": {"x": [2]}}, "absent"),
        ({"absent": {"x": [0, 0]}}, "absent"),
        ({"absent": {"x": ["0"]}}, "absent"),
        ({"absent": {"x": 0}}, "absent"),
    ],
)
def test_malformed_columnar_replies_are_bad_messages(change, field):
    wire = {"type": "batch", "id": 9, "sessions": ["a", "b"], "columns": {"x": [1, 2]}}
    wire.update(change)
    with pytest.raises(BadMessage) as err:
        parse_reply(wire)
    if field is not None:
        assert err.value.details["field"] == field


def test_an_error_entry_needs_a_code():
    wire = {
        "type": "batch",
        "id": 9,
        "sessions": ["a"],
        "columns": {},
        "errors": [[0, {"message": "no code"}]],
    }
    with pytest.raises(BadMessage):
        parse_reply(wire)

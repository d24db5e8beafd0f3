"""Batch messages, parsed without sockets: every malformed shape gets a precise error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.errors import BadMessage, BatchTooLarge, ErrorCode, InvalidArgument
from corral.protocol import batch as b
from corral.protocol.codecs import JsonCodec, MsgpackCodec
from corral.protocol.messages import parse_request


def step_batch(items, rid=1):
    return b.StepBatch(rid, tuple(b.StepItem(s, a) for s, a in items)).to_wire()


def reset_batch(items, rid=1):
    return b.ResetBatch(rid, tuple(b.ResetItem(s, seed, o) for s, seed, o in items)).to_wire()


def test_step_batch_round_trip():
    message = step_batch([("a", {"message": "x"}), ("b", {"message": "y"})], 3)
    request = parse_request(message)
    assert isinstance(request, b.StepBatch)
    assert request.id == 3 and request.type == "step_batch"
    assert request.items == (b.StepItem("a", {"message": "x"}), b.StepItem("b", {"message": "y"}))


def test_a_step_items_reset_seed_round_trips_and_is_absent_by_default():
    plain = b.StepItem("a", {"message": "x"})
    assert plain.reset_seed is None and "reset_seed" not in plain.to_wire()
    seeded = (b.StepItem("a", {"message": "x"}, 0), b.StepItem("b", {}, 2**63 - 1), plain)
    message = b.StepBatch(3, seeded, autoreset=True).to_wire()
    assert [item.get("reset_seed") for item in message["items"]] == [0, 2**63 - 1, None]
    for codec in (MsgpackCodec(), JsonCodec()):
        request = parse_request(codec.decode(codec.encode(message)))
        assert isinstance(request, b.StepBatch) and request.autoreset
        assert request.items == seeded
    # null is the field's absence, and the seed is read without the flag too
    nulled = {"session": "c", "action": {}, "reset_seed": None}
    request = parse_request({"type": "step_batch", "id": 4, "items": [nulled]})
    assert request.items == (b.StepItem("c", {}),)


def test_reset_batch_round_trip_and_defaults():
    message = reset_batch([("a", 1, {"limit": 2}), ("b", None, {})], 4)
    request = parse_request(message)
    assert isinstance(request, b.ResetBatch)
    assert request.items == (b.ResetItem("a", 1, {"limit": 2}), b.ResetItem("b", None, {}))
    bare = parse_request({"type": "reset_batch", "id": 5, "items": [{"session": "c"}]})
    assert bare.items == (b.ResetItem("c"),)


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"type": "step_batch", "items": [{"session": "a", "action": {}}]}, "id"),
        ({"type": "step_batch", "id": "1", "items": []}, "id"),
        ({"type": "step_batch", "id": True, "items": []}, "id"),
        ({"type": "step_batch", "id": -1, "items": []}, "id"),
        ({"type": "step_batch", "id": 1}, "items"),
        ({"type": "step_batch", "id": 1, "items": {"session": "a"}}, "items"),
        ({"type": "reset_batch", "id": 1, "items": []}, "items"),
    ],
)
def test_message_level_errors(message, field):
    with pytest.raises(BadMessage) as err:
        parse_request(message)
    assert err.value.details["field"] == field
    assert message["type"] in err.value.message


@pytest.mark.parametrize(
    ("raw", "session", "code", "field"),
    [
        ("not a map", None, ErrorCode.BAD_MESSAGE, None),
        ({"action": {}}, None, ErrorCode.BAD_MESSAGE, "session"),
        ({"session": 7, "action": {}}, None, ErrorCode.BAD_MESSAGE, "session"),
        ({"session": "s"}, "s", ErrorCode.BAD_MESSAGE, "action"),
        (
            {"session": "s", "action": {}, "reset_seed": "7"},
            "s",
            ErrorCode.BAD_MESSAGE,
            "reset_seed",
        ),
        (
            {"session": "s", "action": {}, "reset_seed": 7.0},
            "s",
            ErrorCode.BAD_MESSAGE,
            "reset_seed",
        ),
        (
            {"session": "s", "action": {}, "reset_seed": True},
            "s",
            ErrorCode.BAD_MESSAGE,
            "reset_seed",
        ),
        (
            {"session": "s", "action": {}, "reset_seed": [7]},
            "s",
            ErrorCode.BAD_MESSAGE,
            "reset_seed",
        ),
        (
            {"session": "s", "action": {}, "reset_seed": -1},
            "s",
            ErrorCode.INVALID_ARGUMENT,
            "reset_seed",
        ),
        (
            {"session": "s", "action": {}, "reset_seed": 2**63},
            "s",
            ErrorCode.INVALID_ARGUMENT,
            "reset_seed",
        ),
    ],
)
def test_bad_step_items_are_per_item(raw, session, code, field):
    good = {"session": "ok", "action": {"message": "hi"}}
    request = parse_request({"type": "step_batch", "id": 1, "items": [good, raw, good]})
    first, bad, last = request.items
    assert first == last == b.StepItem("ok", {"message": "hi"})
    assert isinstance(bad, b.BadItem)
    assert bad.session == session and bad.error.code == code
    assert bad.error.details["item"] == 1
    if field is not None:
        assert bad.error.details["field"] == field


@pytest.mark.parametrize(
    ("raw", "code", "field"),
    [
        ({"session": "s", "seed": "1"}, ErrorCode.BAD_MESSAGE, "seed"),
        ({"session": "s", "seed": True}, ErrorCode.BAD_MESSAGE, "seed"),
        ({"session": "s", "seed": -5}, ErrorCode.INVALID_ARGUMENT, "seed"),
        ({"session": "s", "seed": 2**63}, ErrorCode.INVALID_ARGUMENT, "seed"),
        ({"session": "s", "options": [1]}, ErrorCode.BAD_MESSAGE, "options"),
    ],
)
def test_bad_reset_items_are_per_item(raw, code, field):
    request = parse_request({"type": "reset_batch", "id": 1, "items": [raw]})
    (bad,) = request.items
    assert isinstance(bad, b.BadItem) and bad.session == "s"
    assert bad.error.code == code and bad.error.details["field"] == field


def test_null_options_mean_none():
    request = parse_request(
        {"type": "reset_batch", "id": 1, "items": [{"session": "s", "options": None}]}
    )
    assert request.items == (b.ResetItem("s", None, {}),)


def test_batch_size_limit():
    items = [("s", {}) for _ in range(5)]
    message = step_batch(items, 9)
    request = parse_request(message)
    b.check_batch_size(request, 5)
    with pytest.raises(BatchTooLarge) as err:
        b.check_batch_size(request, 4)
    assert err.value.code == ErrorCode.BATCH_TOO_LARGE
    assert err.value.details == {"items": 5, "limit": 4}
    assert err.value.request_id == 9
    assert "split the batch" in err.value.message


def test_replies_and_reading_them():
    ok = b.ItemResult("a", {"done": False})
    failed = b.ItemError.of("b", InvalidArgument("nope", details={"x": 1}))
    reply = b.BatchReply(7, [ok, failed]).to_wire()
    assert reply == {
        "type": "batch",
        "id": 7,
        "results": [
            {"session": "a", "observation": {"done": False}},
            {
                "session": "b",
                "error": {"code": "INVALID_ARGUMENT", "message": "nope", "details": {"x": 1}},
            },
        ],
    }
    parsed = b.BatchReply.from_wire(reply)
    assert parsed.expect(2) == [ok, failed]
    assert isinstance(parsed.results[1].exception(7), InvalidArgument)
    with pytest.raises(BadMessage, match="2 results for 3 items"):
        parsed.expect(3)
    with pytest.raises(BadMessage):
        b.BatchReply.from_wire({"type": "batch", "id": 7, "results": [1, 2]})
    with pytest.raises(BadMessage):
        b.BatchReply.from_wire({"type": "batch", "id": 7, "results": [{"session": "a"}]})
    with pytest.raises(ValueError, match="no wire form"):
        b.StepBatch(1, (b.BadItem("a", BadMessage("x")),)).to_wire()


def text(**kwargs):
    return st.text(alphabet=st.characters(exclude_categories=("Cs",)), **kwargs)


sessions = text(min_size=1, max_size=12)
wire_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(
    st.lists(
        st.tuples(sessions, st.dictionaries(text(max_size=8), wire_values, max_size=4)),
        min_size=1,
        max_size=20,
    )
)
def test_step_batches_survive_both_codecs(items):
    for codec in (MsgpackCodec(), JsonCodec()):
        message = step_batch(items, 11)
        request = parse_request(codec.decode(codec.encode(message)))
        assert [(i.session, i.action) for i in request.items] == items


@given(
    st.lists(st.tuples(sessions, st.none() | st.integers(0, 2**63 - 1)), min_size=1, max_size=20)
)
def test_step_batches_carry_their_reset_seeds_through_both_codecs(items):
    batch = b.StepBatch(5, tuple(b.StepItem(s, {}, seed) for s, seed in items), autoreset=True)
    for codec in (MsgpackCodec(), JsonCodec()):
        request = parse_request(codec.decode(codec.encode(batch.to_wire())))
        assert [(i.session, i.reset_seed) for i in request.items] == items


@given(
    st.lists(
        st.tuples(
            sessions,
            st.none() | st.integers(0, 2**63 - 1),
            st.dictionaries(text(max_size=8), wire_values, max_size=3),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_reset_batches_survive_both_codecs(items):
    for codec in (MsgpackCodec(), JsonCodec()):
        message = reset_batch(items, 12)
        request = parse_request(codec.decode(codec.encode(message)))
        assert [(i.session, i.seed, i.options) for i in request.items] == items


@given(
    st.lists(
        st.one_of(
            wire_values,
            st.dictionaries(
                st.sampled_from(["session", "action", "seed", "options", "reset_seed"]),
                wire_values,
            ),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_any_items_parse_to_one_entry_each(raw_items):
    for kind in ("step_batch", "reset_batch"):
        request = parse_request({"type": kind, "id": 1, "items": raw_items})
        assert len(request.items) == len(raw_items)
        for item in request.items:
            if isinstance(item, b.BadItem):
                assert item.error.message

"""Same-step resets in the batch protocol (``"autoreset": true``), sans I/O: the request
flag, the sparse ``resets``/``reset_errors`` of both reply forms, the lifecycle table's
``autoreset`` rule (replays: tests/protocol/test_server_connection.py)."""

from __future__ import annotations

from typing import Any

import pytest

from corral.errors import BadMessage, SessionBusy, SessionLost
from corral.protocol import batch as b
from corral.protocol.codecs import JsonCodec, MsgpackCodec
from corral.protocol.messages import parse_reply, parse_request
from corral.protocol.position import Phase
from corral.protocol.session import LIFECYCLE, Op, SessionMachine

CODECS = [JsonCodec(), MsgpackCodec()]


def _results() -> list[b.BatchItemReply]:
    """Four items: a step that went on, one whose episode ended and restarted, one
    whose restart failed, and a failed step."""
    return [
        b.ItemResult("a", {"n": 1, "done": False, "reward": 0.5}),
        b.ItemResult(
            "b",
            {"n": 3, "done": True, "reward": 1.0},
            reset=b.ItemResult("b", {"n": 0, "done": False, "reward": None}),
        ),
        b.ItemResult(
            "c",
            {"n": 2, "done": True, "reward": 2.0},
            reset=b.ItemError("c", "ENV_ERROR", "reset failed", {"op": "reset"}),
        ),
        b.ItemError("d", "INVALID_ACTION", "bad", {}),
    ]


def test_the_request_flag_round_trips_and_is_off_by_default() -> None:
    items = (b.StepItem("a", {"n": 1}),)
    plain = b.StepBatch(3, items)
    assert "autoreset" not in plain.to_wire() and not plain.autoreset
    asked = b.StepBatch(4, items, columns=True, autoreset=True)
    wire = asked.to_wire()
    assert wire["autoreset"] is True and wire["columns"] is True
    for codec in CODECS:
        parsed = parse_request(codec.decode(codec.encode(wire)))
        assert parsed == asked
    # Only ``true`` asks (as for "columns").
    assert not b.StepBatch.from_wire({**wire, "autoreset": 1}).autoreset


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("columnar", [False, True], ids=["rows", "columns"])
def test_resets_go_beside_the_results_in_both_forms(codec: Any, columnar: bool) -> None:
    results = _results()
    wire = b.BatchReply(7, results, columnar=columnar).to_wire()
    assert ("columns" in wire) is columnar
    assert wire["resets"] == [[1, {"n": 0, "done": False, "reward": None}]]
    assert wire["reset_errors"] == [
        [2, {"code": "ENV_ERROR", "message": "reset failed", "details": {"op": "reset"}}]
    ]
    if not columnar:  # the item's own map is the ended step's, as without the flag
        assert wire["results"][1] == {"session": "b", "observation": results[1].observation}  # type: ignore[union-attr]
    back = parse_reply(codec.decode(codec.encode(wire)))
    assert isinstance(back, b.BatchReply)
    assert back.results == results
    if columnar:
        assert back.columns is not None and sorted(back.columns.resets) == [1, 2]
    again = b.BatchReply(7, back.results, columnar=columnar).to_wire()
    assert codec.decode(codec.encode(again)) == codec.decode(codec.encode(wire))


@pytest.mark.parametrize("columnar", [False, True], ids=["rows", "columns"])
def test_no_reset_no_keys(columnar: bool) -> None:
    wire = b.BatchReply(1, [b.ItemResult("a", {"n": 1})], columnar=columnar).to_wire()
    assert "resets" not in wire and "reset_errors" not in wire
    (item,) = b.BatchReply.from_wire(wire).results
    assert isinstance(item, b.ItemResult) and item.reset is None


@pytest.mark.parametrize("columnar", [False, True], ids=["rows", "columns"])
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("resets", {"1": {}}),  # not a list
        ("resets", [[1]]),  # not a pair
        ("resets", [["1", {}]]),  # not an index
        ("resets", [[9, {}]]),  # no such item
        ("resets", [[3, {}]]),  # a failed item has no reset
        ("resets", [[1, {}], [1, {}]]),  # twice
        ("reset_errors", [[1, {"code": "ENV_ERROR"}]]),  # twice, across the two lists
        ("reset_errors", [[0, {"message": "no code"}]]),
    ],
)
def test_malformed_resets_are_bad_messages(columnar: bool, key: str, value: Any) -> None:
    wire = b.BatchReply(7, _results(), columnar=columnar).to_wire()
    if key == "reset_errors" and value[0][0] == 1:
        wire[key] = wire[key] + value  # item 1 already has a reset
    else:
        wire.pop("reset_errors")
        wire[key] = value
    with pytest.raises(BadMessage):
        b.BatchReply.from_wire(wire)


def test_the_lifecycle_table_runs_a_same_step_reset_as_a_reset() -> None:
    assert all(rules["autoreset"] is Op.AUTO_RESET for rules in LIFECYCLE.values())
    machine = SessionMachine()
    machine.begin("reset", 1)
    machine.finish(Op.RESET)
    machine.begin("step", 2)
    machine.finish(Op.STEP, done=True)
    assert machine.phase is Phase.ENDED
    assert machine.begin("autoreset", 2) is Op.AUTO_RESET  # under the batch's own id
    with pytest.raises(SessionBusy):
        machine.begin("step", 3)  # while the reset runs
    machine.finish(Op.AUTO_RESET, done=False)
    assert machine.phase is Phase.READY and machine.episodes == 2 and machine.steps == 1
    machine.begin("step", 3)
    machine.finish(Op.STEP, done=True)
    machine.close("gone")
    with pytest.raises(SessionLost):
        machine.begin("autoreset", 3)

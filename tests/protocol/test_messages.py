"""The message table: every type both ways, every malformed field, without sockets."""

from __future__ import annotations

import dataclasses

import pytest

from corral.contract.tasks import TaskRef
from corral.errors import BadMessage, ErrorCode, InvalidArgument, UnknownType
from corral.protocol import batch as b
from corral.protocol import fields as f
from corral.protocol import messages as m
from corral.protocol.codecs import JsonCodec, MsgpackCodec
from corral.protocol.position import Phase, Position
from corral.protocol.snapshot import SessionSnapshot


def test_each_request_type_parses():
    assert m.parse_request({"type": "hello", "id": 1, "protocol": "corral/1"}) == m.Hello(
        id=1, protocol="corral/1"
    )
    hello = m.parse_request(
        {
            "type": "hello",
            "id": 2,
            "protocol": "corral/1",
            "client": "me",
            "contract": {"version": "1.2.3", "fingerprint": "sha256:ab"},
            "schemas": True,
        }
    )
    assert isinstance(hello, m.Hello) and hello.want_schemas
    assert hello.contract == m.ContractRef("1.2.3", "sha256:ab")
    assert m.parse_request({"type": "open", "id": 3}) == m.Open(id=3)
    assert m.parse_request({"type": "attach", "id": 4, "session": "s", "token": "t"}) == m.Attach(
        id=4, session="s", token="t"
    )
    assert m.parse_request(
        {"type": "reset", "id": 5, "session": "s", "seed": 9, "options": {"a": 1}}
    ) == m.Reset(id=5, session="s", seed=9, options={"a": 1})
    assert m.parse_request({"type": "reset", "id": 5, "session": "s", "seed": None}) == m.Reset(
        id=5, session="s"
    )
    assert m.parse_request({"type": "step", "id": 6, "session": "s", "action": None}) == m.Step(
        id=6, session="s", action=None
    )
    assert m.parse_request({"type": "state", "id": 7, "session": "s"}) == m.GetState(7, "s")
    assert m.parse_request({"type": "close", "id": 8, "session": "s"}) == m.Close(8, "s")


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"type": "open"}, "id"),
        ({"type": "open", "id": "1"}, "id"),
        ({"type": "open", "id": True}, "id"),
        ({"type": "open", "id": 1.5}, "id"),
        ({"type": "open", "id": -1}, "id"),
        ({"type": "open", "id": 2**63}, "id"),
        ({"type": "hello", "id": 1}, "protocol"),
        ({"type": "hello", "id": 1, "protocol": 1}, "protocol"),
        ({"type": "hello", "id": 1, "protocol": "corral/1", "contract": "1.0"}, "contract"),
        ({"type": "hello", "id": 1, "protocol": "corral/1", "contract": {}}, "version"),
        ({"type": "hello", "id": 1, "protocol": "corral/1", "schemas": "yes"}, "schemas"),
        ({"type": "attach", "id": 1, "session": "s"}, "token"),
        ({"type": "reset", "id": 1}, "session"),
        ({"type": "reset", "id": 1, "session": ["s"]}, "session"),
        ({"type": "reset", "id": 1, "session": "s", "seed": "1"}, "seed"),
        ({"type": "reset", "id": 1, "session": "s", "seed": True}, "seed"),
        ({"type": "reset", "id": 1, "session": "s", "options": [1]}, "options"),
        ({"type": "step", "id": 1, "session": "s"}, "action"),
        ({"type": "state", "id": 1}, "session"),
    ],
)
def test_malformed_fields_are_named(message, field):
    with pytest.raises(BadMessage) as err:
        m.parse_request(message)
    assert err.value.code == ErrorCode.BAD_MESSAGE
    assert err.value.details["field"] == field


def test_type_errors():
    with pytest.raises(BadMessage):
        m.parse_request({"id": 1})
    with pytest.raises(BadMessage):
        m.parse_request({"type": 3, "id": 1})
    with pytest.raises(UnknownType) as err:
        m.parse_request({"type": "fly", "id": 1})
    assert "step" in err.value.details["known"]


def test_negative_or_huge_seed_is_an_invalid_argument():
    for seed in (-1, 2**63):
        with pytest.raises(InvalidArgument):
            m.parse_request({"type": "reset", "id": 1, "session": "s", "seed": seed})


def test_peeks_and_replies():
    assert f.peek_id({"id": 4}) == 4
    assert f.peek_id({"id": True}) is None
    assert f.peek_id([1]) is None
    assert f.peek_session({"session": "a"}) == "a"
    assert f.peek_session({"session": 1}) is None
    err = m.ErrorReply(None, "BAD_FRAME", "nope").to_wire()
    assert err == {
        "type": "error",
        "id": None,
        "code": "BAD_FRAME",
        "message": "nope",
        "details": {},
    }
    assert m.Result(1, "s", {"x": 1}).to_wire()["observation"] == {"x": 1}
    assert m.Attached(1, "s", "t").to_wire()["type"] == "attached"


def test_the_table_is_static_and_complete():
    assert set(m.REQUESTS) == {
        "hello", "open", "attach", "reset", "step", "state", "close", "snapshot", "restore",
        "reset_batch", "step_batch",
    }  # fmt: skip
    assert set(m.REPLIES) == {
        "welcome", "opened", "attached", "result", "state", "closed", "snapshot", "restored",
        "batch", "error", "going_away",
    }  # fmt: skip
    assert m.REQUESTS["step_batch"] is b.StepBatch and m.REPLIES["batch"] is b.BatchReply
    with pytest.raises(TypeError):
        m.REQUESTS["fly"] = m.Open  # type: ignore[index]
    assert not hasattr(m, "register_request") and not hasattr(b, "register_request")


SNAPSHOT = SessionSnapshot(
    "echo",
    "1.0.0",
    "sha256:0123456789abcdef",
    Position(Phase.READY, 1, 3, 3),
    {"total": 3, "last": {"done": False, "x": [1.5, 2]}},
    1767225600.25,
)
SIGNED = dataclasses.replace(SNAPSHOT, sig="hmac-sha256:00ff")

EXAMPLES = [
    m.Hello(1),
    m.Hello(2, "corral/1", "me", m.ContractRef("1.2.3", "sha256:ab"), want_schemas=True),
    m.Open(3),
    m.Attach(4, "s", "t"),
    m.Reset(5, "s", 9, {"a": [1, 2]}),
    m.Reset(5, "s"),
    m.Reset(5, "s", 3, {}, TaskRef(split="test", index=7)),
    m.Reset(5, "s", acked=True),
    m.Step(6, "s", {"x": b"raw"}),
    m.Step(6, "s", 1, acked=True),
    m.Step(6, "s", None),
    m.GetState(7, "s"),
    m.Close(8, "s"),
    m.TakeSnapshot(8, "s"),
    m.Restore(8, SNAPSHOT),
    m.Restore(8, SIGNED),
    b.ResetBatch(9, (b.ResetItem("a", 1, {"k": 1}), b.ResetItem("b"))),
    b.StepBatch(10, (b.StepItem("a", {"n": 1}), b.StepItem("b", [1]))),
    b.ResetBatch(9, (b.ResetItem("a"),), columns=True, acked=True),
    b.StepBatch(10, (b.StepItem("a", 1),), autoreset=True, acked=True),
]


@pytest.mark.parametrize("flag", [False, 1, "yes", None, {}])
def test_acked_is_true_or_absent(flag):
    """Only ``true`` acks (a peer's ``1`` or ``"yes"`` must not make replies forgotten)."""
    for wire in (
        {"type": "step", "id": 1, "session": "s", "action": 1, "acked": flag},
        {"type": "reset", "id": 1, "session": "s", "acked": flag},
        {"type": "step_batch", "id": 1, "items": [{"session": "s", "action": 1}], "acked": flag},
        {"type": "reset_batch", "id": 1, "items": [{"session": "s"}], "acked": flag},
    ):
        assert m.parse_request(wire).acked is False
    assert "acked" not in m.Step(1, "s", 1).to_wire()


REPLY_EXAMPLES = [
    m.Welcome(1, {"name": "corral"}, {"name": "e"}, {"max_batch": 8}, "exact"),
    m.Welcome(1, {}, {}, {}, "unchecked", schemas={"action": {}}),
    m.Opened(2, "s", "t"),
    m.Attached(3, "s", "t"),
    m.Result(4, "s", {"done": False, "blob": b"\x00"}),
    m.StateReply(5, "s", {"step_count": 1}),
    m.Closed(6, "s"),
    m.SnapshotReply(6, "s", SIGNED),
    m.Restored(6, "s2", "t2", {"done": False}),
    b.BatchReply(7, [b.ItemResult("a", {"done": True}), b.ItemError("b", "ENV_ERROR", "boom")]),
    b.BatchReply(7, [b.ItemError(None, "BAD_MESSAGE", "item 0 must be a map", {"item": 0})]),
    m.ErrorReply(8, "RESET_REQUIRED", "reset first", {"x": 1}, session="s"),
    m.ErrorReply(None, "BAD_FRAME", "garbage"),
    m.GoingAway(12.5, "draining", "srv-1"),
    m.GoingAway(0.0, "", "srv-1"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda msg: msg.type)
@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
def test_every_request_round_trips(message, codec):
    if codec.name == "json" and isinstance(message, m.Step) and message.action:
        message = m.Step(message.id, message.session, {"x": "text"})  # JSON has no bytes
    assert m.parse_request(codec.decode(codec.encode(message.to_wire()))) == message


@pytest.mark.parametrize("reply", REPLY_EXAMPLES, ids=lambda msg: msg.type)
def test_every_reply_round_trips(reply):
    codec = MsgpackCodec()
    assert m.parse_reply(codec.decode(codec.encode(reply.to_wire()))) == reply


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"type": "welcome", "id": 1, "protocol": "corral/1", "env": {}, "limits": {}}, "server"),
        ({"type": "opened", "id": 1, "session": "s"}, "token"),
        ({"type": "result", "id": 1, "session": "s"}, "observation"),
        ({"type": "state", "id": "1", "session": "s", "state": {}}, "id"),
        ({"type": "closed", "id": 1}, "session"),
        ({"type": "error", "id": 1}, "code"),
        ({"type": "error", "id": 1, "code": "X", "details": []}, "details"),
        ({"type": "batch", "id": 1}, "results"),
        ({"type": "snapshot", "id": 1, "session": "s"}, "snapshot"),
        ({"type": "restored", "id": 1, "session": "s", "observation": {}}, "token"),
        ({"type": "going_away", "id": None, "deadline_s": 1.0}, "server"),
        ({"type": "going_away", "id": None, "deadline_s": -1, "server": "a"}, "deadline_s"),
        ({"type": "going_away", "id": None, "deadline_s": True, "server": "a"}, "deadline_s"),
        ({"type": "going_away", "id": None, "deadline_s": "1", "server": "a"}, "deadline_s"),
        ({"type": "going_away", "deadline_s": float("nan"), "server": "a"}, "deadline_s"),
    ],
)
def test_malformed_replies_are_named(message, field):
    with pytest.raises(BadMessage) as err:
        m.parse_reply(message)
    assert err.value.details["field"] == field


def test_reply_type_errors():
    with pytest.raises(UnknownType) as err:
        m.parse_reply({"type": "hello", "id": 1})
    assert "welcome" in err.value.details["known"]
    with pytest.raises(BadMessage):
        m.parse_reply({"id": 1})


def test_error_replies_carry_their_exception():
    exc = InvalidArgument("bad seed", details={"field": "seed"}, request_id=3)
    reply = m.ErrorReply.of(exc, session="s")
    assert reply == m.ErrorReply(3, "INVALID_ARGUMENT", "bad seed", {"field": "seed"}, "s")
    back = reply.exception()
    assert isinstance(back, InvalidArgument) and back.request_id == 3
    assert back.details == {"field": "seed"}
    unknown = m.ErrorReply.from_wire({"type": "error", "id": None, "code": "NEW_CODE"})
    assert unknown.message == "NEW_CODE" and unknown.exception().code == "NEW_CODE"


@pytest.mark.parametrize(
    "task",
    [{}, {"split": "test"}, {"split": "test", "index": -1}, {"split": "a b", "index": 0}],
)
def test_a_malformed_reset_task_is_invalid_argument(task: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        m.parse_request({"type": "reset", "id": 5, "session": "s", "task": task})


def test_a_reset_without_a_task_has_no_task_key() -> None:
    assert "task" not in m.Reset(5, "s").to_wire()
    wire = m.Reset(5, "s", task=TaskRef(split="train", index=2)).to_wire()
    assert wire["task"] == {"split": "train", "index": 2}


def test_hello_asks_for_notices_only_when_it_reads_them():
    """An older client's hello has no ``notices`` and so never gets a ``going_away``."""
    assert "notices" not in m.Hello(1).to_wire()
    assert m.parse_request(m.Hello(1, notices=True).to_wire()) == m.Hello(1, notices=True)
    assert m.parse_request({"type": "hello", "id": 1, "protocol": "corral/1"}).notices is False
    with pytest.raises(BadMessage):
        m.parse_request({"type": "hello", "id": 1, "protocol": "corral/1", "notices": 1})

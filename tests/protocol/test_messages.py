"""parse_request: every request type, every malformed field, without sockets."""

from __future__ import annotations

import pytest

from corral.errors import BadMessage, ErrorCode, InvalidArgument, UnknownType
from corral.protocol import messages as m


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
    assert m.peek_id({"id": 4}) == 4
    assert m.peek_id({"id": True}) is None
    assert m.peek_id([1]) is None
    assert m.peek_session({"session": "a"}) == "a"
    assert m.peek_session({"session": 1}) is None
    err = m.error(None, "BAD_FRAME", "nope")
    assert err == {
        "type": "error",
        "id": None,
        "code": "BAD_FRAME",
        "message": "nope",
        "details": {},
    }
    assert m.result(1, "s", {"x": 1})["observation"] == {"x": 1}
    assert m.opened(1, "s", "t", kind="attached")["type"] == "attached"

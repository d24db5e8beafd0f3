"""Contract negotiation and client-side reply matching, without sockets."""

from __future__ import annotations

import pytest

from corral.errors import BadMessage, ContractMismatch, SessionBusy, UnsupportedProtocol
from corral.protocol.client import RequestTracker
from corral.protocol.handshake import Compat, check_protocol, negotiate
from corral.protocol.messages import (
    ContractRef,
    ErrorReply,
    GetState,
    Hello,
    Result,
    Step,
    parse_reply,
)


def test_negotiation():
    assert negotiate(None, "1.0.0", "fp") is Compat.UNCHECKED
    assert negotiate(ContractRef("9.9.9", "fp"), "1.0.0", "fp") is Compat.EXACT
    assert negotiate(ContractRef("1.4.0", "other"), "1.0.0", "fp") is Compat.COMPATIBLE
    assert negotiate(ContractRef("1.0.0"), "1.2.0", "fp") is Compat.COMPATIBLE
    assert negotiate(ContractRef("0.3.0", "x"), "1.0.0", "fp", migrations=[0]) is Compat.MIGRATED
    with pytest.raises(ContractMismatch) as err:
        negotiate(ContractRef("2.0.0", "x"), "1.0.0", "fp")
    assert err.value.details["server_version"] == "1.0.0"
    with pytest.raises(ContractMismatch):
        negotiate(ContractRef("one", "x"), "1.0.0", "fp")


def test_protocol_check():
    check_protocol(Hello(id=1, protocol="corral/1"))
    with pytest.raises(UnsupportedProtocol):
        check_protocol(Hello(id=1, protocol="corral/2"))


def test_tracker_matches_out_of_order_and_drops_stale():
    tracker = RequestTracker()
    a, b, c = (tracker.next_id() for _ in range(3))
    assert len({a, b, c}) == 3
    for rid in (a, b):
        tracker.add(Step(rid, "s", {}), b"")
    tracker.add(GetState(c, "s"), b"")
    assert tracker.match(Result(b, "s", {})).request.id == b
    tracker.forget(a)  # the caller timed out
    assert tracker.match(Result(a, "s", {})) is None
    assert tracker.stale == 1
    reply = ErrorReply(c, "SESSION_BUSY", "m")
    assert tracker.match(reply).request.id == c
    assert isinstance(reply.exception(), SessionBusy)
    assert tracker.match(Result(c, "s", {})) is None  # answered once only
    assert tracker.outstanding() == {}
    assert tracker.match(ErrorReply(None, "BAD_FRAME", "x")) is None
    with pytest.raises(BadMessage):
        parse_reply({"type": "result"})

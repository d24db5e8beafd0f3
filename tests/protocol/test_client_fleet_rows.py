"""The fleet's rows of the client protocol, sans I/O: notices, the home server, ELSEWHERE.

A protocol object is driven as its transport drives it (connect, socket opened, frames,
losses, timers) with the server's side played by hand, so every path here is the one a
real socket takes, with no socket.
"""

from __future__ import annotations

from typing import Any

import pytest

from corral.errors import ConnectionLost, ErrorCode, SessionElsewhere, SessionLost
from corral.protocol.client import (
    MAX_MISROUTES,
    Actions,
    Answer,
    ClientProtocol,
    ConnState,
    ReconnectPolicy,
)
from corral.protocol.client_sessions import (
    SESSION_RULES,
    SessionBook,
    SessionEvent,
    SessionFate,
)
from corral.protocol.codecs import MsgpackCodec
from corral.protocol.messages import (
    Attached,
    ErrorReply,
    GetState,
    GoingAway,
    Open,
    Opened,
    Step,
    Welcome,
)

CODEC = MsgpackCodec()
POLICY = ReconnectPolicy(initial_delay_s=0.1, max_delay_s=0.1, jitter=0.0)


class Peer:
    """A protocol object and the hand-played servers behind one front door."""

    def __init__(self, server: str | None = None) -> None:
        self.proto = ClientProtocol(CODEC, url="ws://door/ws", reconnect=POLICY, server=server)
        self.sent: list[dict[str, Any]] = []
        self.now = 0.0

    def feed(self, reply: Any) -> Any:
        out = self.proto.receive(CODEC.encode(reply.to_wire()))
        if isinstance(out, Actions):
            self.sent += [CODEC.decode(frame) for frame in out.write]
        return out

    def last(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["type"] == kind]

    def dial(self) -> None:
        frame = self.proto.opened(self.proto.generation)
        assert frame is not None
        self.sent.append(CODEC.decode(frame))

    def welcome(self, server: str, instance: str = "i1") -> Any:
        hello = self.last("hello")[-1]
        return self.feed(
            Welcome(hello["id"], {"id": server, "instance": instance}, {}, {}, "exact")
        )

    def open(self, sid: str) -> None:
        request = Open(self.proto.next_id())
        assert self.proto.send(request) is not None
        self.feed(Opened(request.id, sid, f"t-{sid}"))

    def connected_to(self, server: str, *sessions: str) -> Peer:
        self.proto.connect(None, False)
        self.dial()
        self.welcome(server)
        for sid in sessions:
            self.open(sid)
        assert self.proto.state is ConnState.OPEN
        return self

    def cut(self) -> Actions | None:
        self.now += 0.5
        return self.proto.lost(self.proto.generation, ConnectionLost("cut"), self.now)

    def redial(self) -> None:
        self.now += 1.0
        assert self.proto.timer_fired(self.now) is not None
        self.dial()


def test_the_hello_asks_for_notices():
    peer = Peer()
    peer.proto.connect(None, False)
    peer.dial()
    assert peer.last("hello")[-1]["notices"] is True


def test_a_going_away_notice_is_kept_and_handed_over_matching_no_request():
    peer = Peer().connected_to("s0", "a")
    request = GetState(peer.proto.next_id(), "a")
    peer.proto.send(request)
    notice = peer.feed(GoingAway(12.5, "draining", "s0"))
    assert isinstance(notice, GoingAway) and notice.deadline_s == 12.5
    assert peer.proto.going_away == notice
    assert peer.proto.tracker.outstanding() == {request.id: "state"}  # still waited for
    assert peer.proto.state is ConnState.OPEN


def test_the_home_is_the_first_welcomes_server_and_every_later_socket_names_it():
    peer = Peer()
    assert peer.proto.route() is None  # the door picks the first
    peer.connected_to("s1", "a")
    assert peer.proto.route() == "s1" and peer.proto.home == "s1"
    pinned = Peer(server="s2")
    assert pinned.proto.route() == "s2"


def test_landing_on_another_server_is_not_a_restart_the_sessions_are_followed():
    peer = Peer().connected_to("s0", "a", "b")
    step = Step(peer.proto.next_id(), "a", {"x": 1})
    assert peer.proto.send(step) is not None
    peer.cut()
    peer.redial()
    out = peer.welcome("s1", instance="other")  # the door balanced us elsewhere
    assert isinstance(out, Actions) and out.drop and out.redial_after is not None
    assert peer.proto.state is ConnState.WAITING
    assert peer.proto.sessions.fate("a") is SessionFate.MOVING
    assert peer.proto.misroutes == 1
    assert peer.proto.route() == "s0"
    assert set(peer.proto.resume_ids()) == {"a", "b"}
    assert not peer.last("attach")  # nothing attached on the wrong server
    peer.redial()
    out = peer.welcome("s0")  # routed home by the header this time
    attaches = peer.last("attach")
    assert {(m["session"], m["token"]) for m in attaches} == {("a", "t-a"), ("b", "t-b")}
    for attach in attaches:
        out = peer.feed(Attached(attach["id"], attach["session"], attach["token"]))
    assert isinstance(out, Actions) and out.settled and out.error is None
    resent = [CODEC.decode(frame) for frame in out.write]
    assert [m["id"] for m in resent] == [step.id]  # the step goes out again, same id
    assert peer.proto.sessions.fate("a") is SessionFate.LIVE
    assert peer.proto.state is ConnState.OPEN


def test_a_welcome_of_another_server_with_no_session_moves_the_home():
    peer = Peer(server="s0")
    peer.proto.connect(None, False)
    peer.dial()
    out = peer.welcome("s3")  # s0 is gone; the door picked s3
    assert isinstance(out, Actions) and out.settled and out.error is None
    assert peer.proto.home == "s3"


def test_attach_answered_elsewhere_follows_the_session_there():
    peer = Peer(server="s0").connected_to("s0", "a")
    peer.cut()
    peer.redial()
    peer.welcome("s0")
    attach = peer.last("attach")[-1]
    elsewhere = ErrorReply(
        attach["id"], ErrorCode.SESSION_ELSEWHERE, "lives on s2", {"server": "s2"}
    )
    out = peer.feed(elsewhere)
    assert isinstance(out, Actions) and out.drop and out.redial_after is not None
    assert peer.proto.sessions.moving == {"a": ("s2", "t-a")}
    assert peer.proto.route() == "s2"
    peer.redial()
    peer.welcome("s2", instance="i2")  # another server's instance: no restart of s0's
    attach = peer.last("attach")[-1]
    assert attach["session"] == "a"
    out = peer.feed(Attached(attach["id"], "a", "t-a"))
    assert peer.proto.sessions.fate("a") is SessionFate.LIVE
    assert peer.proto.state is ConnState.OPEN


def test_a_session_elsewhere_among_live_ones_fails_its_requests_with_elsewhere():
    peer = Peer().connected_to("s0", "a", "b")
    held = GetState(peer.proto.next_id(), "b")
    peer.proto.send(held)
    peer.cut()
    peer.redial()
    peer.welcome("s0")
    out: Any = None
    for attach in peer.last("attach"):
        if attach["session"] == "a":
            out = peer.feed(Attached(attach["id"], "a", "t-a"))
        else:
            reply = ErrorReply(attach["id"], ErrorCode.SESSION_ELSEWHERE, "", {"server": "s9"})
            out = peer.feed(reply)
    assert isinstance(out, Actions) and out.settled
    [(rid, error)] = out.fail
    assert rid == held.id and isinstance(error, SessionElsewhere)
    assert error.details["server"] == "s9"
    with pytest.raises(SessionElsewhere):
        peer.proto.send(GetState(peer.proto.next_id(), "b"))
    assert peer.proto.send(GetState(peer.proto.next_id(), "a")) is not None


def test_an_elsewhere_reply_to_a_step_moves_the_session():
    peer = Peer().connected_to("s0", "a")
    step = Step(peer.proto.next_id(), "a", {})
    peer.proto.send(step)
    reply = ErrorReply(step.id, ErrorCode.SESSION_ELSEWHERE, "x", {"server": "s4"}, "a")
    answer = peer.feed(reply)
    assert isinstance(answer, Answer) and isinstance(answer.error, SessionElsewhere)
    assert peer.proto.sessions.moving == {"a": ("s4", "t-a")}


def test_the_same_server_restarted_still_loses_its_sessions():
    peer = Peer().connected_to("s0", "a")
    peer.cut()
    peer.redial()
    out = peer.welcome("s0", instance="i-new")
    assert isinstance(out, Actions) and out.settled
    assert peer.proto.sessions.fate("a") is SessionFate.LOST
    with pytest.raises(SessionLost, match="restarted"):
        peer.proto.send(GetState(peer.proto.next_id(), "a"))


def _book_at(fate: SessionFate | None) -> SessionBook:
    book = SessionBook()
    if fate is SessionFate.LIVE:
        book.apply("s", SessionEvent.HELD, token="t")
    elif fate is SessionFate.LOST:
        book.apply("s", SessionEvent.GONE, reason="gone")
    elif fate is SessionFate.MOVING:
        book.apply("s", SessionEvent.HELD, token="t")
        book.apply("s", SessionEvent.ELSEWHERE, server="s7")
    assert book.fate("s") is fate
    return book


@pytest.mark.parametrize(
    ("fate", "event", "after"),
    [(fate, event, after) for (fate, event), after in SESSION_RULES.items()],
    ids=[f"{fate}-{event}" for fate, event in SESSION_RULES],
)
def test_every_row_of_the_session_table(fate, event, after):
    book = _book_at(fate)
    assert book.apply("s", event, token="t2", reason="why", server="s8") is after
    assert book.fate("s") is after
    if after is SessionFate.MOVING:
        server, token = book.moving["s"]
        assert token == "t"  # the token goes along: it re-attaches at the holder
        assert server == ("s8" if event is SessionEvent.ELSEWHERE else "s7")
    if after is SessionFate.LIVE:
        assert book.live["s"] == "t2"
    assert ("s" in book.live, "s" in book.lost, "s" in book.moving).count(True) <= 1


def test_an_address_that_keeps_leading_elsewhere_loses_the_sessions_as_a_restart():
    peer = Peer().connected_to("s0", "a")
    step = Step(peer.proto.next_id(), "a", {})
    peer.proto.send(step)
    peer.cut()
    for _ in range(MAX_MISROUTES):
        peer.redial()
        out = peer.welcome("s1", instance="other")
        assert isinstance(out, Actions) and out.drop
    peer.redial()
    out = peer.welcome("s1", instance="other")  # named s0 once more: still s1
    assert isinstance(out, Actions) and out.settled and out.error is None
    [(rid, error)] = out.fail
    assert rid == step.id and isinstance(error, SessionLost)
    assert "restarted or was replaced" in error.message and "server s0" in error.message
    assert peer.proto.home == "s1" and peer.proto.state is ConnState.OPEN

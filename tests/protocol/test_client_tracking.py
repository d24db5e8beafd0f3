"""The client's sans-I/O connection: stable ids, matching, the session book, the reconnect plan.

Everything here runs without a socket: frames go in and out of a ``ClientProtocol``
exactly as a transport would move them.
"""

from __future__ import annotations

import random

import pytest

from corral.errors import (
    BadMessage,
    ClientClosed,
    ConnectionLost,
    EnvError,
    ErrorCode,
    FrameTooLarge,
    RequestTimeout,
    SessionLost,
    Unauthorized,
)
from corral.protocol.batch import BatchReply, ItemResult, StepBatch, StepItem
from corral.protocol.client import (
    Actions,
    ClientProtocol,
    ConnState,
    ReconnectPolicy,
)
from corral.protocol.client_requests import RequestTracker
from corral.protocol.client_sessions import SessionBook
from corral.protocol.codecs import MsgpackCodec
from corral.protocol.messages import (
    Attached,
    Closed,
    ContractRef,
    ErrorReply,
    GetState,
    Open,
    Opened,
    Reset,
    Result,
    StateReply,
    Step,
    Welcome,
)

CODEC = MsgpackCodec()


def frame(reply) -> bytes:
    return CODEC.encode(reply.to_wire())


def welcome(rid: int, instance: str = "i1", **limits) -> Welcome:
    return Welcome(rid, {"instance": instance}, {"name": "x"}, limits, "exact")


def test_ids_are_stable_and_replay_is_in_order():
    tracker = RequestTracker()
    hello = tracker.add(Open(tracker.next_id()), b"h", replay=False)
    a = tracker.add(Step(tracker.next_id(), "s1", {}), b"a")
    b = tracker.add(GetState(tracker.next_id(), "s2"), b"b")
    assert (hello.request.id, a.request.id, b.request.id) == (1, 2, 3)
    assert tracker.unsent(1) == [a, b]
    a.sent = 1
    assert tracker.unsent(1) == [b]
    # After a reconnect (generation 2) both go again, with the same ids; hello does not.
    assert [e.request.id for e in tracker.unsent(2)] == [2, 3]
    assert tracker.bound_to_socket() == [1]
    assert tracker.of_sessions({"s2"}) == [3]
    assert tracker.match(Result(2, "s1", {})) is a
    assert [e.request.id for e in tracker.unsent(2)] == [3]  # answered: never re-sent
    assert tracker.match(Result(2, "s1", {})) is None  # a second reply is stale
    assert tracker.stale == 1
    tracker.forget(3)
    assert tracker.unsent(3) == [] and tracker.next_id() == 4  # ids never reused
    assert tracker.outstanding() == {1: "open"}
    assert tracker.match(ErrorReply(None, "BAD_FRAME", "x")) is None  # answers nothing
    assert tracker.stale == 1


def test_session_book_follows_the_replies():
    book = SessionBook()
    book.observe(Opened(1, "a", "ta"))
    book.observe(Opened(2, "b", "tb"))
    book.observe(Closed(3, "b"))
    assert book.live == {"a": "ta"}
    book.observe(
        ErrorReply(4, ErrorCode.SESSION_LOST, "gone", {"reason": "idle for more than 5 s"}, "a")
    )
    assert book.live == {} and book.reason("a") == "idle for more than 5 s"
    error = book.lost_error("a", request_id=9)
    assert isinstance(error, SessionLost) and error.request_id == 9
    assert error.details == {"reason": "idle for more than 5 s", "session": "a"}
    book.observe(ErrorReply(5, ErrorCode.STEP_TIMEOUT, "slow", session="c"))
    assert "step timeout" in (book.reason("c") or "")
    book.observe(Attached(6, "a", "ta"))
    assert book.live == {"a": "ta"} and book.reason("a") is None


@pytest.mark.parametrize("same", [True, False])
def test_a_new_server_instance_loses_every_session(same):
    book = SessionBook()
    assert book.welcome("first") == []
    book.observe(Opened(1, "a", "t"))
    gone = book.welcome("first" if same else "second")
    if same:
        assert gone == [] and book.live == {"a": "t"}
    else:
        assert gone == ["a"] and "restarted" in (book.reason("a") or "")


DEFAULT = ReconnectPolicy()


def connected(policy: ReconnectPolicy | None = DEFAULT, **limits) -> ClientProtocol:
    """A protocol object through its first handshake."""
    proto = ClientProtocol(CODEC, url="ws://h/ws", reconnect=policy, client="test/1", seed=1)
    with pytest.raises(ConnectionLost, match="not connected"):
        proto.send(Open(proto.next_id()))
    generation = proto.connect(ContractRef("1.0.0", "fp"), want_schemas=True)
    sent = CODEC.decode(proto.opened(generation))
    assert sent["client"] == "test/1" and sent["schemas"] is True
    assert sent["contract"] == {"version": "1.0.0", "fingerprint": "fp"}
    ready = proto.receive(frame(welcome(sent["id"], **limits)))
    assert isinstance(ready, Actions) and ready.settled and ready.error is None
    assert ready.write == [] and ready.fail == []  # nothing to re-attach or re-send yet
    assert proto.connected and proto.reconnects == 0
    return proto


def open_session(proto: ClientProtocol, sid: str) -> None:
    request = Open(proto.next_id())
    assert proto.send(request) is not None
    proto.receive(frame(Opened(request.id, sid, f"token-{sid}")))


def test_replies_are_matched_typed_and_checked():
    proto = connected()
    open_session(proto, "s")
    step = Step(proto.next_id(), "s", {"n": 1})
    out = proto.send(step)
    wire = {"type": "step", "id": step.id, "session": "s", "action": {"n": 1}, "acked": True}
    assert CODEC.decode(out) == wire
    state = GetState(proto.next_id(), "s")
    proto.send(state)
    # Out of order, typed; an error reply arrives as its exception.
    error = ErrorReply(state.id, ErrorCode.ENV_ERROR, "boom", session="s")
    got = proto.receive(frame(error))
    assert got.request_id == state.id and isinstance(got.error, EnvError)
    got = proto.receive(frame(Result(step.id, "s", {"n": 1})))
    assert got.reply == Result(step.id, "s", {"n": 1}) and got.error is None
    # A reply of the wrong type fails its request; a stale one and a notice are not answers.
    wrong = GetState(proto.next_id(), "s")
    proto.send(wrong)
    got = proto.receive(frame(Result(wrong.id, "s", {})))
    assert isinstance(got.error, BadMessage) and "answered 'state' with 'result'" in str(got.error)
    assert proto.receive(frame(StateReply(wrong.id, "s", {}))) is None
    assert proto.tracker.stale == 1
    notice = proto.receive(frame(ErrorReply(None, "BAD_FRAME", "what")))
    assert isinstance(notice, ErrorReply) and notice.message == "what"
    with pytest.raises(BadMessage):
        proto.receive(CODEC.encode({"type": "result", "session": "s", "observation": {}}))
    batch = StepBatch(proto.next_id(), (StepItem("s", {}),))
    proto.send(batch)
    got = proto.receive(frame(BatchReply(batch.id, [ItemResult("s", {"n": 2})])))
    assert isinstance(got.reply, BatchReply)


def test_a_request_is_acked_only_while_its_sessions_have_nothing_outstanding():
    """``acked`` tells the server it may forget the sessions' earlier replies: true only
    when this side holds every one of them (no request of those sessions outstanding)."""
    proto = connected()
    open_session(proto, "s")
    open_session(proto, "t")

    def acked(request) -> bool:
        return CODEC.decode(proto.send(request)).get("acked", False)

    first = Step(proto.next_id(), "s", {})
    assert acked(first)
    state = GetState(proto.next_id(), "s")
    assert "acked" not in CODEC.decode(proto.send(state))  # a state never acks
    assert not acked(Step(proto.next_id(), "s", {}))  # first and state are outstanding
    assert acked(Reset(proto.next_id(), "t"))  # another session: nothing outstanding
    both = StepBatch(proto.next_id(), (StepItem("s", {}), StepItem("u", {})))
    assert not acked(both)
    proto.tracker.forget_all()
    batch = StepBatch(proto.next_id(), (StepItem("s", {}), StepItem("t", {})))
    assert acked(batch)
    assert not acked(Step(proto.next_id(), "t", {}))  # the batch holds t
    proto.receive(frame(BatchReply(batch.id, [ItemResult("s", {}), ItemResult("t", {})])))
    assert not acked(Step(proto.next_id(), "t", {}))  # the single step of t still is out
    proto.tracker.forget_all()
    timed_out = Step(proto.next_id(), "s", {})
    assert acked(timed_out)
    proto.forget(timed_out.id)  # given up on: its reply will never be asked for again
    assert acked(Step(proto.next_id(), "s", {}))


def test_timeouts_forget_and_late_replies_are_dropped():
    proto = connected()
    open_session(proto, "s")
    slow = Step(proto.next_id(), "s", {})
    proto.send(slow)
    error = proto.timed_out(slow, 0.2)
    assert isinstance(error, RequestTimeout) and error.request_id == slow.id
    assert "no reply to 'step' within 0.2 s" in error.message
    assert proto.receive(frame(Result(slow.id, "s", {}))) is None
    assert proto.tracker.stale == 1


def test_frames_over_the_servers_limit_never_go_out():
    proto = connected(max_frame_bytes=200)
    open_session(proto, "s")
    big = Step(proto.next_id(), "s", {"note": "x" * 500})
    with pytest.raises(FrameTooLarge) as err:
        proto.send(big)
    assert err.value.details["limit"] == 200 and err.value.request_id == big.id
    assert proto.tracker.outstanding() == {}


def resume(proto: ClientProtocol, now: float) -> dict:
    """Back off, dial again: the new socket's hello."""
    generation = proto.timer_fired(now)
    assert generation is not None and proto.state is ConnState.REDIALING
    return CODEC.decode(proto.opened(generation))


def test_the_reconnect_plan():
    proto = connected()
    for sid in ("a", "b", "c"):
        open_session(proto, sid)
    a = Step(proto.next_id(), "a", {"n": 1})
    b = Step(proto.next_id(), "b", {"n": 2})
    a_frame, b_frame = proto.send(a), proto.send(b)
    loss = proto.lost(proto.generation, ConnectionLost("cut"), now=100.0)
    assert loss is not None and loss.redial_after is not None and loss.drop
    assert loss.fail == [] and loss.fail_all is None and not loss.settled
    assert proto.lost(proto.generation, ConnectionLost("again"), 100.0) is None  # once
    assert proto.resuming and not proto.connected and proto.state is ConnState.WAITING
    # Sent while resuming: waits for the resume instead of going out now.
    c = GetState(proto.next_id(), "c")
    assert proto.send(c) is None
    assert proto.resume_ids() == ["a", "b", "c"]
    hello = resume(proto, 100.1)
    assert hello["schemas"] is False  # the schemas were adopted the first time
    welcomed = proto.receive(frame(Welcome(hello["id"], {"instance": "i1"}, {}, {}, "unchecked")))
    assert proto.welcome.schemas is None and proto.state is ConnState.REATTACHING
    assert isinstance(welcomed, Actions) and not welcomed.settled
    attaches = [CODEC.decode(out) for out in welcomed.write]
    assert [m["session"] for m in attaches] == ["a", "b", "c"]
    assert attaches[0]["token"] == "token-a"
    # b is gone on the server; a and c come back.
    assert proto.receive(frame(Attached(attaches[0]["id"], "a", "token-a"))) is None
    gone = ErrorReply(attaches[1]["id"], ErrorCode.UNKNOWN_SESSION, "no such session")
    assert proto.receive(frame(gone)) is None
    ready = proto.receive(frame(Attached(attaches[2]["id"], "c", "token-c")))
    assert isinstance(ready, Actions) and ready.settled and ready.error is None
    assert set(proto.sessions.live) == {"a", "c"} and "b" in proto.sessions.lost
    assert [(rid, type(e)) for rid, e in ready.fail] == [(b.id, SessionLost)]
    assert "does not have it any more" in ready.fail[0][1].message
    # The unanswered requests, with their original ids, oldest first; b's never.
    assert [CODEC.decode(out)["id"] for out in ready.write] == [a.id, c.id]
    assert ready.write[0] == a_frame and b_frame is not None
    assert proto.resent == 1  # c was never sent before
    assert proto.connected and proto.reconnects == 1 and not proto.resuming
    with pytest.raises(SessionLost, match="does not have it"):
        proto.send(Step(proto.next_id(), "b", {}))


def test_a_restarted_server_loses_every_session_and_their_requests():
    proto = connected()
    open_session(proto, "a")
    pending = Step(proto.next_id(), "a", {})
    proto.send(pending)
    proto.lost(proto.generation, ConnectionLost("cut"), now=0.0)
    hello = resume(proto, 1.0)
    ready = proto.receive(frame(welcome(hello["id"], instance="i2")))
    assert isinstance(ready, Actions) and ready.settled and ready.write == []  # none left
    assert proto.welcome.schemas is None
    [(rid, error)] = ready.fail
    assert rid == pending.id and "restarted" in error.message


def test_socket_bound_requests_die_with_their_socket():
    proto = ClientProtocol(CODEC, reconnect=ReconnectPolicy())
    generation = proto.connect(None, want_schemas=False)
    hello = CODEC.decode(proto.opened(generation))
    failed = proto.lost(generation, ConnectionLost("refused"), now=0.0)
    assert failed is not None and failed.settled and isinstance(failed.error, ConnectionLost)
    assert proto.state is ConnState.IDLE and proto.tracker.outstanding() == {}
    late = welcome(hello["id"])
    assert proto.receive(frame(late)) is None and proto.tracker.stale == 1


def test_a_handshake_refused_by_the_server_fails_the_attempt():
    proto = ClientProtocol(CODEC, reconnect=ReconnectPolicy())
    hello = CODEC.decode(proto.opened(proto.connect(None, want_schemas=False)))
    refused = ErrorReply(hello["id"], ErrorCode.CONTRACT_MISMATCH, "major version differs")
    failed = proto.receive(frame(refused))
    assert isinstance(failed, Actions) and failed.drop and failed.settled
    assert failed.error is not None and failed.error.code == ErrorCode.CONTRACT_MISMATCH
    assert proto.state is ConnState.IDLE


def test_without_a_policy_a_drop_fails_everything():
    proto = connected(policy=None)
    open_session(proto, "a")
    proto.send(Step(proto.next_id(), "a", {}))
    loss = proto.lost(proto.generation, ConnectionLost("cut"), now=0.0)
    assert loss is not None and loss.fail_all is not None and proto.failure is loss.fail_all
    assert proto.state is ConnState.FAILED and proto.tracker.outstanding() == {}
    with pytest.raises(ConnectionLost, match="cut") as err:
        proto.send(GetState(proto.next_id(), "a"))
    assert err.value.request_id is not None
    proto.connect(None, want_schemas=False)  # a new connect() starts afresh
    assert proto.failure is None and proto.state is ConnState.DIALING


def test_the_backoff_gives_up_by_attempts_and_by_time():
    proto = connected(ReconnectPolicy(initial_delay_s=1.0, max_delay_s=1.0, max_attempts=2))
    assert proto.lost(proto.generation, ConnectionLost("cut"), now=10.0).redial_after
    resume(proto, 11.0)
    assert proto.lost(proto.generation, ConnectionLost("cut"), now=11.0).redial_after
    resume(proto, 12.0)
    out = proto.lost(proto.generation, ConnectionLost("cut"), now=12.5)
    assert out.fail_all is not None and proto.state is ConnState.FAILED
    assert out.fail_all.details == {"attempts": 2, "elapsed_s": 2.5, "cause": "cut"}
    timed = connected(ReconnectPolicy(initial_delay_s=1.0, max_delay_s=1.0, give_up_after_s=5))
    timed.lost(timed.generation, ConnectionLost("cut"), now=0.0)
    resume(timed, 1.0)
    assert timed.lost(timed.generation, ConnectionLost("cut"), now=3.0).redial_after
    resume(timed, 4.0)
    out = timed.lost(timed.generation, ConnectionLost("cut"), now=4.5)
    assert out.fail_all is not None  # the next wait would overrun the budget
    # A refusal for good ends the resume at once, whatever the budget.
    final = connected()
    final.lost(final.generation, ConnectionLost("cut"), now=0.0)
    resume(final, 1.0)
    out = final.lost(final.generation, Unauthorized("wrong token"), now=1.0)
    assert isinstance(out.fail_all, Unauthorized) and final.state is ConnState.FAILED


def test_closed_is_final():
    proto = connected()
    open_session(proto, "a")
    proto.send(Step(proto.next_id(), "a", {}))
    assert len(proto.close()) == 1
    with pytest.raises(ClientClosed):
        proto.send(GetState(proto.next_id(), "a"))
    with pytest.raises(ClientClosed):
        proto.connect(None, want_schemas=False)
    assert proto.lost(proto.generation, ConnectionLost("late"), now=0.0) is None
    assert proto.timer_fired(1.0) is None and proto.close() == []


def test_backoff_is_seeded():
    policy = ReconnectPolicy()
    assert policy.delay(2, random.Random(3)) == policy.delay(2, random.Random(3))

"""The client's sans-I/O bookkeeping: stable ids, what a reconnect re-sends, lost sessions."""

from __future__ import annotations

import pytest

from corral.errors import ErrorCode, SessionLost
from corral.protocol.client import RequestTracker, SessionBook


def test_ids_are_stable_and_replay_is_in_order():
    tracker = RequestTracker()
    hello = tracker.new("hello", message={"type": "hello"}, replay=False)
    a = tracker.new("step", message={"type": "step", "session": "s1"})
    b = tracker.new("state", message={"type": "state", "session": "s2"})
    assert (hello, a, b) == (1, 2, 3)
    assert tracker.unsent(1) == [
        (a, {"type": "step", "session": "s1", "id": a}),
        (b, {"type": "state", "session": "s2", "id": b}),
    ]
    tracker.mark_sent(a, 1)
    assert [rid for rid, _ in tracker.unsent(1)] == [b]
    # After a reconnect (generation 2) both go again, with the same ids; hello does not.
    assert [rid for rid, _ in tracker.unsent(2)] == [a, b]
    assert tracker.bound_to_socket() == [hello]
    assert tracker.of_sessions({"s2"}) == [b]
    assert tracker.match({"type": "result", "id": a}) is not None
    assert [rid for rid, _ in tracker.unsent(2)] == [b]  # answered: never re-sent
    assert tracker.match({"type": "result", "id": a}) is None  # a second reply is stale
    assert tracker.stale == 1
    tracker.forget(b)
    assert tracker.unsent(3) == [] and tracker.new("x") == 4  # ids never reused


def test_record_keeps_the_first_message():
    tracker = RequestTracker()
    rid = tracker.new("step")
    tracker.record(rid, {"id": rid, "type": "step"})
    tracker.record(rid, {"id": rid, "type": "other"})
    assert tracker.unsent(0) == [(rid, {"id": rid, "type": "step"})]


def test_session_book_follows_the_replies():
    book = SessionBook()
    book.observe({"type": "opened", "id": 1, "session": "a", "token": "ta"})
    book.observe({"type": "opened", "id": 2, "session": "b", "token": "tb"})
    book.observe({"type": "closed", "id": 3, "session": "b"})
    assert book.live == {"a": "ta"}
    book.observe(
        {
            "type": "error",
            "id": 4,
            "session": "a",
            "code": ErrorCode.SESSION_LOST,
            "message": "gone",
            "details": {"reason": "idle for more than 5 s"},
        }
    )
    assert book.live == {} and book.reason("a") == "idle for more than 5 s"
    error = book.lost_error("a", request_id=9)
    assert isinstance(error, SessionLost) and error.request_id == 9
    assert error.details == {"reason": "idle for more than 5 s", "session": "a"}
    book.observe({"type": "error", "id": 5, "session": "c", "code": ErrorCode.STEP_TIMEOUT})
    assert "step timeout" in (book.reason("c") or "")
    book.observe({"type": "attached", "id": 6, "session": "a", "token": "ta"})
    assert book.live == {"a": "ta"} and book.reason("a") is None


@pytest.mark.parametrize("same", [True, False])
def test_a_new_server_instance_loses_every_session(same):
    book = SessionBook()
    assert book.welcome("first") == []
    book.observe({"type": "opened", "id": 1, "session": "a", "token": "t"})
    gone = book.welcome("first" if same else "second")
    if same:
        assert gone == [] and book.live == {"a": "t"}
    else:
        assert gone == ["a"] and "restarted" in (book.reason("a") or "")

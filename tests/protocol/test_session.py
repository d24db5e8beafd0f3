"""The lifecycle table, the reply cache and a session's one door in, without sockets."""

from __future__ import annotations

import numpy as np
import pytest

from corral.errors import EpisodeEnded, RequestIdReused, ResetRequired, SessionBusy, SessionLost
from corral.protocol.batch import ItemResult
from corral.protocol.messages import ErrorReply, Result
from corral.protocol.position import Phase
from corral.protocol.session import (
    AFTER,
    AUTO_RESET_LIFECYCLE,
    LIFECYCLE,
    Op,
    ReplyCache,
    SessionMachine,
    SessionState,
    ending,
    same_request,
)


def test_happy_path():
    sm = SessionMachine()
    assert sm.begin("state", 1) is Op.STATE  # state is allowed before reset
    sm.finish(Op.STATE)
    assert sm.phase is Phase.NEW
    assert sm.begin("reset", 2) is Op.RESET
    sm.finish(Op.RESET)
    assert sm.phase is Phase.READY and sm.episodes == 1
    assert sm.begin("step", 3) is Op.STEP
    sm.finish(Op.STEP, done=True)
    assert sm.phase is Phase.ENDED and sm.steps == 1


def test_rules():
    sm = SessionMachine()
    with pytest.raises(ResetRequired):
        sm.begin("step", 1)
    assert sm.running is None  # a refused request leaves nothing running
    sm.begin("reset", 2)
    with pytest.raises(SessionBusy) as busy:
        sm.begin("reset", 3)
    assert busy.value.details == {"running": 2}
    with pytest.raises(SessionBusy):
        sm.begin("state", 3)
    sm.finish(Op.RESET)
    sm.begin("step", 4)
    sm.finish(Op.STEP, done=True)
    with pytest.raises(EpisodeEnded):
        sm.begin("step", 5)
    sm.begin("reset", 6)
    sm.abort()  # a failed reset changes nothing
    assert sm.phase is Phase.ENDED and sm.running is None


def test_auto_reset_and_close():
    sm = SessionMachine(auto_reset=True)
    sm.begin("reset", 1)
    sm.finish(Op.RESET, done=True)
    assert sm.begin("step", 2) is Op.AUTO_RESET
    sm.finish(Op.AUTO_RESET)
    assert sm.phase is Phase.READY and sm.episodes == 2
    sm.close("reaped")
    sm.close("again")  # the first reason stays
    with pytest.raises(SessionLost) as lost:
        sm.begin("state", 3)
    assert lost.value.details == {"reason": "reaped"}
    sm.finish(Op.STEP)  # a late completion does not reopen it
    assert sm.phase is Phase.CLOSED


def test_reply_cache_keeps_the_most_recent():
    cache = ReplyCache(size=3)
    for i in range(5):
        cache.put(i, {"id": i})
    assert len(cache) == 3
    assert cache.get(0) is None and cache.get(4) == {"id": 4}
    cache.put(2, {"id": 2, "again": True})  # refreshed entries move to the end
    cache.put(5, {"id": 5})
    assert cache.get(2) is not None and cache.get(3) is None


def test_reply_cache_forgets_what_came_before_an_id():
    cache = ReplyCache(size=8)
    for i in (3, 5, 9):
        cache.put(i, {"id": i})
    cache.forget_before(6)
    assert len(cache) == 1 and cache.get(9) == {"id": 9}
    cache.forget_before(9)  # not the id itself: a re-sent request still finds its reply
    assert cache.get(9) == {"id": 9}
    cache.put(2, {"id": 2})  # out of order (another numbering): stays, bounded by size
    cache.forget_before(5)
    assert len(cache) == 2 and cache.get(2) == {"id": 2}
    cache.forget_before(99)
    assert len(cache) == 0


@pytest.mark.parametrize("auto_reset", [False, True])
def test_the_table_decides_every_phase_and_kind(auto_reset):
    """Every (phase, kind) of the table, driven through the machine, does what it says."""
    table = AUTO_RESET_LIFECYCLE if auto_reset else LIFECYCLE
    for phase, rules in table.items():
        for kind, rule in rules.items():
            sm = SessionMachine(auto_reset=auto_reset)
            sm.phase = phase
            if isinstance(rule, Op):
                assert sm.begin(kind, 1) is rule
                assert sm.running == 1
            else:
                with pytest.raises((ResetRequired, EpisodeEnded)):
                    sm.begin(kind, 1)
                assert sm.running is None
    assert set(AFTER) == set(Op)


def state(**kwargs):
    return SessionState(
        id="s", token="t", machine=SessionMachine(**kwargs), cache=ReplyCache(4), owner=None
    )


RESET = ("reset", (None, {}))


def test_admit_is_the_one_door():
    s = state()
    assert s.admit("reset", 1, RESET) is Op.RESET
    assert s.admit("reset", 1, RESET) is None  # the same request, still running: nothing new
    with pytest.raises(SessionBusy):
        s.admit("step", 2, ("step", {"a": 1}))
    s.machine.finish(Op.RESET)
    reply = Result(1, "s", {"done": False})
    s.deliver(reply)  # no owner: remembered all the same
    assert s.admit("reset", 1, RESET) is reply  # answered: replayed, never run twice
    assert s.admit("step", 2, ("step_batch", {"a": 1})) is Op.STEP
    s.machine.finish(Op.STEP)
    item = ItemResult("s", {"done": True})
    s.remember(2, item)
    assert s.admit("step", 2, ("step_batch", {"a": 1})) is item


def test_an_acked_request_forgets_the_replies_before_it_but_replays_its_own():
    s = state()
    assert s.admit("reset", 1, RESET) is Op.RESET
    s.machine.finish(Op.RESET)
    s.deliver(Result(1, "s", {"done": False}))
    assert s.admit("state", 2, ("state", None)) is Op.STATE
    s.machine.finish(Op.STATE)
    s.deliver(Result(2, "s", {"done": False}))
    assert len(s.cache) == 2  # without acked, the last replies stay for re-sends
    step = ("step", {"a": 1})
    assert s.admit("step", 3, step, acked=True) is Op.STEP
    assert len(s.cache) == 0  # the client holds replies 1 and 2
    s.machine.finish(Op.STEP)
    reply = Result(3, "s", {"done": False})
    s.deliver(reply)
    # The same request re-sent after a reconnect, still marked acked: replayed, not run.
    assert s.admit("step", 3, step, acked=True) is reply
    # Acked only covers earlier ids: an older request re-sent after it is not forgotten
    # by a later one's flag, and a reused id is still refused.
    with pytest.raises(RequestIdReused):
        s.admit("step", 3, ("step", {"a": 2}), acked=True)
    assert s.admit("step", 4, step, acked=True) is Op.STEP
    assert s.cache.get(3) is None


def test_a_request_under_an_acknowledged_id_is_refused_not_run_again():
    """Issue 30.9: forgetting replies the client acknowledged does not forget that those
    ids were answered; a re-send of one (a raw or buggy client) is refused, and the
    session holds one int for it whatever the number of forgotten ids."""
    s = state()
    assert s.admit("reset", 1, RESET) is Op.RESET
    s.machine.finish(Op.RESET)
    s.deliver(Result(1, "s", {"done": False}))
    step = ("step", {"a": 1})
    for rid in range(2, 50):
        assert s.admit("step", rid, step, acked=True) is Op.STEP
        s.machine.finish(Op.STEP)
        s.deliver(Result(rid, "s", {"done": False}))
    assert len(s.cache) == 1 and s.cache.acked == 49
    for old, payload in [(1, RESET), (2, step), (48, step), (30, ("step", {"a": 9}))]:
        with pytest.raises(RequestIdReused) as caught:
            s.admit(payload[0], old, payload)
        assert caught.value.details == {
            "id": old,
            "now": payload[0],
            "acked": 49,
            "reason": "acked",
        }
        assert s.machine.running is None  # nothing ran, the session is free
    assert isinstance(s.admit("step", 49, step), Result)  # its own id: still a replay
    assert s.admit("step", 50, step) is Op.STEP  # a fresh id runs


def test_a_reused_id_is_not_a_replay():
    s = state()
    assert s.admit("reset", 1, RESET) is Op.RESET
    with pytest.raises(RequestIdReused):  # running, but another request under its id
        s.admit("reset", 1, ("reset", (7, {})))
    s.machine.finish(Op.RESET)
    s.deliver(Result(1, "s", {"done": False}))
    for other in [("reset", (1, {})), ("step", None), ("reset_batch", (None, {}))]:
        with pytest.raises(RequestIdReused) as caught:
            s.admit(other[0].split("_")[0], 1, other)
        assert caught.value.code == "REQUEST_ID_REUSED" and caught.value.details["id"] == 1
    nan = ("step", {"x": float("nan")})
    assert s.admit("step", 2, nan) is Op.STEP
    s.machine.finish(Op.STEP)
    s.deliver(Result(2, "s", {"done": False}))
    # A re-sent payload holding NaN is the same request (NaN is never equal to itself).
    assert isinstance(s.admit("step", 2, ("step", {"x": float("nan")})), Result)


def test_deliver_sends_to_the_owner():
    got = []

    class Sink:
        def send(self, reply):
            got.append(reply)

    s = state()
    s.owner = Sink()
    error = ErrorReply(None, "BAD_FRAME", "x")  # no id: sent, not remembered
    s.deliver(error)
    assert got == [error] and len(s.cache) == 0


def test_ending_releases_whatever_happens():
    a, b = state(), state()
    for s in (a, b):
        assert s.admit("reset", 9, RESET) is Op.RESET
    with pytest.raises(KeyError), ending([a, b], 9):
        raise KeyError("a bug after the sessions were marked running")
    assert a.machine.running is None and b.machine.running is None
    assert a.admit("reset", 10, RESET) is Op.RESET
    a.machine.finish(Op.RESET)
    with ending([a], 10):  # finished normally: nothing to release, nothing changed
        pass
    assert a.machine.phase.value == "ready"
    assert b.admit("reset", 11, RESET) is Op.RESET
    with ending([b], 99):  # another request's end never releases a running one
        pass
    assert b.machine.running == 11


def test_payloads_that_equality_cannot_compare():
    arr = ("step", {"x": np.arange(4.0)})
    assert same_request(arr, ("step", {"x": np.arange(4.0)}))
    assert not same_request(arr, ("step", {"x": np.arange(4.0) + 1}))
    assert not same_request(arr, ("step_batch", {"x": np.arange(4.0)}))
    assert same_request(("step", float("nan")), ("step", float("nan")))

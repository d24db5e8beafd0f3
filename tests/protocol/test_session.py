"""The lifecycle table, the reply cache and a session's one door in, without sockets."""

from __future__ import annotations

import pytest

from corral.errors import EpisodeEnded, ResetRequired, SessionBusy, SessionLost
from corral.protocol.batch import ItemResult
from corral.protocol.messages import ErrorReply, Result
from corral.protocol.session import (
    AFTER,
    AUTO_RESET_LIFECYCLE,
    LIFECYCLE,
    Op,
    Phase,
    ReplyCache,
    SessionMachine,
    SessionState,
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


def test_admit_is_the_one_door():
    s = state()
    assert s.admit("reset", 1) is Op.RESET
    assert s.admit("reset", 1) is None  # the same request, still running: nothing new
    with pytest.raises(SessionBusy):
        s.admit("step", 2)
    s.machine.finish(Op.RESET)
    reply = Result(1, "s", {"done": False})
    s.deliver(reply)  # no owner: remembered all the same
    assert s.admit("reset", 1) is reply  # answered: replayed, never run twice
    assert s.admit("step", 2) is Op.STEP
    s.machine.finish(Op.STEP)
    item = ItemResult("s", {"done": True})
    s.remember(3, item)
    assert s.admit("step", 3) is item


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

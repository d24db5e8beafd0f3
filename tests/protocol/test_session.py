"""The lifecycle state machine and reply cache, without sockets."""

from __future__ import annotations

import pytest

from corral.errors import EpisodeEnded, ResetRequired, SessionBusy, SessionLost
from corral.protocol.session import Op, Phase, ReplyCache, SessionMachine


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

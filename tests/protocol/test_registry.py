"""The session registry: capacity, ownership, resume, tombstones and expiry, without I/O."""

from __future__ import annotations

import pytest

from corral.errors import (
    CapacityReached,
    SessionElsewhere,
    SessionLost,
    TooManySessions,
    Unauthorized,
    UnknownSession,
)
from corral.protocol.identity import SessionIds, server_of
from corral.protocol.position import Phase
from corral.protocol.registry import TOMBSTONES, SessionRegistry
from corral.protocol.session import ReplyCache, SessionMachine, SessionState


class Owner:
    def send(self, reply):  # pragma: no cover - nothing is delivered in these tests
        raise AssertionError(reply)


def registry(**kwargs):
    options = {
        "max_sessions": 4,
        "max_per_owner": 2,
        "resume_window_s": 30.0,
        "idle_timeout_s": 600.0,
    }
    return SessionRegistry(**{**options, **kwargs})


def opened(reg, owner, sid="s1"):
    reg.reserve(owner)
    session = SessionState(
        id=sid, token=f"tok-{sid}", machine=SessionMachine(), cache=ReplyCache(), owner=owner
    )
    reg.add(session, owner)
    return session


def test_reservations_count_until_they_become_sessions():
    reg, a = registry(max_sessions=2), Owner()
    reg.reserve(a)
    assert reg.active == 1 and reg.held(a) == 1 and not reg.sessions
    reg.release(a)
    assert reg.active == 0 and reg.held(a) == 0
    opened(reg, a, "x")
    reg.reserve(a)  # a second open in flight
    with pytest.raises(TooManySessions) as many:
        reg.reserve(a)  # pending opens count against the per-owner limit
    assert many.value.details == {"limit": 2}
    with pytest.raises(CapacityReached) as full:
        reg.reserve(Owner())
    assert full.value.details == {"active_sessions": 2, "max_sessions": 2}
    assert reg.refused == 1


def test_an_owners_own_count_can_be_given():
    reg = registry()
    with pytest.raises(TooManySessions):
        reg.reserve(Owner(), held=2)


def test_sessions_answer_only_their_owner():
    reg, a, b = registry(), Owner(), Owner()
    session = opened(reg, a)
    assert reg.get("s1", a) is session
    with pytest.raises(UnknownSession):
        reg.get("s1", b)
    with pytest.raises(UnknownSession):
        reg.get("nope", a)


def test_attach_moves_the_session_and_its_count():
    reg, a, b = registry(max_per_owner=1), Owner(), Owner()
    session = opened(reg, a)
    with pytest.raises(Unauthorized):
        reg.attach("s1", "wrong", b)
    with pytest.raises(Unauthorized):
        reg.attach("s1", "ünïcode", b)  # any token string is compared safely
    assert reg.attach("s1", session.token, b) is session
    assert session.owner is b and reg.held(b) == 1 and reg.held(a) == 0
    assert reg.attach("s1", session.token, b) is session  # again: counted once
    assert reg.held(b) == 1
    opened(reg, a, "s2")  # a's slot was freed by the move
    with pytest.raises(TooManySessions):
        reg.attach("s2", "tok-s2", b)  # b holds its one session
    with pytest.raises(UnknownSession) as unknown:
        reg.attach("gone", "t", Owner())
    assert "restarted" in unknown.value.message


def test_detached_sessions_wait_for_their_window():
    reg, a = registry(resume_window_s=10.0, idle_timeout_s=None), Owner()
    session = opened(reg, a)
    reg.detach_all(a, now=100.0)
    assert session.owner is None and session.detached_at == 100.0 and reg.held(a) == 0
    assert reg.expired(now=109.0) == []
    assert reg.expired(now=110.0) == [(session, "connection lost and not resumed in time")]
    reg.attach("s1", session.token, a)
    assert session.detached_at is None and reg.expired(now=1e9) == []


def test_detaching_names_the_sessions_and_re_attaching_is_reported():
    attached = []
    reg, a, b = registry(on_attach=attached.append), Owner(), Owner()
    first, second = opened(reg, a, "s1"), opened(reg, a, "s2")
    assert reg.detach_all(a, now=1.0) == [first, second]
    assert reg.detach_all(a, now=2.0) == []
    with pytest.raises(Unauthorized):
        reg.attach("s1", "wrong", b)
    assert attached == []  # only a re-attach that succeeds is reported
    reg.attach("s1", first.token, b)
    assert attached == [first]


def test_idle_sessions_expire_unless_running():
    reg, a = registry(idle_timeout_s=5.0), Owner()
    session = opened(reg, a)
    session.last_active = 0.0
    session.machine.begin("reset", 1)
    assert reg.expired(now=100.0) == []  # a long call is not idleness
    session.machine.abort()
    assert reg.expired(now=100.0) == [(session, "idle for more than 5 s")]
    assert reg.check_interval() == 1.25


def test_removed_sessions_leave_a_tombstone_and_free_their_slot():
    reg, a = registry(), Owner()
    session = opened(reg, a)
    assert reg.remove(session, "reaped")
    assert not reg.remove(session, "again")
    assert session.machine.phase is Phase.CLOSED and reg.held(a) == 0 and reg.active == 0
    with pytest.raises(SessionLost) as lost:
        reg.get("s1", a)
    assert lost.value.details == {"reason": "reaped", "session": "s1"}
    for i in range(TOMBSTONES):
        reg.remove(opened(reg, a, f"t{i}"), "bulk")
    with pytest.raises(UnknownSession):  # the oldest tombstones are forgotten
        reg.get("s1", a)


def test_a_full_server_accepts_connections_that_resume():
    reg, a = registry(max_sessions=1), Owner()
    assert reg.accepts(None)
    opened(reg, a)
    assert not reg.accepts(None) and not reg.accepts("") and not reg.accepts("other")
    assert reg.accepts("other, s1")
    assert not reg.accepts(",".join(["x"] * 16 + ["s1"]))  # only the first 16 ids count


# -- identity: another server's sessions ----------------------------------------------


def fleet(server: str, key: bytes | None = b"fleet key") -> SessionRegistry[SessionState]:
    return registry(ids=SessionIds(server, key))


def test_ids_are_minted_for_this_server_and_a_peers_are_elsewhere():
    a, b, owner = fleet("srv-a"), fleet("srv-b"), Owner()
    sid = a.mint()
    assert server_of(sid) == "srv-a"
    opened(a, owner, sid)
    for ask in (lambda: b.get(sid, owner), lambda: b.attach(sid, f"tok-{sid}", owner)):
        with pytest.raises(SessionElsewhere) as caught:
            ask()
        assert caught.value.details == {"server": "srv-a", "session": sid}
        assert str(caught.value.code) == "SESSION_ELSEWHERE"
    assert b.elsewhere == 2 and a.elsewhere == 0


def test_own_unknown_forged_and_unverified_ids_stay_unknown():
    a, b, owner, other = fleet("srv-a"), fleet("srv-b"), Owner(), Owner()
    live = opened(a, owner, a.mint())
    # Another connection naming a live session of this server: unknown, as before.
    with pytest.raises(UnknownSession):
        a.get(live.id, other)
    # An id of this server it never made; a forged tag; another fleet's id; a server
    # without a fleet key cannot verify a peer's id either: never a redirect.
    forged = live.id.rsplit("~", 1)[0] + "~" + "0" * 24
    strangers = [b.mint(), forged, SessionIds("srv-a", b"another fleet").mint()]
    for sid in strangers:
        with pytest.raises(UnknownSession):
            b.get(sid, owner)
    with pytest.raises(UnknownSession):
        fleet("srv-b", None).get(SessionIds("srv-a").mint(), owner)
    assert b.elsewhere == 0
    # A tombstone wins: a session this server closed is lost here, whoever asks.
    a.remove(live, "drained")
    with pytest.raises(SessionLost, match="drained"):
        a.get(live.id, other)

"""The drain's table and phases, sans I/O (corral.protocol.drain)."""

from __future__ import annotations

import pytest

from corral.errors import NotReady
from corral.protocol.drain import DRAIN_RULES, OPENING, Drain, DrainFigures, DrainPhase
from corral.protocol.messages import REQUESTS, GoingAway


def test_the_table_refuses_only_new_sessions_while_draining() -> None:
    assert DRAIN_RULES[DrainPhase.SERVING] == frozenset()
    assert set(DRAIN_RULES) == set(DrainPhase)
    for phase in (DrainPhase.DRAINING, DrainPhase.DONE):
        assert DRAIN_RULES[phase] == OPENING == {"open", "restore"}
    # Every refused kind is a request of the protocol (no typo hides in the table).
    assert set(REQUESTS) >= OPENING
    with pytest.raises(TypeError):
        DRAIN_RULES[DrainPhase.SERVING] = frozenset()  # type: ignore[index]


def test_a_draining_server_refuses_opens_and_restores_and_serves_the_rest() -> None:
    drain = Drain("srv-a")
    for kind in REQUESTS:
        drain.admit(kind)
    assert drain.unavailable() is None and not drain.draining
    assert drain.begin(now=100.0, deadline_s=30.0, held=4, reason="rollout")
    for kind in ("open", "restore"):
        with pytest.raises(NotReady) as caught:
            drain.admit(kind)
        assert caught.value.details == {"reason": "rollout", "draining": True, "server": "srv-a"}
    for kind in set(REQUESTS) - OPENING:
        drain.admit(kind)  # steps, snapshot, attach, close, batches go on
    assert drain.unavailable() == "draining: rollout"


def test_the_first_deadline_stands() -> None:
    drain = Drain("s")
    assert drain.begin(0.0, 10.0, held=1)
    assert not drain.begin(5.0, 100.0, held=1)
    assert drain.remaining(5.0) == 5.0
    with pytest.raises(ValueError, match=">= 0"):
        Drain("t").begin(0.0, -1.0, held=0)


def test_notices_go_only_to_clients_that_read_them_with_the_time_left() -> None:
    drain = Drain("srv-a")
    assert drain.notice(0.0, wants_notices=True) is None  # not draining
    drain.begin(10.0, 30.0, held=2, reason="rollout")
    assert drain.notice(12.5, wants_notices=False) is None
    assert drain.notice(12.5, wants_notices=True) == GoingAway(27.5, "rollout", "srv-a")
    assert drain.notice(99.0, wants_notices=True) == GoingAway(0.0, "rollout", "srv-a")
    drain.finished(99.0, held=0)
    assert drain.notice(99.0, wants_notices=True) is None  # over: nothing to announce


def test_it_ends_early_when_no_session_is_left() -> None:
    drain = Drain("s")
    assert not drain.finished(0.0, held=0)  # serving: never "finished"
    drain.begin(0.0, 60.0, held=3)
    assert not drain.finished(1.0, held=3)
    assert drain.figures(held=2) == DrainFigures(at_start=3, moved_away=1, lost=0)
    assert drain.finished(2.0, held=0)
    assert drain.phase is DrainPhase.DONE
    drain.closing(held=0)
    assert drain.figures(held=0) == DrainFigures(3, 3, 0)
    with pytest.raises(NotReady):
        drain.admit("open")  # done is not serving again


def test_at_the_deadline_what_is_left_is_lost() -> None:
    drain = Drain("s")
    drain.begin(0.0, 5.0, held=4)
    assert not drain.finished(4.9, held=2)
    assert drain.finished(5.0, held=2)
    assert drain.finished(4.0, held=2)  # once over, stays over
    drain.closing(held=2)
    drain.closing(held=0)  # counted once
    assert drain.figures(held=0) == DrainFigures(at_start=4, moved_away=2, lost=2)
    assert Drain("x").figures(held=7) == DrainFigures()

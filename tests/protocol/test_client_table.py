"""The client connection's state table, row by row, through the protocol object's entry points.

Every row of :data:`~corral.protocol.client.TRANSITIONS` is walked: a protocol object is
driven into the row's state the way a transport drives it (connect, socket opened,
frames, losses, timers), the row's event is fired the same way, and the state it lands
in is the row's. A pair the table does not have is refused as a bug.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from corral.errors import ConnectionLost, InternalError, Unauthorized
from corral.protocol.client import (
    ADMISSION,
    TRANSITIONS,
    Actions,
    Admit,
    ClientProtocol,
    ConnEvent,
    ConnState,
    ReconnectPolicy,
)
from corral.protocol.codecs import MsgpackCodec
from corral.protocol.messages import Attached, GetState, Open, Opened, Welcome

CODEC = MsgpackCodec()
S, E = ConnState, ConnEvent
DEFAULT = ReconnectPolicy(initial_delay_s=1.0, max_delay_s=1.0, jitter=0.0)
ONE_ATTEMPT = ReconnectPolicy(initial_delay_s=1.0, max_delay_s=1.0, jitter=0.0, max_attempts=1)


class Peer:
    """A protocol object and the server's side of its frames, driven step by step."""

    def __init__(self, policy: ReconnectPolicy | None) -> None:
        self.proto = ClientProtocol(CODEC, url="ws://h/ws", reconnect=policy, seed=1)
        self.sent: list[dict[str, Any]] = []
        self.now = 0.0

    def _take(self, out: Any) -> Any:
        if isinstance(out, Actions):
            self.sent += [CODEC.decode(frame) for frame in out.write]
        return out

    def _last(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["type"] == kind]

    def connect(self) -> None:
        self.proto.connect(None, False)

    def opened(self) -> None:
        frame = self.proto.opened(self.proto.generation)
        assert frame is not None
        self.sent.append(CODEC.decode(frame))

    def welcome(self) -> Any:
        hello = self._last("hello")[-1]
        reply = Welcome(hello["id"], {"instance": "i1"}, {"name": "x"}, {}, "exact")
        return self._take(self.proto.receive(CODEC.encode(reply.to_wire())))

    def attach_all(self) -> Any:
        out = None
        for attach in self._last("attach"):
            reply = Attached(attach["id"], attach["session"], attach["token"])
            out = self._take(self.proto.receive(CODEC.encode(reply.to_wire())))
        return out

    def open_session(self, sid: str) -> None:
        request = Open(self.proto.next_id())
        assert self.proto.send(request) is not None
        self.proto.receive(CODEC.encode(Opened(request.id, sid, f"t-{sid}").to_wire()))

    def lost(self, error: BaseException) -> Actions | None:
        self.now += 0.5
        return self.proto.lost(self.proto.generation, error, self.now)

    def timer(self) -> None:
        self.now += 1.0
        assert self.proto.timer_fired(self.now) is not None


def at(state: ConnState, *, sessions: bool, policy: ReconnectPolicy | None) -> Peer:
    """A peer driven into ``state`` through the entry points (with a live session to
    re-attach when ``sessions``)."""
    failed_first = state in (S.ATTACHING, S.FAILED) or (
        state in (S.DIALING, S.GREETING) and sessions
    )
    peer = Peer(None if failed_first else policy)
    steps: list[Callable[[], Any]] = []
    if state is S.IDLE:
        return peer
    if state is S.CLOSED:
        peer.proto.close()
        return peer
    peer.connect()
    if state is S.DIALING and not sessions:
        return peer
    peer.opened()
    if state is S.GREETING and not sessions:
        return peer
    peer.welcome()
    if sessions:
        peer.open_session("s")
    if state is S.OPEN:
        return peer
    if failed_first:  # a connection that gave up, connecting afresh with its session
        assert isinstance(peer.lost(ConnectionLost("cut")), Actions)
        assert peer.proto.state is S.FAILED
        peer.proto.policy = policy
        steps = [peer.connect, peer.opened, peer.welcome]
        stop = {S.FAILED: 0, S.DIALING: 1, S.GREETING: 2, S.ATTACHING: 3}[state]
    else:  # a drop of the open connection, and the resume
        peer.lost(ConnectionLost("cut"))
        steps = [peer.timer, peer.opened, peer.welcome]
        stop = {S.WAITING: 0, S.REDIALING: 1, S.REGREETING: 2, S.REATTACHING: 3}[state]
    for step in steps[:stop]:
        step()
    assert peer.proto.state is state
    return peer


FIRE: dict[ConnEvent, Callable[[Peer], Any]] = {
    E.CONNECT: Peer.connect,
    E.OPENED: Peer.opened,
    E.WELCOMED: Peer.welcome,
    E.READY: lambda peer: (
        peer.welcome() if peer.proto.state in (S.GREETING, S.REGREETING) else peer.attach_all()
    ),
    E.DROPPED: lambda peer: peer.lost(ConnectionLost("cut")),
    E.REFUSED: lambda peer: peer.lost(Unauthorized("wrong token")),
    E.EXHAUSTED: lambda peer: peer.lost(ConnectionLost("cut")),
    E.TIMER: Peer.timer,
    E.CLOSE: lambda peer: peer.proto.close(),
}
"""How a transport (or the clock, or the caller) makes each event happen."""


def setup_for(state: ConnState, event: ConnEvent) -> dict[str, Any]:
    """The peer a row needs: sessions to re-attach for WELCOMED (and READY after it), a
    budget of one attempt for EXHAUSTED (none at all from OPEN)."""
    sessions = event is E.WELCOMED or state in (S.ATTACHING, S.REATTACHING)
    if event is E.EXHAUSTED:
        return {"sessions": sessions, "policy": None if state is S.OPEN else ONE_ATTEMPT}
    return {"sessions": sessions, "policy": DEFAULT}


@pytest.mark.parametrize(
    ("state", "event", "after"),
    [(state, event, after) for (state, event), after in TRANSITIONS.items()],
    ids=[f"{state}-{event}" for state, event in TRANSITIONS],
)
def test_every_row_of_the_table(state, event, after):
    peer = at(state, **setup_for(state, event))
    FIRE[event](peer)
    assert peer.proto.state is after


def test_what_each_state_admits():
    assert set(ADMISSION) == set(ConnState)
    for state, admit in ADMISSION.items():
        peer = at(state, sessions=state in (S.ATTACHING, S.REATTACHING), policy=DEFAULT)
        request = GetState(peer.proto.next_id(), "s")
        if admit is Admit.SEND:
            assert peer.proto.send(request) is not None
        elif admit is Admit.HOLD:
            assert peer.proto.send(request) is None
            assert peer.proto.tracker.outstanding()[request.id] == "state"  # for the resend
        else:
            with pytest.raises(Exception) as err:
                peer.proto.send(request)
            assert (
                err.value.code
                == {  # type: ignore[attr-defined]
                    Admit.NOT_CONNECTED: "CONNECTION_LOST",
                    Admit.FAILED: "CONNECTION_LOST",
                    Admit.CLOSED: "CLIENT_CLOSED",
                }[admit]
            )


def test_a_pair_the_table_does_not_have_is_a_bug():
    missing = [(s, e) for s in ConnState for e in ConnEvent if (s, e) not in TRANSITIONS]
    assert missing
    for state, event in missing:
        proto = ClientProtocol(CODEC)
        proto.state = state
        with pytest.raises(InternalError, match=f"cannot take {event!r}"):
            proto._to(event)
        assert proto.state is state

"""The server connection object, driven by frames alone: no socket, no loop, no env."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contract.tasks import TaskRef
from corral.errors import ErrorCode
from corral.protocol import batch as b
from corral.protocol import messages as m
from corral.protocol.codecs import get_codec
from corral.protocol.handshake import Compat
from corral.protocol.registry import SessionRegistry
from corral.protocol.server import (
    CloseSession,
    ConnectionGate,
    Greeting,
    OpenSession,
    RunBatch,
    RunCall,
    ServerConnection,
)
from corral.protocol.session import Op, ReplyCache, SessionMachine, SessionState

GREETING = Greeting(
    server={"name": "corral", "instance": "i1"},
    env={"name": "test"},
    limits={"max_batch": 4},
    contract_version="2.1.0",
    fingerprint="sha256:abc",
    schemas={"action": {}, "observation": {}, "state": {}},
    migrations={1: lambda action: {**action, "migrated": True}},
)


class Peer:
    """One end of a wire: frames in, typed replies out, and the sessions it built."""

    def __init__(
        self, registry: SessionRegistry[SessionState] | None = None, codec: str = "msgpack"
    ) -> None:
        self.codec = get_codec(codec)
        self.registry = registry or SessionRegistry(
            max_sessions=8, max_per_owner=4, resume_window_s=30, idle_timeout_s=None
        )
        self.frames: list[Any] = []
        self.errors: list[str] = []
        self.conn = ServerConnection(
            self.codec,
            self.registry,
            GREETING,
            write=self.frames.append,
            max_frame_bytes=1024,
            max_batch=4,
            count_error=self.errors.append,
        )

    def send(self, message: Any) -> Any:
        wire = message if isinstance(message, dict) else message.to_wire()
        return self.conn.receive(self.codec.encode(wire))

    def replies(self) -> list[m.Reply]:
        out = [m.parse_reply(self.codec.decode(frame)) for frame in self.frames]
        self.frames.clear()
        return out

    def reply(self) -> m.Reply:
        (only,) = self.replies()
        return only

    def hello(self, **kwargs: Any) -> m.Welcome:
        assert self.send(m.Hello(1, **kwargs)) is None
        welcome = self.reply()
        assert isinstance(welcome, m.Welcome)
        return welcome

    def open(self, rid: int = 2) -> SessionState:
        event = self.send(m.Open(rid))
        assert isinstance(event, OpenSession) and event.request.id == rid
        session = SessionState(
            id=f"s{rid}",
            token=f"t{rid}",
            machine=SessionMachine(),
            cache=ReplyCache(),
            owner=self.conn,
        )
        self.registry.add(session, self.conn)  # what the server does once it is built
        assert self.conn.opened(event.request, session)
        assert self.reply() == m.Opened(rid, session.id, session.token)
        return session


def reset(*sessions: SessionState) -> None:
    """Run a reset (request 1) through each session's machine, as the server would."""
    for session in sessions:
        session.machine.begin("reset", 1)
        session.machine.finish(Op.RESET)


def error(reply: m.Reply) -> str:
    assert isinstance(reply, m.ErrorReply), reply
    return reply.code


def test_nothing_but_hello_before_the_handshake():
    peer = Peer()
    assert peer.send(m.Open(1)) is None
    refused = peer.reply()
    assert error(refused) == ErrorCode.HANDSHAKE_REQUIRED and refused.id == 1
    peer.send(m.Hello(2, protocol="corral/9"))
    assert error(peer.reply()) == ErrorCode.UNSUPPORTED_PROTOCOL
    peer.send(m.Hello(3, contract=m.ContractRef("3.0.0", "x")))
    assert error(peer.reply()) == ErrorCode.CONTRACT_MISMATCH
    assert peer.conn.compat is None
    welcome = peer.hello(want_schemas=True)
    assert welcome.compat == "unchecked" and welcome.schemas == GREETING.schemas
    assert welcome.server == GREETING.server and welcome.limits == GREETING.limits
    assert peer.errors == ["HANDSHAKE_REQUIRED", "UNSUPPORTED_PROTOCOL", "CONTRACT_MISMATCH"]


def test_contract_negotiation_and_migration():
    peer = Peer()
    welcome = peer.hello(contract=m.ContractRef("2.0.0", "sha256:abc"))
    assert welcome.compat == "exact" and welcome.schemas is None and peer.conn.migrate is None
    assert peer.hello(contract=m.ContractRef("2.5.0")).compat == "compatible"
    assert peer.hello(contract=m.ContractRef("1.9.0")).compat == "migrated"
    assert peer.conn.compat is Compat.MIGRATED
    assert peer.conn.migrate is not None and peer.conn.migrate({"a": 1})["migrated"] is True


def test_frames_that_do_not_parse_are_answered_with_their_id():
    peer = Peer()
    peer.hello()
    peer.conn.receive(b"\xc1 not msgpack")
    assert error(reply := peer.reply()) == ErrorCode.BAD_FRAME and reply.id is None
    peer.send({"type": "state", "id": 7, "session": 5})
    assert error(reply := peer.reply()) == ErrorCode.BAD_MESSAGE and reply.id == 7
    peer.send({"type": "teleport", "id": 8, "session": "s"})
    reply = peer.reply()
    assert error(reply) == ErrorCode.UNKNOWN_TYPE and (reply.id, reply.session) == (8, "s")
    peer.send({"type": "step", "id": 9, "session": "s", "action": "x" * 2000})
    reply = peer.reply()
    assert error(reply) == ErrorCode.FRAME_TOO_LARGE and (reply.id, reply.session) == (9, "s")
    assert reply.details == {"size": reply.details["size"], "limit": 1024}
    peer.conn.receive("a text frame")
    assert error(peer.reply()) == ErrorCode.BAD_FRAME


def test_a_session_request_becomes_one_call_and_replays_after():
    peer = Peer()
    peer.hello()
    session = peer.open()
    event = peer.send(m.Step(3, session.id, {"n": 1}))
    assert error(peer.reply()) == ErrorCode.RESET_REQUIRED and event is None
    call = peer.send(m.Reset(4, session.id, seed=1, options={"k": 1}))
    assert isinstance(call, RunCall) and call.op is Op.RESET and call.session is session
    assert call.request == m.Reset(4, session.id, 1, {"k": 1})
    assert peer.send(m.Reset(4, session.id, 1, {"k": 1})) is None and peer.frames == []
    assert peer.send(m.Reset(4, session.id)) is None  # another reset under a running id
    assert error(peer.reply()) == ErrorCode.REQUEST_ID_REUSED
    busy = peer.send(m.GetState(5, session.id))
    assert busy is None and error(peer.reply()) == ErrorCode.SESSION_BUSY
    session.machine.finish(Op.RESET)
    answer = m.Result(4, session.id, {"done": False})
    session.deliver(answer)
    assert peer.reply() == answer
    assert peer.send(m.Reset(4, session.id, 1, {"k": 1})) is None
    assert peer.reply() == answer  # answered again, never run twice
    assert peer.send(m.Reset(4, session.id, 2, {"k": 1})) is None
    assert error(reply := peer.reply()) == ErrorCode.REQUEST_ID_REUSED and reply.id == 4
    other_task = m.Reset(4, session.id, 1, {"k": 1}, TaskRef(split="test", index=0))
    assert peer.send(other_task) is None  # another task is another request
    assert error(reply := peer.reply()) == ErrorCode.REQUEST_ID_REUSED and reply.id == 4
    unknown = peer.send(m.GetState(6, "nope"))
    assert unknown is None and error(peer.reply()) == ErrorCode.UNKNOWN_SESSION


def test_batches_are_admitted_item_by_item():
    peer = Peer()
    peer.hello()
    a, c = peer.open(2), peer.open(3)
    reset(a, c)
    items = (
        b.StepItem(a.id, {"n": 1}),
        b.StepItem("nope", {}),
        b.StepItem(a.id, {"n": 2}),
        b.StepItem(c.id, {"n": 3}),
    )
    batch = peer.send(b.StepBatch(10, items))
    assert isinstance(batch, RunBatch) and batch.request.id == 10
    assert [(call.index, call.session, call.op) for call in batch.calls] == [
        (0, a, Op.STEP),
        (3, c, Op.STEP),
    ]
    codes = [r.code if isinstance(r, b.ItemError) else r for r in batch.results]
    assert codes == [None, "UNKNOWN_SESSION", "SESSION_BUSY", None]
    assert peer.errors == ["UNKNOWN_SESSION", "SESSION_BUSY"]
    resent = peer.send(b.StepBatch(10, (b.StepItem(a.id, {"n": 1}),)))
    assert resent.joins == [(0, a)] and resent.calls == []  # the original still runs
    a.machine.finish(Op.STEP)
    done = b.ItemResult(a.id, {"done": False})
    a.remember(10, done)
    again = peer.send(b.StepBatch(10, (b.StepItem(a.id, {"n": 1}),)))
    assert again.results == [done] and again.calls == []
    too_big = peer.send(b.StepBatch(11, tuple(b.StepItem(a.id, {}) for _ in range(5))))
    assert too_big is None and error(peer.reply()) == ErrorCode.BATCH_TOO_LARGE


def test_an_acked_batch_or_step_leaves_one_reply_per_session() -> None:
    peer = Peer()
    peer.hello()
    a, c = peer.open(2), peer.open(3)
    reset(a, c)
    for rid in (10, 11):
        batch = peer.send(b.StepBatch(rid, (b.StepItem(a.id, {}), b.StepItem(c.id, {}))))
        assert isinstance(batch, RunBatch)
        for call in batch.calls:
            call.session.machine.finish(Op.STEP)
            call.session.remember(rid, b.ItemResult(call.session.id, {"done": False}))
    assert len(a.cache) == len(c.cache) == 2  # not acked: the last replies stay
    acked = peer.send(b.StepBatch(13, (b.StepItem(a.id, {}),), acked=True))
    assert [call.session for call in acked.calls] == [a]
    assert len(a.cache) == 0 and len(c.cache) == 2  # only the sessions it names
    a.machine.finish(Op.STEP)
    call = peer.send(m.Step(14, a.id, {"n": 1}, acked=True))
    assert isinstance(call, RunCall) and call.request.acked
    state = peer.send(m.GetState(15, c.id))
    assert isinstance(state, RunCall) and len(c.cache) == 2  # a state never acks


def test_a_resent_batch_replays_the_reset_with_its_item() -> None:
    peer = Peer()
    peer.hello()
    a = peer.open(2)
    reset(a)
    message = b.StepBatch(10, (b.StepItem(a.id, {"n": 1}),), autoreset=True)
    first = peer.send(message)
    assert isinstance(first, RunBatch) and first.request.autoreset
    assert [(c.session, c.op) for c in first.calls] == [(a, Op.STEP)]
    # What the server does: the step ends the episode, the reset runs under the same id.
    a.machine.finish(Op.STEP, done=True)
    assert a.machine.begin("autoreset", 10) is Op.AUTO_RESET
    resent = peer.send(message)
    assert resent.joins == [(0, a)] and resent.calls == []  # still running: joins it
    a.machine.finish(Op.AUTO_RESET)
    item = b.ItemResult(a.id, {"done": True}, reset=b.ItemResult(a.id, {"done": False}))
    a.remember(10, item)
    again = peer.send(message)
    assert again.calls == [] and again.results == [item]  # the reset is not run twice
    assert a.machine.episodes == 2


def test_request_ids_are_not_shared_by_single_and_batch_replies():
    peer = Peer()
    peer.hello()
    session = peer.open()
    session.remember(7, b.ItemResult(session.id, {}))
    peer.send(m.GetState(7, session.id))
    assert error(peer.reply()) == ErrorCode.REQUEST_ID_REUSED
    session.deliver(m.StateReply(8, session.id, {}))
    batch = peer.send(b.ResetBatch(8, (b.ResetItem(session.id),)))
    assert batch.results[0].code == ErrorCode.REQUEST_ID_REUSED


def test_open_attach_close():
    registry = SessionRegistry(
        max_sessions=2, max_per_owner=1, resume_window_s=30, idle_timeout_s=None
    )
    first, second = Peer(registry), Peer(registry)
    for peer in (first, second):
        peer.hello()
    session = first.open()
    first.send(m.Open(3))
    assert error(first.reply()) == ErrorCode.TOO_MANY_SESSIONS
    second.send(m.Open(4))  # reserved, not yet built
    assert registry.active == 2
    third = Peer(registry)
    third.hello()
    third.send(m.Open(5))
    assert error(third.reply()) == ErrorCode.CAPACITY_REACHED
    registry.release(second.conn)  # the build failed
    second.send(m.Attach(6, session.id, "wrong"))
    assert error(second.reply()) == ErrorCode.UNAUTHORIZED
    assert second.send(m.Attach(7, session.id, session.token)) is None
    assert second.reply() == m.Attached(7, session.id, session.token)
    assert session.owner is second.conn
    first.send(m.Close(8, session.id))
    assert error(first.reply()) == ErrorCode.UNKNOWN_SESSION  # not first's any more
    close = second.send(m.Close(9, session.id))
    assert isinstance(close, CloseSession) and close.session is session


def test_a_session_opened_after_its_connection_closed_is_refused():
    peer = Peer()
    peer.hello()
    event = peer.send(m.Open(2))
    peer.conn.close()
    session = SessionState(
        id="late", token="t", machine=SessionMachine(), cache=ReplyCache(), owner=peer.conn
    )
    assert not peer.conn.opened(event.request, session)
    assert peer.frames == []


def test_a_reply_the_codec_cannot_carry_becomes_an_error_for_its_request():
    for codec in ("msgpack", "json"):
        peer = Peer(codec=codec)
        peer.conn.send(m.Result(3, "s", {"big": 2**70}))
        reply = peer.reply()
        assert error(reply) == ErrorCode.BAD_OBSERVATION and (reply.id, reply.session) == (3, "s")
        peer.conn.send(m.Welcome(4, {"x": 2**70}, {}, {}, "exact"))
        assert error(peer.reply()) == ErrorCode.INTERNAL_ERROR
        peer.conn.send(m.ErrorReply(5, "X", "y", {"big": 2**70}))
        assert peer.frames == []  # logged: an error about an error would never end


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_a_same_step_reset_the_codec_cannot_carry_becomes_its_error(codec):
    peer = Peer(codec=codec)
    bad = b.ItemResult("a", {"n": 1}, reset=b.ItemResult("a", {"big": 2**70}))
    good = b.ItemResult("b", {"n": 2}, reset=b.ItemResult("b", {"n": 0}))
    for columnar in (False, True):
        peer.conn.send(b.BatchReply(6, [bad, good], columnar=columnar))
        reply = peer.reply()
        assert isinstance(reply, b.BatchReply)
        first, second = reply.results
        assert first == b.ItemResult("a", {"n": 1}, reset=first.reset)  # the step stays
        assert isinstance(first.reset, b.ItemError)
        assert first.reset.code == ErrorCode.BAD_OBSERVATION
        assert second == good
    assert bad.reset == b.ItemResult("a", {"big": 2**70})  # the remembered item is untouched


def test_connection_gate():
    gate = ConnectionGate(2)
    assert gate.enter("a") is None and gate.enter("a") is None and gate.enter("b") is None
    refused = gate.enter("a")
    assert refused is not None and refused.details == {"limit": 2, "address": "a"}
    gate.leave("a")
    assert gate.enter("a") is None
    for _ in range(2):
        gate.leave("a")
    gate.leave("b")
    assert gate.held == {}
    unlimited = ConnectionGate(None)
    assert all(unlimited.enter("a") is None for _ in range(100))


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_both_codecs(codec):
    peer = Peer(codec=codec)
    peer.hello()
    session = peer.open()
    assert isinstance(peer.send(m.Reset(3, session.id)), RunCall)

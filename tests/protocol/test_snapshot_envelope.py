"""Snapshots in the protocol, without sockets: the envelope, its signature, the server's
seal, the lifecycle's position, and the server connection's snapshot and restore."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from corral.contract import Observation, Snapshot
from corral.errors import (
    BadMessage,
    BadObservation,
    BadSnapshot,
    ContractMismatch,
    ErrorCode,
    SnapshotTooLarge,
    SnapshotUnsupported,
)
from corral.protocol import messages as m
from corral.protocol.codecs import JsonCodec, MsgpackCodec, get_codec
from corral.protocol.openenv import client_frame
from corral.protocol.position import Phase, Position
from corral.protocol.registry import SessionRegistry
from corral.protocol.server import Greeting, OpenSession, RestoreSession, RunCall, ServerConnection
from corral.protocol.session import LIFECYCLE, Op, ReplyCache, SessionMachine, SessionState
from corral.protocol.snapshot import FORMAT, SessionSnapshot, SnapshotSeal, signature

KEY = b"fleet-key-of-at-least-32-bytes-long!"


class Seen(Observation):
    text: str = ""


class TallySnapshot(Snapshot):
    count: int
    ratio: float = 0.5
    blob: bytes = b""
    last: Seen | None = None


def seal(key: bytes | None = KEY, **kwargs: Any) -> SnapshotSeal:
    settings: dict[str, Any] = {
        "env": "tally",
        "contract_version": "1.2.0",
        "fingerprint": "sha256:0000000000000001",
        "model": TallySnapshot,
        "key": key,
        "max_bytes": 4096,
        **kwargs,
    }
    return SnapshotSeal(**settings)


READY = Position(Phase.READY, 2, 7, 3)
VALUE = TallySnapshot(count=3, ratio=1.0, blob=b"\x00\xff", last=Seen(text="hi", reward=2.0))


# -- the lifecycle's position ------------------------------------------------------------


def test_snapshot_is_allowed_wherever_state_is_and_changes_nothing() -> None:
    for phase, rules in LIFECYCLE.items():
        assert rules["snapshot"] is Op.SNAPSHOT and "state" in rules, phase
    machine = SessionMachine()
    machine.begin("reset", 1)
    machine.finish(Op.RESET)
    before = machine.position()
    assert machine.begin("snapshot", 2) is Op.SNAPSHOT
    machine.finish(Op.SNAPSHOT)
    assert machine.position() == before and machine.running is None


def test_a_restored_machine_continues_where_the_position_was() -> None:
    machine = SessionMachine()
    for rid, (kind, op, done) in enumerate(
        [("reset", Op.RESET, False), ("step", Op.STEP, True), ("reset", Op.RESET, False)]
        + [("step", Op.STEP, False)] * 2
    ):
        machine.begin(kind, rid)
        machine.finish(op, done)
    position = machine.position()
    assert position == Position(Phase.READY, 2, 3, 2)
    twin = SessionMachine.restored(position, auto_reset=True)
    assert twin.position() == position and twin.auto_reset and twin.running is None
    twin.begin("step", 9)
    twin.finish(Op.STEP, done=True)
    assert twin.position() == Position(Phase.ENDED, 2, 4, 3)


@pytest.mark.parametrize(
    ("position", "problem"),
    [
        (Position(Phase.CLOSED, 1, 0, 0), "closed"),
        (Position(Phase.READY, 1, -1, 0), "negative"),
        (Position(Phase.READY, 1, 2, 3), "more steps"),
        (Position(Phase.NEW, 1, 0, 0), "new exactly"),
        (Position(Phase.READY, 0, 0, 0), "new exactly"),
        (Position(Phase.NEW, 0, 2, 0), "no step"),
    ],
)
def test_impossible_positions_are_named(position: Position, problem: str) -> None:
    assert problem in (position.problem() or "")
    assert Position(Phase.NEW, 0, 0, 0).problem() is None


# -- the envelope ----------------------------------------------------------------------


def test_seal_signs_and_open_verifies_over_both_codecs() -> None:
    sealer = seal()
    envelope = sealer.seal(READY, VALUE, 1767225600.5)
    assert envelope.format == FORMAT and envelope.sig is not None
    assert envelope.sig == signature(envelope.canonical(), KEY)
    assert envelope.snapshot["blob"] == "AP8="  # the model's JSON form, whatever the codec
    for codec in (MsgpackCodec(), JsonCodec()):
        wire = codec.decode(codec.encode({"s": envelope.to_wire()}))["s"]
        back = SessionSnapshot.from_wire(wire)
        assert back == envelope
        assert sealer.open(back) == (READY, VALUE)


def test_an_envelope_through_a_javascript_client_still_verifies() -> None:
    """JSON.stringify writes 1.0 as 1 and re-orders nothing that matters: the canonical
    form writes integral floats as integers and sorts keys."""
    sealer = seal()
    envelope = sealer.seal(READY, VALUE, 1767225600.0)
    text = json.dumps(as_javascript_writes(envelope.to_wire()))
    assert '"ratio": 1,' in text and '"created_at": 1767225600,' in text
    rewritten = SessionSnapshot.from_wire(json.loads(text))
    assert rewritten.snapshot["ratio"] == 1 and isinstance(rewritten.snapshot["ratio"], int)
    assert sealer.open(rewritten) == (READY, VALUE)


def as_javascript_writes(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: as_javascript_writes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_javascript_writes(v) for v in value]
    return value


def test_without_a_key_envelopes_are_unsigned_and_the_model_is_the_guard() -> None:
    plain = seal(key=None)
    envelope = plain.seal(READY, VALUE, 1.0)
    assert envelope.sig is None and "sig" not in envelope.to_wire()
    assert plain.open(envelope)[1] == VALUE
    # A signed one is accepted too (it cannot be checked without the key).
    assert plain.open(seal().seal(READY, VALUE, 1.0))[1] == VALUE
    forged = dataclasses.replace(envelope, snapshot={**envelope.snapshot, "count": "many"})
    with pytest.raises(BadSnapshot, match="invalid TallySnapshot: count"):
        plain.open(forged)


def test_with_a_key_unsigned_or_altered_envelopes_are_refused() -> None:
    sealer = seal()
    envelope = sealer.seal(READY, VALUE, 1.0)
    with pytest.raises(BadSnapshot, match="not signed") as unsigned:
        sealer.open(dataclasses.replace(envelope, sig=None))
    assert unsigned.value.details == {"field": "sig"}
    altered = dataclasses.replace(envelope, snapshot={**envelope.snapshot, "count": 99})
    with pytest.raises(BadSnapshot, match="signature does not match"):
        sealer.open(altered)
    moved = dataclasses.replace(envelope, position=Position(Phase.READY, 2, 7, 0))
    with pytest.raises(BadSnapshot, match="signature does not match"):
        sealer.open(moved)
    with pytest.raises(BadSnapshot, match="signature does not match"):
        seal(key=b"another-fleet-key-of-32-bytes-or-so").open(envelope)


def test_another_environment_or_contract_is_refused() -> None:
    envelope = seal(key=None).seal(READY, VALUE, 1.0)
    with pytest.raises(BadSnapshot, match="of environment 'tally', this server serves 'other'"):
        seal(key=None, env="other").open(envelope)
    with pytest.raises(ContractMismatch, match="another major version") as major:
        seal(key=None, contract_version="2.0.0").open(envelope)
    assert major.value.details["snapshot_version"] == "1.2.0"
    # Another fingerprint of the same major: restored when the current model takes it ...
    assert seal(key=None, fingerprint="sha256:ffff").open(envelope)[1] == VALUE

    # ... and a contract mismatch when it does not.
    class Narrower(Snapshot):
        count: int

    with pytest.raises(ContractMismatch, match="refuses it: invalid Narrower") as refused:
        seal(key=None, fingerprint="sha256:ffff", model=Narrower).open(envelope)
    assert refused.value.details["errors"][0]["type"] == "extra_forbidden"
    with pytest.raises(BadSnapshot, match="invalid Narrower"):
        seal(key=None, model=Narrower).open(envelope)


def test_size_limits_apply_to_taking_and_restoring() -> None:
    big = TallySnapshot(count=1, blob=b"x" * 6000)
    with pytest.raises(SnapshotTooLarge) as taken:
        seal().seal(READY, big, 1.0)
    assert taken.value.details["limit"] == 4096 and taken.value.details["size"] > 8000
    envelope = seal(max_bytes=1 << 20).seal(READY, big, 1.0)
    with pytest.raises(SnapshotTooLarge):
        seal().open(envelope)


def test_an_env_returning_the_wrong_model_is_a_bad_observation() -> None:
    with pytest.raises(BadObservation, match=r"snapshot\(\) returned Seen, not TallySnapshot"):
        seal().seal(READY, Seen(), 1.0)


def test_an_env_without_snapshots_refuses_with_the_fix() -> None:
    none = seal(model=None)
    assert not none.supported
    with pytest.raises(SnapshotUnsupported, match=r"tally declares no snapshot: .* define "):
        none.open(seal().seal(READY, VALUE, 1.0))


def wire(**changes: Any) -> dict[str, Any]:
    base = seal(key=None).seal(READY, VALUE, 1.0).to_wire()
    for path, value in changes.items():
        target = base
        *parents, leaf = path.split("__")
        for parent in parents:
            target = target[parent]
        if value is KeyError:
            del target[leaf]
        else:
            target[leaf] = value
    return base


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"format": "corral-snapshot/9"}, "format"),
        ({"env": 3}, "env"),
        ({"contract": "1.0.0"}, "contract"),
        ({"contract__fingerprint": None}, "contract.fingerprint"),
        ({"position__phase": "closed"}, "position.phase"),
        ({"position__episodes": True}, "position.episodes"),
        ({"position__steps": "7"}, "position.steps"),
        ({"position__episode_steps": 99}, "position"),
        ({"snapshot": KeyError}, "snapshot"),
        ({"created_at": "yesterday"}, "created_at"),
        ({"sig": 12}, "sig"),
    ],
)
def test_malformed_envelopes_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(BadSnapshot) as err:
        SessionSnapshot.from_wire(wire(**changes))
    assert err.value.details["field"] == field
    assert err.value.code == ErrorCode.BAD_SNAPSHOT


def test_a_restore_without_a_snapshot_is_a_bad_message_and_a_non_map_a_bad_snapshot() -> None:
    with pytest.raises(BadMessage):
        m.parse_request({"type": "restore", "id": 1})
    with pytest.raises(BadSnapshot, match="a snapshot is a map"):
        m.parse_request({"type": "restore", "id": 1, "snapshot": [1]})
    with pytest.raises(BadSnapshot, match="JSON cannot carry"):
        SessionSnapshot.from_wire(wire(snapshot={"count": b"raw"})).canonical()


def test_the_openenv_envelope_has_no_snapshots() -> None:
    for message in (m.TakeSnapshot(1, "s"), m.Restore(2, seal().seal(READY, VALUE, 1.0))):
        with pytest.raises(SnapshotUnsupported, match="not available over the OpenEnv envelope"):
            client_frame(message.to_wire())


# -- the server connection ----------------------------------------------------------------


GREETING = Greeting(
    server={"name": "corral", "instance": "i1"},
    env={"name": "tally"},
    limits={},
    contract_version="1.2.0",
    fingerprint="sha256:0000000000000001",
    schemas={"action": {}, "observation": {}, "state": {}},
)


class Peer:
    def __init__(self, snapshots: SnapshotSeal | None, codec: str = "msgpack") -> None:
        self.codec = get_codec(codec)
        self.registry: SessionRegistry[SessionState] = SessionRegistry(
            max_sessions=2, max_per_owner=2, resume_window_s=30, idle_timeout_s=None
        )
        self.frames: list[Any] = []
        self.conn = ServerConnection(
            self.codec,
            self.registry,
            GREETING,
            write=self.frames.append,
            max_frame_bytes=1 << 16,
            max_batch=4,
            snapshots=snapshots,
        )
        assert self.send(m.Hello(1)) is None
        self.frames.clear()

    def send(self, message: m.Request) -> Any:
        return self.conn.receive(self.codec.encode(message.to_wire()))

    def reply(self) -> m.Reply:
        (frame,) = self.frames
        self.frames.clear()
        return m.parse_reply(self.codec.decode(frame))

    def open(self, rid: int) -> SessionState:
        event = self.send(m.Open(rid))
        assert isinstance(event, OpenSession)
        session = SessionState(
            id=f"s{rid}", token="t", machine=SessionMachine(), cache=ReplyCache(), owner=self.conn
        )
        self.registry.add(session, self.conn)
        return session


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_snapshot_is_a_call_of_its_session_and_restore_reserves_a_slot(codec: str) -> None:
    peer = Peer(seal(), codec)
    session = peer.open(2)
    event = peer.send(m.TakeSnapshot(3, session.id))
    assert isinstance(event, RunCall) and event.op is Op.SNAPSHOT
    assert event.session is session and session.machine.running == 3
    busy = peer.send(m.TakeSnapshot(4, session.id))
    assert busy is None and peer.reply().code == ErrorCode.SESSION_BUSY  # type: ignore[union-attr]
    session.machine.finish(Op.SNAPSHOT)
    envelope = seal().seal(Position(Phase.ENDED, 1, 4, 4), VALUE, 1.0)
    restore = peer.send(m.Restore(5, envelope))
    assert isinstance(restore, RestoreSession)
    assert restore.position == Position(Phase.ENDED, 1, 4, 4) and restore.snapshot == VALUE
    assert peer.registry.active == 2  # the open session and the reserved restore
    full = peer.send(m.Restore(6, envelope))
    assert full is None and peer.reply().code == ErrorCode.TOO_MANY_SESSIONS  # type: ignore[union-attr]
    restored = SessionState(
        id="r", token="rt", machine=SessionMachine.restored(restore.position), cache=ReplyCache(),
        owner=peer.conn,
    )  # fmt: skip
    peer.registry.add(restored, peer.conn)
    assert peer.conn.restored(restore.request, restored, {"text": "hi"})
    assert peer.reply() == m.Restored(5, "r", "rt", {"text": "hi"})


def test_bad_restores_are_answered_with_their_code_and_nothing_reserved() -> None:
    peer = Peer(seal())
    envelope = seal().seal(READY, VALUE, 1.0)
    cases = [
        (m.Restore(2, dataclasses.replace(envelope, sig=None)), ErrorCode.BAD_SNAPSHOT),
        (m.Restore(3, dataclasses.replace(envelope, env="x")), ErrorCode.BAD_SNAPSHOT),
        (
            m.Restore(4, dataclasses.replace(envelope, contract_version="3.0.0")),
            ErrorCode.BAD_SNAPSHOT,  # signed over 1.2.0: the signature fails first
        ),
    ]
    for request, code in cases:
        assert peer.send(request) is None
        reply = peer.reply()
        assert isinstance(reply, m.ErrorReply) and reply.code == code and reply.id == request.id
    raw = {"type": "restore", "id": 9, "snapshot": {"format": "nope"}}
    assert peer.conn.receive(peer.codec.encode(raw)) is None
    reply = peer.reply()
    assert isinstance(reply, m.ErrorReply) and (reply.code, reply.id) == ("BAD_SNAPSHOT", 9)
    assert peer.registry.active == 0


@pytest.mark.parametrize("snapshots", [None, seal(model=None)])
def test_a_server_without_snapshots_refuses_both_without_touching_the_session(
    snapshots: SnapshotSeal | None,
) -> None:
    peer = Peer(snapshots)
    session = peer.open(2)
    assert peer.send(m.TakeSnapshot(3, session.id)) is None
    reply = peer.reply()
    assert isinstance(reply, m.ErrorReply) and reply.code == ErrorCode.SNAPSHOT_UNSUPPORTED
    assert "tally declares no snapshot" in reply.message and session.machine.running is None
    assert peer.send(m.Restore(4, seal().seal(READY, VALUE, 1.0))) is None
    assert peer.reply().code == ErrorCode.SNAPSHOT_UNSUPPORTED  # type: ignore[union-attr]
    assert peer.registry.active == 1


def test_a_snapshot_of_a_closed_or_unknown_session_is_refused() -> None:
    peer = Peer(seal())
    session = peer.open(2)
    peer.registry.remove(session, "closed by the client")
    assert peer.send(m.TakeSnapshot(3, session.id)) is None
    assert peer.reply().code == ErrorCode.SESSION_LOST  # type: ignore[union-attr]
    assert peer.send(m.TakeSnapshot(4, "nope")) is None
    assert peer.reply().code == ErrorCode.UNKNOWN_SESSION  # type: ignore[union-attr]

"""Typed snapshots in the contract: declaring one, the checks at class definition, and
the snapshot model in the schemas, the fingerprint, the lock and its diff."""

from __future__ import annotations

import hashlib
import io
import json
import types
from typing import Any, Literal

import pytest
from pydantic import Field

from corral.contract import Action, Environment, Observation, Snapshot, State, WireModel
from corral.contract.diff import ChangeKind, Direction, diff_schemas
from corral.contract.lock import check_lock, lock_of, read_lock, write_lock
from corral.contract.schema import fingerprint
from corral.contract.wiresafe import WireSafetyError


class Count(Action):
    by: int = 1


class Counted(Observation):
    total: int = 0


class CounterSnapshot(Snapshot):
    total: int
    last: Counted | None = None


class Counter(Environment[Count, Counted, State]):
    """Declares its snapshot through snapshot()'s return annotation."""

    def __init__(self) -> None:
        self.total = 0
        self.last: Counted | None = None

    def reset(self, seed: int | None = None, **options: Any) -> Counted:
        self.total = 0
        self.last = Counted()
        return self.last

    def step(self, action: Count) -> Counted:
        self.total += action.by
        self.last = Counted(total=self.total, reward=float(action.by))
        return self.last

    def state(self) -> State:
        return State()

    def snapshot(self) -> CounterSnapshot:
        return CounterSnapshot(total=self.total, last=self.last)

    def restore(self, snapshot: CounterSnapshot) -> Counted:
        self.total, self.last = snapshot.total, snapshot.last
        return self.last or Counted()


class AsyncCounter(Counter):
    """Async snapshot methods, the model named by snapshot_type."""

    snapshot_type = CounterSnapshot

    async def snapshot(self):  # type: ignore[no-untyped-def,override]
        return CounterSnapshot(total=self.total, last=self.last)

    async def restore(self, snapshot):  # type: ignore[no-untyped-def,override]
        self.total, self.last = snapshot.total, snapshot.last
        return self.last or Counted()


class Plain(Environment[Count, Counted, State]):
    def reset(self, seed: int | None = None, **options: Any) -> Counted:
        return Counted()

    def step(self, action: Count) -> Counted:
        return Counted()

    def state(self) -> State:
        return State()


def test_a_declared_snapshot_is_found_from_the_annotation_or_the_attribute() -> None:
    assert Counter.snapshot_type is CounterSnapshot and Counter.has_snapshots()
    assert AsyncCounter.snapshot_type is CounterSnapshot
    assert Plain.snapshot_type is None and not Plain.has_snapshots()


def test_a_subclass_inherits_the_snapshot_or_names_its_own() -> None:
    class Child(Counter):
        def step(self, action: Count) -> Counted:
            return super().step(action)

    class WiderSnapshot(CounterSnapshot):
        note: str = ""

    class Wider(Counter):
        snapshot_type = WiderSnapshot

    assert Child.snapshot_type is CounterSnapshot
    assert Wider.snapshot_type is WiderSnapshot


def test_snapshot_and_restore_round_trip_in_process() -> None:
    env = Counter()
    env.reset()
    env.step(Count(by=3))
    snap = env.snapshot()
    fresh = Counter()
    observation = fresh.restore(CounterSnapshot.model_validate_json(snap.model_dump_json()))
    assert observation == Counted(total=3, reward=3.0)
    assert fresh.step(Count(by=2)) == env.step(Count(by=2))


def test_the_snapshot_model_refuses_unknown_fields_and_keeps_non_finite_floats() -> None:
    class Floats(Snapshot):
        x: float

    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        CounterSnapshot.model_validate({"total": 1, "secret": 2})
    for value in (float("nan"), float("inf"), -float("inf")):
        back = Floats.model_validate_json(Floats(x=value).model_dump_json())
        assert repr(back.x) == repr(value)


def _env(namespace: dict[str, Any]) -> type[Environment[Any, Any, Any]]:
    methods = {
        "reset": lambda self, seed=None, **options: Counted(),
        "step": lambda self, action: Counted(),
        "state": lambda self: State(),
    }
    body = {**methods, **namespace}
    return types.new_class(
        "Broken", (Environment[Count, Counted, State],), exec_body=lambda ns: ns.update(body)
    )


@pytest.mark.parametrize(
    ("namespace", "message"),
    [
        (
            {"snapshot": lambda self: CounterSnapshot(total=0)},
            r"Broken defines snapshot\(\) but not restore\(\): define both",
        ),
        (
            {"restore": lambda self, snapshot: Counted()},
            r"Broken defines restore\(\) but not snapshot\(\)",
        ),
        (
            {"snapshot_type": CounterSnapshot},
            r"Broken.snapshot_type is .* but Broken defines no snapshot\(\) and restore\(\)",
        ),
        (
            {
                "snapshot": lambda self: CounterSnapshot(total=0),
                "restore": lambda self, snapshot: Counted(),
            },
            r"cannot tell the snapshot model: annotate snapshot\(self\) -> MySnapshot, or set "
            r"snapshot_type = MySnapshot",
        ),
        (
            {
                "snapshot_type": Counted,
                "snapshot": lambda self: Counted(),
                "restore": lambda self, snapshot: Counted(),
            },
            r"snapshot model .*Counted.* is not a subclass of corral.contract.Snapshot",
        ),
        (
            {
                "snapshot_type": CounterSnapshot,
                "snapshot": lambda self: CounterSnapshot(total=0),
                "restore": lambda self: Counted(),
            },
            r"Broken.restore must take exactly one argument besides self",
        ),
    ],
)
def test_a_half_or_unresolvable_declaration_fails_at_class_definition(
    namespace: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        _env(namespace)


class OtherSnapshot(Snapshot):
    other: int = 0


def test_restore_annotated_with_another_model_fails() -> None:
    with pytest.raises(TypeError, match=r"restore takes a OtherSnapshot but the snapshot model"):

        class Mismatched(Counter):
            def restore(self, snapshot: OtherSnapshot) -> Counted:
                return Counted()


def test_a_snapshot_model_that_cannot_cross_the_wire_fails_when_defined() -> None:
    with pytest.raises(WireSafetyError, match=r"Unsafe.handle: .* is a file handle"):

        class Unsafe(Snapshot):
            handle: io.StringIO


def test_the_snapshot_schema_joins_the_contract_only_when_declared() -> None:
    with_snap = Counter.contract()
    without = Plain.contract()
    assert "snapshot" in with_snap.schemas and "snapshot" not in without.schemas
    assert with_snap.schemas["snapshot"] == CounterSnapshot.model_json_schema()
    rest = {k: v for k, v in with_snap.schemas.items() if k != "snapshot"}
    assert with_snap.fingerprint == fingerprint(with_snap.schemas) != fingerprint(rest)
    assert without.fingerprint == fingerprint(without.schemas)


# -- an environment without a snapshot keeps its fingerprint and lock, byte for byte ----------


class Cell(WireModel):
    row: int = Field(ge=0, le=2)
    col: int = Field(ge=0, le=2)


class PinAction(Action):
    cell: Cell
    note: str = ""


class PinObservation(Observation):
    board: list[list[Literal["x", "o", ""]]] = Field(default_factory=list)
    message: str = ""


class PinState(State):
    moves: list[Cell] = Field(default_factory=list)


class PinEnv(Environment[PinAction, PinObservation, PinState]):
    name = "pin"

    def reset(self, seed: int | None = None, *, first: Literal["x", "o"] = "x") -> PinObservation:
        return PinObservation()

    def step(self, action: PinAction) -> PinObservation:
        return PinObservation()

    def state(self) -> PinState:
        return PinState()


def test_a_contract_without_a_snapshot_is_byte_identical_to_before_snapshots() -> None:
    # Computed with the code before snapshots existed (main at 6ef6a18).
    contract = PinEnv.contract()
    assert sorted(contract.schemas) == ["action", "observation", "reset_options", "state"]
    assert contract.fingerprint == "sha256:40c4bf8a616c79fc"
    text = lock_of(contract).to_json()
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "0086dce811697ad4693db9eba8e20a41bae4414439893f5d597e0294178ff2ca"
    )


def test_the_lock_keeps_the_snapshot_schema(tmp_path: Any) -> None:
    path = tmp_path / "corral.lock.json"
    written = write_lock(Counter.contract(), path)
    assert json.loads(path.read_text())["schemas"]["snapshot"]["title"] == "CounterSnapshot"
    back = read_lock(path)
    assert back == written and back.fingerprint == Counter.contract().fingerprint
    assert check_lock(back, Counter.contract()).changes == []


class CounterSnapshotV2(Snapshot):
    total: int
    last: Counted | None = None
    note: str = ""


class CounterSnapshotV3(Snapshot):
    total: int


def test_the_lock_diff_classifies_snapshot_changes_as_restores_of_old_snapshots() -> None:
    old = {"snapshot": CounterSnapshot.model_json_schema()}
    added = diff_schemas(old, {"snapshot": CounterSnapshotV2.model_json_schema()})
    assert [(c.kind, c.breaking) for c in added] == [(ChangeKind.FIELD_ADDED, False)]
    assert added[0].direction is Direction.CLIENT_TO_SERVER
    removed = diff_schemas(old, {"snapshot": CounterSnapshotV3.model_json_schema()})
    assert [(c.kind, c.breaking) for c in removed] == [(ChangeKind.FIELD_REMOVED, True)]
    assert "old clients still send it and the server rejects it" in removed[0].message
    narrowed = diff_schemas(
        {"snapshot": CounterSnapshotV2.model_json_schema()},
        {"snapshot": _with_bound(CounterSnapshotV2.model_json_schema())},
    )
    assert narrowed[0].kind is ChangeKind.CONSTRAINT_TIGHTENED and narrowed[0].breaking
    assert "snapshots taken under the locked contract" in narrowed[0].message
    gained = diff_schemas({}, {"snapshot": CounterSnapshot.model_json_schema()})
    assert [(c.kind, c.breaking) for c in gained] == [(ChangeKind.MODEL_ADDED, False)]
    lost = diff_schemas({"snapshot": CounterSnapshot.model_json_schema()}, {})
    assert [(c.kind, c.breaking) for c in lost] == [(ChangeKind.MODEL_REMOVED, True)]


def _with_bound(schema: dict[str, Any]) -> dict[str, Any]:
    bounded = json.loads(json.dumps(schema))
    bounded["properties"]["total"]["maximum"] = 10
    return bounded

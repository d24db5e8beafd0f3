"""Schema lock files: writing, reading, refusing bad ones, and checking a contract against one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from corral.contract import Action, Observation, State
from corral.contract.diff import ChangeKind
from corral.contract.lock import LockError, check_lock, lock_of, read_lock, write_lock
from corral.contract.schema import Contract, fingerprint
from corral.envs.echo import EchoEnv


class GuessAction(Action):
    guess: int = Field(ge=0, le=100)


class GuessObservation(Observation):
    hint: Literal["higher", "lower", "correct"] | None = None


class GuessState(State):
    target: int = 0


def contract(version: str = "1.0.0", **overrides: type[BaseModel]) -> Contract:
    return Contract(
        name="guess",
        version=version,
        action=overrides.get("action", GuessAction),
        observation=overrides.get("observation", GuessObservation),
        state=overrides.get("state", GuessState),
    )


def test_lock_round_trip_and_format(tmp_path: Path) -> None:
    path = tmp_path / "corral.lock.json"
    written = write_lock(contract(), path)
    text = path.read_text()
    assert text.endswith("}\n") and text.startswith('{\n  "contract_version": "1.0.0",')
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert data["corral_lock"] == 1 and data["name"] == "guess"
    assert data["fingerprint"] == contract().fingerprint == written.fingerprint
    assert read_lock(path) == written
    # Writing the same contract again is byte-identical (diff-friendly, deterministic).
    write_lock(contract(), path)
    assert path.read_text() == text


def test_lock_of_a_mapping_and_of_an_environment(tmp_path: Path) -> None:
    schemas = EchoEnv.contract().schemas
    lock = lock_of(schemas, name="echo", contract_version="2.1.0")
    assert lock.fingerprint == fingerprint(schemas) == EchoEnv.contract().fingerprint
    assert lock.contract_version == "2.1.0"
    with pytest.raises(LockError, match="lack state"):
        lock_of({"action": {}, "observation": {}})
    with pytest.raises(LockError, match="not semantic"):
        lock_of(schemas, contract_version="1")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "create it with 'corral schema lock'"),
        ("{not json", "cannot read the lock file"),
        ("[]", "top level is not an object"),
        ('{"corral_lock": 99}', "unknown lock format 99"),
        ('{"corral_lock": 1, "contract_version": "1.0.0"}', "'fingerprint' is missing"),
    ],
)
def test_bad_lock_files(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "corral.lock.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(LockError, match=match):
        read_lock(path)


def test_hand_edited_lock_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "corral.lock.json"
    write_lock(contract(), path)
    data = json.loads(path.read_text())
    data["schemas"]["action"]["properties"]["guess"]["maximum"] = 5
    path.write_text(json.dumps(data))
    with pytest.raises(LockError, match="edited by hand"):
        read_lock(path)


def test_check_lock() -> None:
    lock = lock_of(contract())
    same = check_lock(lock, contract())
    assert same.ok and not same.changes and not same.stale

    class Narrower(Action):
        guess: int = Field(ge=0, le=50)

    broken = check_lock(lock, contract(action=Narrower))
    assert not broken.ok and broken.stale
    assert [(c.path, c.kind) for c in broken.breaking] == [
        ("action.guess", ChangeKind.CONSTRAINT_TIGHTENED)
    ]
    acknowledged = check_lock(lock, contract("2.0.0", action=Narrower))
    assert acknowledged.ok and acknowledged.major_bumped and acknowledged.breaking

"""``corral schema lock | check | diff`` through typer's CliRunner."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.contract.lock import read_lock

runner = CliRunner(env={"COLUMNS": "200"})

MODULE = """
from typing import Literal
from pydantic import Field
from corral.contract import Action, Environment, Observation, State


class GuessAction(Action):
    guess: int = Field(ge=0, le={maximum})
{extra_action}

class GuessObservation(Observation):
    hint: Literal[{hints}] | None = None
{extra_observation}


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    name = "guess"
    contract_version = "{version}"

    def reset(self, seed=None, **options):
        return GuessObservation()

    def step(self, action):
        return GuessObservation(hint="higher")

    def state(self):
        return State()
"""


class GuessProject:
    """An environment directory whose module can be rewritten between commands."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.package = f"guess_{uuid.uuid4().hex[:8]}"
        (root / self.package).mkdir()
        (root / "corral.yaml").write_text(f"name: guess\nentry_point: {self.package}:GuessEnv\n")
        self.write()

    def write(
        self,
        maximum: int = 100,
        hints: str = '"higher", "lower", "correct"',
        version: str = "1.0.0",
        extra_action: str = "",
        extra_observation: str = "",
    ) -> None:
        source = MODULE.format(
            maximum=maximum,
            hints=hints,
            version=version,
            extra_action=extra_action,
            extra_observation=extra_observation,
        )
        (self.root / self.package / "__init__.py").write_text(textwrap.dedent(source))
        # Each command imports the module afresh, as a new process would.
        shutil.rmtree(self.root / self.package / "__pycache__", ignore_errors=True)
        sys.modules.pop(self.package, None)
        importlib.invalidate_caches()

    def run(self, *args: str) -> tuple[int, str]:
        result = runner.invoke(app, [*args, str(self.root)])
        return result.exit_code, result.output


@pytest.fixture
def project(tmp_path: Path) -> GuessProject:
    return GuessProject(tmp_path)


def test_lock_then_check_unchanged(project: GuessProject) -> None:
    code, out = project.run("schema", "lock")
    assert code == 0, out
    lock = read_lock(project.root / "corral.lock.json")
    assert f"wrote {project.root / 'corral.lock.json'} (contract 1.0.0, fingerprint " in out
    assert lock.fingerprint in out and lock.name == "guess"
    code, out = project.run("schema", "check")
    assert code == 0, out
    assert "no schema changes" in out and "ok: the models match the lock." in out


def test_check_without_lock(project: GuessProject) -> None:
    code, out = project.run("schema", "check")
    assert code == 2
    assert "no schema lock file; create it with 'corral schema lock'" in out


def test_breaking_changes_fail_the_check(project: GuessProject) -> None:
    project.run("schema", "lock")
    project.write(
        maximum=50, hints='"higher", "lower", "correct", "close"', extra_action='    note: str = ""'
    )
    code, out = project.run("schema", "check")
    assert code == 1, out
    lines = [line for line in out.splitlines() if "│" in line]
    assert any(
        "BREAKING" in line and "action.guess" in line and "server rejects" in line for line in lines
    ), out
    assert any(
        "BREAKING" in line and "observation.hint" in line and "client decode" in line
        for line in lines
    ), out
    assert any("compatible" in line and "action.note" in line for line in lines), out
    assert "2 breaking change(s)." in out
    assert "bump the contract's major version (now 1.0.0)" in out


def test_compatible_changes_pass_and_suggest_relocking(project: GuessProject) -> None:
    project.run("schema", "lock")
    project.write(maximum=200)
    code, out = project.run("schema", "check")
    assert code == 0, out
    assert "constraint_loosened" in out
    assert "ok (compatible changes); run 'corral schema lock' to update the lock file." in out


def test_an_added_observation_field_and_tolerant_readers(project: GuessProject) -> None:
    project.run("schema", "lock")
    project.write(extra_observation="    distance: int = 0")
    code, out = project.run("schema", "check")
    assert code == 1, out
    assert "observation.distance" in out and "forbid unknown keys" in out
    code, out = project.run("schema", "check", "--tolerant-readers")
    assert code == 0, out
    assert "readers ignore keys they do not know" in out


def test_a_major_bump_acknowledges_breaking_changes(project: GuessProject) -> None:
    project.run("schema", "lock")
    project.write(maximum=10, version="2.0.0")
    code, out = project.run("schema", "check")
    assert code == 0, out
    assert "BREAKING" in out and "1.0.0 (locked) -> 2.0.0 (current)" in out
    assert "ok (the major version was bumped)" in out
    code, out = project.run("schema", "lock")
    assert code == 0 and "warning" not in out
    assert read_lock(project.root / "corral.lock.json").contract_version == "2.0.0"


def test_locking_a_breaking_change_warns(project: GuessProject) -> None:
    project.run("schema", "lock")
    project.write(maximum=10)
    code, out = project.run("schema", "lock")
    assert code == 0
    assert "warning: 1 breaking change(s) locked without a major version bump" in out


def test_diff_json(project: GuessProject) -> None:
    project.run("schema", "lock")
    project.write(maximum=10)
    code, out = project.run("schema", "diff", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["ok"] is False and data["major_bumped"] is False
    assert data["changes"] == [
        {
            "path": "action.guess",
            "kind": "constraint_tightened",
            "severity": "breaking",
            "direction": "client->server",
            "fails_at": "server",
            "message": "maximum changed from 100 to 10: the server rejects actions that old "
            "clients send",
        }
    ]
    code, out = project.run("schema", "check", "--json")
    assert code == 1 and json.loads(out)["ok"] is False


def test_diff_against_another_lock(
    project: GuessProject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project.run("schema", "lock")
    other = tmp_path_factory.mktemp("other") / "other.lock.json"
    project.write(hints='"higher", "lower"')
    project.run("schema", "lock", "--lock", str(other))
    code, out = project.run("schema", "diff", "--against", str(other))
    assert code == 0, out
    assert "observation.hint" in out and "enum_value_removed" in out and "compatible" in out


def test_bad_manifest_and_bad_entry_point(tmp_path: Path) -> None:
    (tmp_path / "corral.yaml").write_text("name: guess\nentry_point: nowhere_xyz:Env\n")
    result = runner.invoke(app, ["schema", "lock", str(tmp_path)])
    assert result.exit_code == 2
    assert "cannot load the environment" in result.output
    assert "cannot import module 'nowhere_xyz'" in result.output
    (tmp_path / "corral.yaml").write_text("name: Guess Env\n")
    result = runner.invoke(app, ["schema", "check", str(tmp_path)])
    assert result.exit_code == 2
    assert "name: 'Guess Env' is not a valid name" in result.output
    assert "entry_point: required key is missing" in result.output


def test_a_version_bumped_in_the_class_but_not_the_manifest_fails(
    project: GuessProject,
) -> None:
    manifest = project.root / "corral.yaml"
    manifest.write_text(manifest.read_text() + "contract_version: 1.0.0\n")
    project.run("schema", "lock")
    project.write(version="2.0.0")
    code, out = project.run("schema", "check")
    assert code == 1, out
    assert "contract_version is 2.0.0 but corral.yaml says 1.0.0" in out


def test_serve_warns_when_the_models_differ_from_the_lock(
    project: GuessProject, capsys: pytest.CaptureFixture[str]
) -> None:
    from corral.cli.serve import warn_if_unlocked
    from corral.providers.manifest import load_manifest

    project.run("schema", "lock")
    warn_if_unlocked(load_manifest(project.root))
    assert capsys.readouterr().err == ""
    project.write(extra_observation="    distance: int")
    warn_if_unlocked(load_manifest(project.root))
    err = capsys.readouterr().err
    assert "the models differ from corral.lock.json by 1 breaking change(s)" in err
    assert "observation.distance" in err
    project.write(maximum=200)
    warn_if_unlocked(load_manifest(project.root))
    assert "compatible changes only" in capsys.readouterr().err

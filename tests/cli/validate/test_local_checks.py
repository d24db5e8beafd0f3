"""``corral validate [PATH]``: static checks and the runtime smoke test, through CliRunner."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corral.cli.init import scaffold
from corral.cli.main import app

runner = CliRunner(env={"COLUMNS": "200"})


def make_env(tmp_path: Path) -> tuple[Path, str]:
    """A fresh scaffold with a package name no other test imported."""
    package = f"val_{uuid.uuid4().hex[:10]}"
    return scaffold(package, tmp_path), package


def validate(*args: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["validate", *args, "--json"])
    try:
        return result.exit_code, json.loads(result.output)
    except json.JSONDecodeError:
        raise AssertionError(result.output) from None


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"]}


def details(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["detail"] for c in report["checks"]}


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def test_a_scaffold_passes_everything(tmp_path: Path) -> None:
    root, _ = make_env(tmp_path)
    code, report = validate(str(root))
    assert code == 0, report
    got = statuses(report)
    for check in (
        "static.manifest",
        "static.pyproject",
        "static.entry_point",
        "static.wire_safe",
        "static.contract_version",
        "static.schema_lock",
        "local.start",
        "local.contract",
        "local.episode.msgpack",
        "local.episode.json",
        "local.roundtrip",
        "local.determinism",
        "local.reward",
        "local.stop",
    ):
        assert got[check] == "pass", (check, details(report)[check])
    # The game truncates after 10 guesses: the step after the end was refused.
    assert "ended, then refused a step" in details(report)["local.reward"]
    assert got["docker.start"] in ("skip", "pass")
    assert report["protocols"]["static"] and report["protocols"]["local"]


def test_the_current_directory_is_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = make_env(tmp_path)
    monkeypatch.chdir(root)
    result = runner.invoke(app, ["validate", "--static"])
    assert result.exit_code == 0, result.output
    assert "static.schema_lock" in result.output and "passed" in result.output
    assert "local.start" not in result.output


@pytest.mark.parametrize(
    ("breakage", "check", "message"),
    [
        (("corral.yaml", "memory: 512Mi", "memroy: 512Mi"), "static.manifest", "did you mean"),
        (("corral.yaml", ".env:", ".nowhere:"), "static.entry_point", "cannot import module"),
        (
            ("corral.yaml", "contract_version: 1.0.0", "contract_version: 1.1.0"),
            "static.contract_version",
            "says 1.1.0",
        ),
        (
            ("{package}/models.py", "    guess: int = Field(", "    choice: int = Field("),
            "static.schema_lock",
            "breaking change",
        ),
        (("corral.lock.json", None, None), "static.schema_lock", "corral schema lock"),
        (
            (
                "{package}/models.py",
                "    secret: int = Field(",
                "    conn: socket | None = None\n    secret: int = Field(",
            ),
            "static.entry_point",
            "socket.*cannot cross the wire",
        ),
    ],
)
def test_static_failures(
    tmp_path: Path, breakage: tuple[str, str | None, str | None], check: str, message: str
) -> None:
    root, package = make_env(tmp_path)
    cls = "".join(p.capitalize() for p in package.split("_"))
    name, old, new = breakage
    target = root / name.format(package=package)
    if old is None:
        target.unlink()
    else:
        assert new is not None
        edit(target, old.format(cls=cls), new.format(cls=cls))
        if "socket" in new:
            edit(
                target,
                "from typing import Literal",
                "from socket import socket\nfrom typing import Literal",
            )
    code, report = validate(str(root), "--static")
    assert code == 1
    assert statuses(report)[check] == "fail", report
    assert re.search(message, details(report)[check]), details(report)[check]


NONDETERMINISTIC = """
    def reset(self, seed: int | None = None, **options: Any) -> {cls}Observation:
        rng = random.Random()
"""


def test_runtime_failures_name_the_problem(tmp_path: Path) -> None:
    root, package = make_env(tmp_path)
    cls = "".join(p.capitalize() for p in package.split("_"))
    env_py = root / package / "env.py"
    edit(
        env_py,
        "    def reset(self, seed: int | None = None, **options: Any) -> "
        f"{cls}Observation:\n        rng = random.Random(seed)\n",
        NONDETERMINISTIC.format(cls=cls).lstrip("\n"),
    )
    edit(
        env_py,
        "return " + cls + 'Observation(hint="start", guesses_left=self.max_guesses)',
        "return " + cls + 'Observation(hint="start", guesses_left=self.max_guesses, '
        'metadata={"secret": self._state.secret})',
    )
    edit(env_py, "reward=0.0, done=out_of_guesses", 'reward=float("nan"), done=out_of_guesses')
    code, report = validate(str(root))
    assert code == 1
    got, why = statuses(report), details(report)
    assert (
        got["local.determinism"] == "fail" and "derive all randomness" in why["local.determinism"]
    )
    assert got["local.reward"] == "fail" and "must be finite" in why["local.reward"]
    assert got["local.episode.msgpack"] == "pass" and got["local.stop"] == "pass"


def test_an_uncounted_step_and_an_impossible_action(tmp_path: Path) -> None:
    root, package = make_env(tmp_path)
    edit(root / package / "env.py", "        state.step_count += 1\n", "")
    edit(
        root / package / "env.py",
        "left = self.max_guesses - state.step_count",
        "left = self.max_guesses - len(state.guesses)",
    )
    code, report = validate(str(root))
    assert code == 1
    assert "step_count is 0 after" in details(report)["local.reward"]
    code, report = validate(str(root), "--action", '{"guess": 1000}')
    assert code == 1
    assert statuses(report)["runtime.action"] == "fail"
    assert "fix --action" in details(report)["runtime.action"]


def test_argument_errors(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", "--url", "http://127.0.0.1:9", "--docker"])
    assert result.exit_code == 2 and "apply to PATH" in result.output
    result = runner.invoke(app, ["validate", str(tmp_path), "--sandbox", "jail"])
    assert result.exit_code == 2 and "not a sandbox" in result.output
    result = runner.invoke(app, ["validate", str(tmp_path), "--network", "overlay"])
    assert result.exit_code == 2 and "bridge or host" in result.output
    code, report = validate(str(tmp_path / "nowhere"))
    assert code == 1 and "no such file or directory" in details(report)["static.manifest"]

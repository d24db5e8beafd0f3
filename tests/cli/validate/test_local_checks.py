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
    assert got["runtime.snapshot"] == "skip"
    assert details(report)["runtime.snapshot"].startswith("not supported: ")
    assert got["docker.start"] in ("skip", "pass")
    assert report["protocols"]["static"] and report["protocols"]["local"]


def test_a_scaffold_with_an_array_field_and_a_snapshot_passes_everything(tmp_path: Path) -> None:
    """An int8 board with a list default (issue 31: equality and the JSON codec) and a
    snapshot: the round trip and the snapshot check pass like every other check."""
    root, package = make_env(tmp_path)
    cls = "".join(p.capitalize() for p in package.split("_"))
    models = root / package / "models.py"
    edit(
        models,
        "from corral.contract import Action, Observation, State",
        (
            "from corral.contract import Action, Observation, Snapshot, State\n"
            "from corral.contract.arrays import Array"
        ),
    )
    edit(
        models,
        "    guesses_left: int = Field(",
        (
            "    board: Array(dtype='int8', shape=(2, 2)) = Field(  # type: ignore[valid-type]\n"
            "        default_factory=lambda: [[0, 0], [0, 0]]\n"
            "    )\n"
            "    guesses_left: int = Field("
        ),
    )
    models.write_text(
        models.read_text()
        + (
            f"\n\nclass {cls}Snapshot(Snapshot):\n"
            f"    state: {cls}State\n"
            f"    last: {cls}Observation | None = None\n"
        )
    )
    env = root / package / "env.py"
    text = env.read_text()
    text = text.replace(  # the import line, not the class's generic parameters
        f"{cls}Observation, {cls}State\n",
        f"{cls}Observation, {cls}Snapshot, {cls}State\n",
        1,
    )
    text = text.replace("    def reset(self,", "    def _reset(self,")
    text = text.replace("    def step(self,", "    def _step(self,")
    text += (
        "\n    def reset(self, seed: int | None = None, **options: Any) -> "
        f"{cls}Observation:\n"
        "        self._last = self._reset(seed, **options)\n"
        "        return self._last\n"
        "\n"
        f"    def step(self, action: {cls}Action) -> {cls}Observation:\n"
        "        self._last = self._step(action)\n"
        "        return self._last\n"
        "\n"
        f"    def snapshot(self) -> {cls}Snapshot:\n"
        f"        last = getattr(self, '_last', None)\n"
        f"        return {cls}Snapshot(state=self._state.model_copy(deep=True), last=last)\n"
        "\n"
        f"    def restore(self, snapshot: {cls}Snapshot) -> {cls}Observation:\n"
        "        self._state = snapshot.state.model_copy(deep=True)\n"
        "        self._last = snapshot.last\n"
        f"        return self._last or {cls}Observation()\n"
    )
    env.write_text(text)
    locked = runner.invoke(app, ["schema", "lock", str(root)])
    assert locked.exit_code == 0, locked.output
    code, report = validate(str(root))
    got = statuses(report)
    failed = {k: details(report)[k] for k, v in got.items() if v == "fail"}
    assert code == 0 and not failed, failed
    assert got["local.roundtrip"] == "pass" and got["runtime.snapshot"] == "pass"


def test_the_snapshot_check_in_process() -> None:
    from tests.support.snapshot_envs import ForgetfulTallyEnv, NoSnapshotEnv, TallyEnv

    from corral.cli.validate.local import snapshot_check

    good = snapshot_check(TallyEnv, {"add": 2}, seed=3, steps=8)
    assert good.status == "pass", good.detail
    assert "TallySnapshot of" in good.detail and "4 more step(s) identical" in good.detail
    broken = snapshot_check(ForgetfulTallyEnv, {"add": 2}, seed=3, steps=8)
    assert broken.status == "fail" and "random generators included" in broken.detail
    unsupported = snapshot_check(NoSnapshotEnv, {"add": 2}, seed=3, steps=8)
    assert unsupported.status == "skip" and "declares no snapshot" in unsupported.detail


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
    code, report = validate(str(root))
    assert code == 1
    got, why = statuses(report), details(report)
    assert (
        got["local.determinism"] == "fail" and "derive all randomness" in why["local.determinism"]
    )
    assert got["local.episode.msgpack"] == "pass" and got["local.stop"] == "pass"


def test_a_non_finite_reward_fails_the_episode_on_every_codec(tmp_path: Path) -> None:
    # The server refuses a NaN reward as BAD_OBSERVATION (JSON cannot carry it), so the
    # validator sees it as the episode failing, named, on both codecs.
    root, package = make_env(tmp_path)
    env_py = root / package / "env.py"
    edit(env_py, "reward=0.0, done=out_of_guesses", 'reward=float("nan"), done=out_of_guesses')
    code, report = validate(str(root))
    assert code == 1
    got, why = statuses(report), details(report)
    for codec in ("msgpack", "json"):
        check = f"local.episode.{codec}"
        assert got[check] == "fail" and "non-finite reward" in why[check], why[check]
    assert got["local.stop"] == "pass"


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

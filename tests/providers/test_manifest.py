"""corral.yaml / openenv.yaml loading, validation messages, dependencies, entry points."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.envs.echo import EchoEnv
from corral.providers.manifest import (
    Manifest,
    ManifestError,
    format_memory,
    load_contract,
    load_manifest,
    parse_memory,
    project_dependencies,
)
from corral.server.target import TargetError, load_target


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


FULL = """
name: guess-the-number
version: 1.2.3
contract_version: 2.0.0
entry_point: guess.env:GuessEnv
description: Guess a number between 0 and 100.
port: 9000
resources:
  cpu: 0.5
  memory: 512Mi
  pids: 256
concurrency:
  max_sessions: 8
  idle_timeout_s: 30
schema_lock: locks/contract.json
base_image: corral-base:bookworm
"""


def test_full_manifest(tmp_path: Path) -> None:
    write(tmp_path, "corral.yaml", FULL)
    m = load_manifest(tmp_path)
    assert (m.name, m.version, m.contract_version) == ("guess-the-number", "1.2.3", "2.0.0")
    assert m.entry_point == "guess.env:GuessEnv" and m.port == 9000
    assert m.resources.cpu == 0.5 and m.resources.memory == 512 * 2**20
    assert m.resources.pids == 256
    assert m.concurrency.max_sessions == 8 and m.concurrency.idle_timeout_s == 30
    assert m.path == (tmp_path / "corral.yaml").resolve()
    assert m.root == tmp_path.resolve()
    assert m.lock_path == tmp_path.resolve() / "locks" / "contract.json"
    assert m.image_base == "corral-base:bookworm"


def test_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "corral.yaml", "name: echo\nentry_point: corral.envs.echo:EchoEnv\n")
    m = load_manifest(path)
    assert m.port == 8000 and m.version == "0.1.0" and m.contract_version == "1.0.0"
    assert m.schema_lock == "corral.lock.json" and m.base_image is None
    assert m.image_base == "python:3.11-slim"
    assert m.resources.memory == 2**30 and m.concurrency.max_sessions == 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: Echo Env\nentry_point: a:B\n",
            "name: 'Echo Env' is not a valid name: use lowercase letters, digits, '.', '_' "
            "and '-', starting and ending with a letter or digit (e.g. 'echo-env')",
        ),
        ("entry_point: a:B\n", "name: required key is missing; add it, e.g. 'name: ...'"),
        (
            "name: x\nentry_point: my_env.EchoEnv\n",
            "entry_point: 'my_env.EchoEnv' is not an entry point; write "
            "'package.module:ClassName' or 'package.module:factory'",
        ),
        (
            "name: x\nentry_point: a:B\ncontract_version: '1.0'\n",
            "contract_version: '1.0' is not a semantic version; write MAJOR.MINOR.PATCH, "
            "e.g. '1.0.0'",
        ),
        (
            "name: x\nentry_point: a:B\nport: 70000\n",
            "port: Input should be less than or equal to 65535 (got 70000); "
            "fix the value of 'port'",
        ),
        (
            "name: x\nentry_point: a:B\nresources:\n  memory: lots\n",
            "resources.memory: 'lots' is not a memory size; write bytes or a number with a "
            "unit: Ki Mi Gi Ti (powers of 1024) or k M G T (powers of 1000), e.g. 512Mi or 1Gi",
        ),
        (
            "name: x\nentry_point: a:B\nresources:\n  memroy: 1Gi\n",
            "resources.memroy: unknown key; did you mean 'memory'? "
            "known keys here: cpu, memory, pids",
        ),
        (
            "name: x\nentry_point: a:B\nconcurrency:\n  max_sessions: zero\n",
            "concurrency.max_sessions: Input should be a valid integer, unable to parse string "
            "as an integer (got 'zero'); fix the value of 'concurrency.max_sessions'",
        ),
        (
            "name: x\nentry_point: a:B\nschema_lock: /etc/lock.json\n",
            "schema_lock: '/etc/lock.json' must be a file path relative to the manifest's "
            "directory, e.g. 'corral.lock.json'",
        ),
        (
            "name: x\nentry_point: a:B\nresources:\n  cpu: 0\n",
            "resources.cpu: Input should be greater than 0 (got 0); "
            "fix the value of 'resources.cpu'",
        ),
    ],
)
def test_errors_name_the_key_the_value_and_the_fix(
    tmp_path: Path, text: str, expected: str
) -> None:
    write(tmp_path, "corral.yaml", text)
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    assert info.value.problems == [expected]
    assert str(info.value).startswith(f"{tmp_path / 'corral.yaml'}: invalid manifest\n  - ")


def test_every_problem_is_reported(tmp_path: Path) -> None:
    write(tmp_path, "corral.yaml", "name: X\nport: -1\nversion: one\nextra_key: 1\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    keys = [p.split(":", 1)[0] for p in info.value.problems]
    assert sorted(keys) == ["entry_point", "extra_key", "name", "port", "version"]


def test_yaml_syntax_errors_have_a_line_number(tmp_path: Path) -> None:
    write(tmp_path, "corral.yaml", "name: x\nentry_point: a:B\nresources:\n  cpu: [1\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    (problem,) = info.value.problems
    assert problem.startswith("YAML syntax error at line 5, column 1:"), problem


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    write(tmp_path, "corral.yaml", text)
    with pytest.raises(ManifestError, match="top level must be a mapping"):
        load_manifest(tmp_path)


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"no corral.yaml or openenv.yaml.*corral init"):
        load_manifest(tmp_path)
    with pytest.raises(ManifestError, match="no such file or directory"):
        load_manifest(tmp_path / "nope.yaml")


OPENENV = """
spec_version: 1
name: Echo_Env
version: 0.2.0
type: space
runtime: fastapi
app: server.app:app
port: 8001
validation:
  reward: {range: [0, 1]}
  resources: {cpu: 2, memory_mb: 2048}
"""


def test_openenv_yaml_is_mapped(tmp_path: Path) -> None:
    write(tmp_path, "openenv.yaml", OPENENV)
    m = load_manifest(tmp_path)
    assert m.name == "echo_env" and m.version == "0.2.0" and m.port == 8001
    assert m.entry_point == "server.app:app"
    assert m.resources.cpu == 2 and m.resources.memory == 2048 * 10**6
    assert m.openenv == {
        "spec_version": 1,
        "type": "space",
        "runtime": "fastapi",
        "validation": {"reward": {"range": [0, 1]}, "resources": {"cpu": 2, "memory_mb": 2048}},
    }


def test_corral_yaml_wins_over_openenv_yaml(tmp_path: Path) -> None:
    write(tmp_path, "openenv.yaml", OPENENV)
    write(tmp_path, "corral.yaml", "name: mine\nentry_point: a:B\n")
    assert load_manifest(tmp_path).name == "mine"


def test_openenv_errors_name_the_corral_key(tmp_path: Path) -> None:
    write(tmp_path, "openenv.yaml", "spec_version: 1\nname: x\nport: 8000\napp: nonsense\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("entry_point: 'nonsense' is not an entry point")


def test_an_openenv_yaml_without_app_is_openenvs_default(tmp_path: Path) -> None:
    """The older format names no app: OpenEnv serves server/app.py's ``app``."""
    write(tmp_path, "openenv.yaml", "name: x\nversion: 0.1.0\naction: A\nobservation: O\n")
    assert load_manifest(tmp_path).entry_point == "server.app:app"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512Mi", 512 * 2**20),
        ("1Gi", 2**30),
        ("1.5Gi", int(1.5 * 2**30)),
        ("2G", 2 * 10**9),
        ("100M", 10**8),
        ("64MB", 64 * 10**6),
        ("40000000", 40_000_000),
        (" 1 Gi ", 2**30),
    ],
)
def test_parse_memory(text: str, size: int) -> None:
    assert parse_memory(text) == size


@pytest.mark.parametrize("text", ["", "lots", "1Gb", "-1Gi", "1 G i", "1e9"])
def test_parse_memory_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="is not a memory size"):
        parse_memory(text)


def test_parse_memory_minimum() -> None:
    with pytest.raises(ValueError, match="below the minimum of 32Mi"):
        parse_memory("1Mi")
    with pytest.raises(ValueError, match="not a memory size"):
        parse_memory(True)


@given(st.integers(32, 2**20).map(lambda n: n * 2**20))
def test_format_memory_round_trips(size: int) -> None:
    assert parse_memory(format_memory(size)) == size


def test_project_dependencies(tmp_path: Path) -> None:
    assert project_dependencies(tmp_path) == []
    write(
        tmp_path,
        "pyproject.toml",
        '[project]\nname = "g"\ndependencies = ["numpy>=1.24", "rich"]\n',
    )
    assert project_dependencies(tmp_path) == ["numpy>=1.24", "rich"]
    write(tmp_path, "pyproject.toml", "[project\n")
    with pytest.raises(ManifestError, match="invalid TOML"):
        project_dependencies(tmp_path)
    write(tmp_path, "pyproject.toml", '[project]\ndependencies = "numpy"\n')
    with pytest.raises(ManifestError, match="must be a list of requirement strings"):
        project_dependencies(tmp_path)


GUESS_MODULE = """
from corral.contract import Action, Environment, Observation, State


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    hint: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    name = "guess"
    contract_version = "3.1.0"

    def reset(self, seed=None, **options):
        return GuessObservation()

    def step(self, action):
        return GuessObservation(hint="higher")

    def state(self):
        return State()


def make_env():
    return GuessEnv()


def make_nothing():
    return 42


VALUE = 7
"""


@pytest.fixture
def guess_dir(tmp_path: Path) -> Path:
    package = tmp_path / "guess_pkg_for_tests"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "env.py").write_text(GUESS_MODULE)
    return tmp_path


@pytest.mark.parametrize("attr", ["GuessEnv", "make_env"])
def test_load_contract_from_class_or_factory(guess_dir: Path, attr: str) -> None:
    write(guess_dir, "corral.yaml", f"name: guess\nentry_point: guess_pkg_for_tests.env:{attr}\n")
    contract = load_contract(load_manifest(guess_dir))
    assert contract.name == "guess" and contract.version == "3.1.0"
    assert set(contract.schemas["action"]["properties"]) == {"guess"}


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ("guess_pkg_for_tests.env:make_nothing", "factory that returned int, not an Environment"),
        ("guess_pkg_for_tests.env:VALUE", "is int, not an Environment subclass or a factory"),
        ("guess_pkg_for_tests.env:Missing", "has no attribute 'Missing'"),
        ("guess_pkg_for_tests.nope:GuessEnv", "cannot import module 'guess_pkg_for_tests.nope'"),
    ],
)
def test_load_contract_errors(guess_dir: Path, entry: str, match: str) -> None:
    write(guess_dir, "corral.yaml", f"name: guess\nentry_point: {entry}\n")
    with pytest.raises((ImportError, TypeError), match=match):
        load_contract(load_manifest(guess_dir))


def test_resolve_dotted_attribute() -> None:
    assert load_target("corral.envs.echo:EchoEnv.contract")().name == "echo"
    assert load_target("corral.envs.echo:EchoEnv") is EchoEnv
    with pytest.raises(TargetError, match=r"must look like 'package\.module:Name'") as info:
        load_target("corral.envs.echo")
    # Callers catching an import problem or a bad argument both see it.
    assert isinstance(info.value, ImportError) and isinstance(info.value, ValueError)


def test_a_missing_dependency_is_named(tmp_path: Path) -> None:
    (tmp_path / "needs_dep_for_tests.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(TargetError, match="module 'no_such_dependency_xyz' is not found"):
        load_target("needs_dep_for_tests:Env", search_path=tmp_path)


def test_manifest_model_is_constructible_in_code() -> None:
    m = Manifest(name="echo", entry_point="corral.envs.echo:EchoEnv")
    assert m.path is None and m.root == Path.cwd()

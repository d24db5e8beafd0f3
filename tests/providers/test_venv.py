"""Virtualenvs from pyproject.toml: built once, cached by dependency hash, used by servers.

The first run on a machine builds one virtualenv (corral and its dependencies plus
``toolz``, a dependency the test environment has and corral's own does not); later runs
reuse it from the cache. Tests that build in a cache of their own start its wheelhouse
with the shared one's wheels (``own_cache``), and the one that must fetch fetches from an
index on disk, so only that first build uses the package index.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest

from corral.client import AsyncEnvClient
from corral.errors import ServerStartError
from corral.providers.local import LocalProcessProvider
from corral.providers.venv import MARKER, VenvError, ensure_venv, venv_cache_dir, venv_key
from corral.sandbox import SandboxMode, available_modes

pytestmark = [pytest.mark.network]

ENV = """
import sys
import toolz
from corral.contract import Action, Environment, Observation, State


class Numbers(Action):
    values: list[int]


class Sums(Observation):
    total: int = 0
    interpreter: str = ""


class SumEnv(Environment[Numbers, Sums, State]):
    def reset(self, seed=None, **options):
        return Sums(interpreter=sys.prefix)

    def step(self, action):
        total = toolz.reduce(lambda a, b: a + b, action.values, 0)
        return Sums(total=total, interpreter=sys.prefix)

    def state(self):
        return State()
"""


def write_env(directory: Path, dependencies: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "corral.yaml").write_text(
        "name: sums\nentry_point: sum_env_for_tests:SumEnv\nresources:\n  memory: 512Mi\n"
    )
    deps = ", ".join(f'"{d}"' for d in dependencies)
    (directory / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [project]
            name = "sums"
            version = "0.1.0"
            dependencies = [{deps}]
            """
        )
    )
    (directory / "sum_env_for_tests.py").write_text(ENV)
    return directory


@pytest.fixture(scope="module")
def sums_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_env(tmp_path_factory.mktemp("sums"), ["toolz"])


@pytest.fixture
def own_cache(sums_dir: Path, tmp_path: Path) -> Path:
    """A virtualenv cache of this test's own whose wheelhouse holds the shared one's wheels.

    The shared cache's virtualenv of ``sums_dir`` is built first (once per machine and
    corral source; later a reuse), so the shared wheelhouse has what corral needs (or
    pip's configured find-links have it): a build here then needs no package index, and a
    test about something else than fetching does not wait on the network.
    """
    ensure_venv(sums_dir)
    wheelhouse = tmp_path / "cache" / "wheelhouse"
    wheelhouse.mkdir(parents=True)
    # corral's own wheel is never kept there; a build in progress elsewhere may have one.
    for wheel in (venv_cache_dir() / "wheelhouse").glob("*.whl"):
        if not wheel.name.startswith("corral-"):
            try:
                os.link(wheel, wheelhouse / wheel.name)
            except OSError:
                shutil.copyfile(wheel, wheelhouse / wheel.name)
    return wheelhouse.parent


def local_index(root: Path, name: str) -> Path:
    """A package index in ``root`` (PEP 503, ``file://``) with one made-up pure-Python
    distribution, ``name`` 1.0, that no wheelhouse has: installing it from there makes a
    build fetch without the network."""
    module = name.replace("-", "_")
    wheel = root / f"{module}-1.0-py3-none-any.whl"
    info = f"{module}-1.0.dist-info"
    files = {
        f"{module}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    root.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    project = root / "simple" / name
    project.mkdir(parents=True)
    (project / "index.html").write_text(f'<a href="../../{wheel.name}">{wheel.name}</a>\n')
    return root / "simple"


def test_the_venv_is_built_once_and_reused(sums_dir: Path) -> None:
    lines: list[str] = []
    first = ensure_venv(sums_dir, progress=lines.append)
    assert (first.path / MARKER).is_file() and first.python.exists()
    assert first.requirements[1:] == ("toolz",)
    again = ensure_venv(sums_dir, progress=lines.append)
    assert again.reused and again.path == first.path and again.key == first.key
    assert lines[-1] == f"reusing the virtualenv {first.path}"
    # The same dependencies spelled differently share the virtualenv.
    other = write_env(sums_dir.parent / "sums-again", [" TOOLZ "])
    assert ensure_venv(other).path == first.path
    assert venv_key("python3", [first.requirements[0], "b", "a"]) == venv_key(
        "python3", [first.requirements[0], "a", "b"]
    )


def test_a_build_shows_progress_and_a_summary_a_reuse_is_silent(
    sums_dir: Path, own_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()  # from here on, this build's lines alone
    first = ensure_venv(sums_dir, cache_dir=own_cache)
    shown = capsys.readouterr().err.splitlines()
    # Off a terminal: the title when the build starts and the summary when it ends.
    assert shown[0] == f"building the virtualenv of {sums_dir.name} …", shown
    assert shown[-1].startswith(f"building the virtualenv of {sums_dir.name}: done in ")
    assert shown[-1].endswith(" s (cached for later starts)") and len(shown) == 2
    again = ensure_venv(sums_dir, cache_dir=own_cache)
    assert again.reused and again.path == first.path
    assert capsys.readouterr().err == ""


async def test_a_server_runs_in_its_venv(sums_dir: Path) -> None:
    assert importlib.util.find_spec("toolz") is None, "the test venv must not have toolz"
    built = ensure_venv(sums_dir)
    async with LocalProcessProvider(venv=True) as provider:
        endpoint = await provider.start(sums_dir)
        assert endpoint.python == str(built.path.resolve() / "bin" / "python")
        async with AsyncEnvClient(endpoint.url) as env:
            first = await env.reset()
            assert Path(first.observation.interpreter).resolve() == built.path.resolve()
            result = await env.step({"values": [1, 2, 3, 4]})
            assert result.observation.total == 10


async def test_a_venv_server_in_a_sandbox(sums_dir: Path) -> None:
    if available_modes()[SandboxMode.BWRAP] is not None:
        pytest.skip("bwrap does not work here")
    async with LocalProcessProvider(venv=True, sandbox="bwrap") as provider:
        endpoint = await provider.start(sums_dir)
        async with AsyncEnvClient(endpoint.url) as env:
            await env.reset()
            assert (await env.step({"values": [5, 6]})).observation.total == 11


def test_without_the_venv_the_dependency_is_missing(sums_dir: Path) -> None:
    # What --venv catches: the same server on corral's own interpreter cannot import toolz.
    with LocalProcessProvider().sync() as provider, pytest.raises(ServerStartError, match="toolz"):
        provider.start(sums_dir)


def test_offline_builds_name_what_is_missing(tmp_path: Path) -> None:
    env = write_env(tmp_path / "missing", ["corral-no-such-distribution-xyz"])
    with pytest.raises(VenvError, match="offline: the wheelhouse") as info:
        ensure_venv(env, offline=True)
    assert "corral-no-such-distribution-xyz" in str(info.value)
    assert "pip download" in str(info.value)


def test_a_stale_corral_wheel_in_the_wheelhouse_is_not_taken(
    own_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # corral's own wheel keeps its file name across source changes; pip takes a same-named
    # file from the wheel dir over the one asked for, so a stale copy there would bring the
    # old dependencies (seen when picows became a dependency). Here the stale copy is not
    # even a wheel: the build only succeeds if it is never used.
    built = ensure_venv(write_env(tmp_path / "plain", []), cache_dir=own_cache)
    wheel = Path(built.requirements[0])
    assert wheel.suffix == ".whl", "corral is installed from its source tree's wheel here"
    wheelhouse = own_cache / "wheelhouse"
    (wheelhouse / wheel.name).write_bytes(b"not a wheel")
    # A dependency no wheelhouse has makes the build fetch (where pip would take the stale
    # file), from an index on disk instead of the network.
    index = local_index(tmp_path / "index", "corral-test-fetched")
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    again = ensure_venv(write_env(tmp_path / "other", ["corral-test-fetched"]), cache_dir=own_cache)
    assert not again.reused
    assert not (wheelhouse / wheel.name).exists(), "local wheels stay out of the wheelhouse"
    assert (wheelhouse / "corral_test_fetched-1.0-py3-none-any.whl").is_file()
    # The venv has what the current corral needs (the stale file would have failed or
    # brought an older set).
    check = subprocess.run(
        [str(again.python), "-c", "import corral.server.native, corral_test_fetched"],
        capture_output=True,
    )
    assert check.returncode == 0, check.stderr.decode()

"""``corral init``: the scaffold works as generated (its tests, ``serve``, a client episode)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.init import InitError, corral_source, install_command, names_for, scaffold
from corral.cli.main import app
from corral.client import AsyncEnvClient
from corral.contract.lock import read_lock
from corral.providers.dockerfile import image_labels, render_dockerfile
from corral.providers.manifest import load_manifest

runner = CliRunner(env={"COLUMNS": "200"})
BIN = Path(sys.executable).parent


def corral_env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


async def test_init_then_its_own_tests_then_serve_and_play(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", "guess_env_for_init", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    root = tmp_path / "guess_env_for_init"
    assert "corral validate" in result.output and "tests/test_serialization.py" in result.output

    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=root,
        env=corral_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "5 passed" in tests.stdout

    port_file = tmp_path / "url"
    server = subprocess.Popen(
        [BIN / "corral", "serve", str(root), "--port", "0", "--port-file", str(port_file)],
        env=corral_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, "corral serve did not start"
            time.sleep(0.05)
        url = port_file.read_text()
        # A client that knows nothing of the package: models come from the server's schemas.
        async with AsyncEnvClient(url) as env:
            result = await env.reset(seed=5)
            assert result.observation.hint == "start"
            assert env.server_info["limits"]["max_sessions"] == 64  # corral.yaml's
            low, high = 0, 100
            for _ in range(10):
                guess = (low + high) // 2
                result = await env.step({"guess": guess})
                if result.done:
                    break
                low, high = (
                    (guess + 1, high) if result.observation.hint == "higher" else (low, guess - 1)
                )
            assert result.observation.hint == "correct" and result.reward == 1.0
            state = await env.state()
            assert state.step_count == len(state.guesses)
    finally:
        server.terminate()
        server.wait(10)


def test_the_generated_files(tmp_path: Path) -> None:
    root = scaffold("my-game", tmp_path)
    manifest = load_manifest(root)
    assert manifest.name == "my-game" and manifest.entry_point == "my_game.env:MyGameEnv"
    lock = read_lock(manifest.lock_path)
    readme = (root / "README.md").read_text()
    # The contract tables come from the models.
    assert "### Action: `MyGameAction`" in readme
    assert "| `guess` | `int` | yes |" in readme
    assert "| `hint` | `Literal['start', 'higher', 'lower', 'correct']` |" in readme
    assert lock.fingerprint in readme
    dockerfile = (root / "Dockerfile").read_text()
    assert dockerfile == render_dockerfile(
        manifest, labels=image_labels(manifest, lock.fingerprint), base_image=manifest.image_base
    )
    assert "USER corral" in dockerfile and "HEALTHCHECK" in dockerfile
    pyproject = (root / "pyproject.toml").read_text()
    assert 'packages = ["my_game"]' in pyproject and "corral>=" in pyproject
    # Importing the scaffold to lock its schemas left this process as it was.
    assert "my_game" not in sys.modules and str(root) not in sys.path


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("Demo", "not a valid environment name.*'demo'"),
        ("9lives", "not a valid environment name.*'env_9lives'"),
        ("my env", "not a valid environment name.*'my_env'"),
        ("class", "is a Python keyword"),
        ("json", "already importable"),
        ("corral", "already importable"),
    ],
)
def test_bad_names(name: str, match: str) -> None:
    with pytest.raises(InitError, match=match):
        names_for(name)


def test_names() -> None:
    # Not "demo_env": other tests scaffold that one, and a scaffold's directory put on
    # sys.path in this process makes the name importable (which names_for refuses).
    names = names_for("qx_demo_env")
    assert (names.package, names.cls) == ("qx_demo_env", "QxDemo")
    assert names_for("gridworld").cls == "Gridworld"
    assert names_for("cart-pole-env").package == "cart_pole_env"


def test_an_existing_directory_is_refused_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "taken_env_x").mkdir()
    (tmp_path / "taken_env_x" / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["init", "taken_env_x", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "already exists and is not empty" in result.output
    result = runner.invoke(app, ["init", "taken_env_x", "--dir", str(tmp_path), "--force"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "taken_env_x" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "taken_env_x" / "corral.yaml").is_file()
    result = runner.invoke(app, ["init", "Bad Name", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "not a valid environment name" in result.output


def test_the_install_command_names_where_this_corral_comes_from(tmp_path: Path) -> None:
    # This suite runs from an editable install of the source tree.
    assert Path(corral_source()) == Path(__file__).resolve().parents[2]
    assert install_command() == f"pip install {corral_source()} -e '.[test]'"
    root = scaffold("install_me_env", tmp_path)
    assert install_command() in (root / "README.md").read_text()
    result = runner.invoke(app, ["init", "install_me_too_env", "--dir", str(tmp_path)])
    assert install_command() in result.output


@pytest.mark.network
@pytest.mark.slow
def test_the_scaffold_installs_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    """The printed install command works where corral is not installed (nor on PyPI)."""
    root = scaffold("fresh_venv_env", tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    install = subprocess.run(
        ["bash", "-c", install_command()],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    # Importable from anywhere, and its own tests pass in that virtualenv.
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import fresh_venv_env, corral; print('ok')"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.stdout.strip() == "ok", where.stderr
    tests = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]

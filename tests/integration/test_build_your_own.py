"""docs/build-your-own.md works as printed: its commands, then its client code.

The commands up to ``corral build`` run everywhere; ``corral build`` and what follows
need a Docker engine (and the package index, for the image's wheels).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support.docker_fixtures import DEMO_IMAGE_GROUP, untag

# One worker runs the whole page: the walkthrough (a module fixture) is made once, and the
# build that ends it holds the fixed tag the README's image snippet builds too.
pytestmark = pytest.mark.xdist_group(DEMO_IMAGE_GROUP)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "build-your-own.md"
README = ROOT / "README.md"
BIN = Path(sys.executable).parent


def console_commands(text: str) -> list[str]:
    """The ``$ ...`` lines of the ``console`` blocks, in order."""
    blocks = re.findall(r"```console\n(.*?)```", text, flags=re.S)
    return [line[2:].strip() for block in blocks for line in block.splitlines() if line[:2] == "$ "]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@dataclass
class Walk:
    workdir: Path
    env_dir: Path
    before_build: list[str]
    from_build: list[str]


def run(
    commands: list[str], cwd: Path, *, pwd: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``commands`` in one shell (so that ``cd`` carries over); ``pwd`` prints the last
    directory at the end."""
    script = "set -euo pipefail\n" + "\n".join(commands) + ("\npwd\n" if pwd else "\n")
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env={
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            # Wide enough that no table cell wraps.
            "COLUMNS": "400",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Walk:
    """The walkthrough run up to ``corral build``, in a fresh directory."""
    commands = console_commands(DOC.read_text())
    split = next(i for i, c in enumerate(commands) if c.startswith("corral build"))
    workdir = tmp_path_factory.mktemp("walkthrough")
    done = run(commands[:split], workdir, pwd=True)
    assert done.returncode == 0, done.stdout + done.stderr
    env_dir = Path(done.stdout.strip().splitlines()[-1])
    return Walk(workdir, env_dir, commands[:split], commands[split:])


def test_the_page_is_the_readme_sequence() -> None:
    commands = console_commands(DOC.read_text())
    assert commands[:2] == ["corral init demo_env", "cd demo_env"]
    assert "corral validate" in commands and "corral build" in commands
    readme = console_commands(README.read_text())
    assert readme == [
        "corral init demo_env && cd demo_env && corral validate && corral build && corral validate"
    ]


def test_the_walkthrough_up_to_the_build(walk: Walk) -> None:
    assert walk.env_dir == walk.workdir / "demo_env"
    for name in ("corral.yaml", "corral.lock.json", "Dockerfile", "README.md"):
        assert (walk.env_dir / name).is_file()
    assert walk.before_build.count("corral validate") == 1


def test_the_client_code_plays_an_episode(walk: Walk) -> None:
    # The page's first Python block, as a script, against 'corral serve .' as the page says.
    port_file = walk.workdir / "url"
    server = subprocess.Popen(
        [BIN / "corral", "serve", ".", "--port", "0", "--port-file", str(port_file)],
        cwd=walk.env_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    script = walk.env_dir / "play.py"
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        block = python_blocks(DOC.read_text())[0]
        script.write_text(block.replace("http://127.0.0.1:8000", port_file.read_text()))
        played = run([f"{sys.executable} play.py"], walk.env_dir)
        assert played.returncode == 0, played.stdout + played.stderr
        assert played.stdout.split() == ["correct", "1.0"]
    finally:
        script.unlink(missing_ok=True)
        server.terminate()
        server.wait(10)


def checks(stdout: str) -> dict[str, dict[str, str]]:
    return {c["id"]: c for c in json.loads(stdout)["checks"]}


@pytest.mark.docker
@pytest.mark.network
def test_build_then_validate_the_image(walk: Walk, docker_client: Any, base_image: str) -> None:
    try:
        done = run(walk.from_build, walk.env_dir, CORRAL_BASE_IMAGE=base_image)
        assert done.returncode == 0, done.stdout + done.stderr
        docker_client.images.get("corral-demo_env:0.1.0")
        # The second validate ran the image too, not only the source.
        for check in ("docker.start", "docker.contract", "docker.roundtrip", "docker.stop"):
            assert re.search(rf"PASS\W+docker\W+{re.escape(check)}:", done.stdout), done.stdout
        # Changed models make the image stale: plain validate says so, --docker fails.
        models = walk.env_dir / "demo_env" / "models.py"
        guess = 'description="The number guessed.")\n'
        models.write_text(models.read_text().replace(guess, guess + '    note: str = ""\n'))
        stale = run(["corral validate --json"], walk.env_dir)
        assert stale.returncode == 0, stale.stdout
        assert "built from other models" in checks(stale.stdout)["docker.start"]["detail"]
        forced = run(["corral validate --docker --json"], walk.env_dir)
        assert forced.returncode == 1
        assert "rebuild the image" in checks(forced.stdout)["docker.contract"]["detail"]
    finally:
        untag(docker_client, "corral-demo_env:0.1.0")

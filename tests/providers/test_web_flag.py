"""The web UI in images: off unless asked for, on in a pushed Space."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.providers.dockerfile import render_dockerfile, serve_command
from corral.providers.hfspace import stage_space
from corral.providers.manifest import load_manifest


def _manifest(tmp_path: Path):
    (tmp_path / "corral.yaml").write_text(
        "name: echo\nversion: 1.0.0\nentry_point: corral.envs.echo:EchoEnv\nport: 7860\n"
    )
    return load_manifest(tmp_path)


def _cmd(dockerfile: str) -> list[str]:
    line = next(line for line in dockerfile.splitlines() if line.startswith("CMD "))
    return json.loads(line.removeprefix("CMD "))


def test_the_dockerfile_serves_the_ui_only_when_asked(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    assert "--web" not in _cmd(render_dockerfile(manifest, labels={}))
    cmd = _cmd(render_dockerfile(manifest, labels={}, web=True))
    assert cmd == serve_command(manifest, "0.0.0.0", 7860, web=True)
    assert cmd[-1] == "--web" and cmd[:4] == ["python", "-m", "corral", "serve"]


@pytest.mark.network
def test_a_space_serves_the_ui(tmp_path: Path) -> None:
    (tmp_path / "env").mkdir()
    _manifest(tmp_path / "env")
    staged = stage_space(tmp_path / "env", tmp_path / "space", "me/echo")
    assert _cmd((staged.directory / "Dockerfile").read_text())[-1] == "--web"

"""``corral build`` and ``corral push`` through typer's CliRunner."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.docker_fixtures import untag
from tests.support.fakehub import FakeHub, running_fake_hub
from typer.testing import CliRunner

import corral
from corral.cli.main import app

runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture
def echo_dir(tmp_path: Path) -> Path:
    (tmp_path / "corral.yaml").write_text(
        "name: echo\nversion: 0.2.0\nentry_point: corral.envs.echo:EchoEnv\n"
        "description: Echoes messages back.\n"
    )
    return tmp_path


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    with running_fake_hub() as hub:
        yield hub


def test_build_reports_manifest_errors_without_an_engine(tmp_path: Path) -> None:
    (tmp_path / "corral.yaml").write_text("name: echo\nentry_point: nope\n")
    result = runner.invoke(app, ["build", str(tmp_path)])
    assert result.exit_code == 2
    assert "entry_point: 'nope' is not an entry point" in result.output


@pytest.mark.docker
@pytest.mark.network
def test_build_offline_on_the_local_base_image(
    echo_dir: Path, docker_client: Any, base_image: str
) -> None:
    tag = "corral-test-cli-echo:0.2.0"
    try:
        result = runner.invoke(
            app, ["build", str(echo_dir), "--base-image", base_image, "--offline", "--tag", tag]
        )
        assert result.exit_code == 0, result.output
        # The title, then the one-line summary: the raw output is behind -v.
        lines = result.output.splitlines()
        assert lines[0] == "building echo …" and len(lines) == 2, result.output
        assert lines[1].startswith(f"built {tag} (sha256:")
        assert (
            f"offline, {image_pins(echo_dir)} pinned distributions, from {base_image}" in lines[1]
        )
        assert "--platform" not in result.output and "Step 1/" not in result.output
        image = docker_client.images.get(tag)
        assert image.labels["org.corral.version"] == "0.2.0"
        dockerfile = (echo_dir / ".corral" / "build" / "Dockerfile").read_text()
        assert f"FROM {base_image} AS install" in dockerfile and "--no-index" in dockerfile
    finally:
        untag(docker_client, tag)


def image_pins(env_dir: Path) -> int:
    lock = (env_dir / ".corral" / "build" / "requirements.lock").read_text()
    return len([line for line in lock.splitlines() if line and not line.startswith("#")])


def test_push_refuses_a_bad_repo_id(echo_dir: Path) -> None:
    result = runner.invoke(app, ["push", str(echo_dir), "--repo-id", "just-a-name"])
    assert result.exit_code == 2
    assert "repo id 'just-a-name' must be OWNER/NAME" in result.output
    assert not (echo_dir / ".corral").exists()


def test_push_needs_a_repo_id(echo_dir: Path) -> None:
    result = runner.invoke(app, ["push", str(echo_dir)])
    assert result.exit_code == 2
    assert "--repo-id" in result.output


@pytest.mark.network
def test_push_dry_run_stages_and_uploads_nothing(echo_dir: Path) -> None:
    result = runner.invoke(app, ["push", str(echo_dir), "--repo-id", "me/echo", "--dry-run"])
    assert result.exit_code == 0, result.output
    staged = echo_dir / ".corral" / "space"
    assert f"staged {staged} (5 files) in " in result.output
    for name in (
        "Dockerfile",
        "README.md",
        "requirements.lock",
        "app/corral.yaml",
        f"wheels/corral-{corral.__version__}-py3-none-any.whl",
    ):
        assert f"  {name}\n" in result.output
        assert (staged / name).is_file()
    front = result.output.split("front matter:\n", 1)[1].split("dry run:", 1)[0]
    assert yaml.safe_load(front)["sdk"] == "docker"
    assert "dry run: nothing uploaded." in result.output


@pytest.mark.network
def test_push_uploads(
    echo_dir: Path, fake_hub: FakeHub, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.mktemp("space") / "staged"
    result = runner.invoke(
        app,
        [
            "push",
            str(echo_dir),
            "--repo-id",
            "me/echo",
            "--out",
            str(out),
            "--token",
            "hf_test_token",
            "--endpoint",
            fake_hub.url,
            "--private",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"pushed {fake_hub.url}/spaces/me/echo (commit c0ffeec0ffee)" in result.output
    (create,) = fake_hub.of("/api/repos/create")
    assert create.json()["visibility"] == "private" or create.json().get("private") is True
    assert len(fake_hub.of("/api/spaces/me/echo/commit/main")) == 1


@pytest.mark.network
@pytest.mark.network
def test_push_to_an_unreachable_hub_says_so_in_one_line(echo_dir: Path) -> None:
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        result = runner.invoke(
            app, ["push", str(echo_dir), "--repo-id", "me/echo", "--endpoint", url]
        )
    assert result.exit_code == 1
    staged = echo_dir / ".corral" / "space"
    lines = result.output.splitlines()
    assert lines[0] == "staging echo for me/echo …"
    assert lines[1].startswith(f"staged {staged} (")
    assert lines[2].startswith(f"error: the Hugging Face Hub at {url} is unreachable (")
    assert lines[2].endswith(f"The Space is staged in {staged}: push again when online")
    assert len(lines) == 3 and (staged / "Dockerfile").is_file()


@pytest.mark.network
def test_push_with_a_rejected_token(echo_dir: Path, fake_hub: FakeHub) -> None:
    result = runner.invoke(
        app,
        [
            "push",
            str(echo_dir),
            "--repo-id",
            "me/echo",
            "--token",
            "bad",
            "--endpoint",
            fake_hub.url,
        ],
    )
    assert result.exit_code == 1
    assert "upload failed:" in result.output and "401" in result.output

"""Fixtures of the provider tests (the Docker engine ones live in tests/support)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.docker_fixtures import base_image, docker_client, untag

from corral.providers.docker import BuiltImage, build_image

__all__ = ["base_image", "docker_client", "echo_env_dir", "echo_image"]


@pytest.fixture(scope="session")
def echo_env_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An environment directory serving corral's echo env."""
    env = tmp_path_factory.mktemp("echo-env")
    (env / "corral.yaml").write_text(
        "name: echo\nversion: 0.1.0\nentry_point: corral.envs.echo:EchoEnv\nport: 8000\n"
        "resources:\n  cpu: 0.5\n  memory: 256Mi\n  pids: 128\n"
        "concurrency:\n  max_sessions: 8\n"
    )
    return env


@pytest.fixture(scope="session")
def echo_image(docker_client: Any, base_image: str, echo_env_dir: Path) -> Iterator[BuiltImage]:
    """The echo env's image, built once for the Docker tests (a tag of this session's own:
    test sessions may share the engine)."""
    lines: list[str] = []
    built = build_image(
        echo_env_dir,
        f"corral-test-echo:{uuid.uuid4().hex[:12]}",
        base_image=base_image,
        offline=True,
        progress=lines.append,
        client=docker_client,
    )
    print(f"\nbuilt {built.tag} in {built.seconds:.1f} s")
    assert any(line.startswith("Step ") for line in lines), lines[-20:]
    yield built
    untag(docker_client, built.tag)

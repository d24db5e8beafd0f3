"""Fixtures of the provider tests (the Docker ones live in tests/support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.docker_fixtures import base_image, docker_client

__all__ = ["base_image", "docker_client", "echo_env_dir"]


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

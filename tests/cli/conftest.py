"""Fixtures of the CLI tests."""

from pathlib import Path

import pytest
from tests.support.docker_fixtures import base_image, docker_client

__all__ = ["base_image", "docker_client"]


@pytest.fixture
def echo_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An environment directory serving corral's echo env."""
    env = tmp_path_factory.mktemp("echo-env")
    (env / "corral.yaml").write_text(
        "name: echo\nentry_point: corral.envs.echo:EchoEnv\nconcurrency:\n  max_sessions: 8\n"
    )
    return env

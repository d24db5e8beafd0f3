"""Docker fixtures shared by the provider and CLI tests.

They skip, with the reason, when no engine answers or the base image is missing (run
``.ci/docker-setup.sh`` first). With ``CORRAL_REQUIRE_DOCKER=1`` (set by CI after the
setup script) they fail instead, so that a broken setup cannot pass as skipped tests.
Import them into a ``conftest.py`` to use them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

BASE_IMAGE = os.environ.get("CORRAL_BASE_IMAGE", "corral-base:bookworm")


def _unavailable(reason: str) -> None:
    if os.environ.get("CORRAL_REQUIRE_DOCKER") == "1":
        pytest.fail(f"CORRAL_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A client of a live Docker engine (skips when there is none)."""
    try:
        import docker
    except ImportError:
        _unavailable("the docker SDK is not installed (pip install 'corral[docker]')")
    try:
        client = docker.from_env(version="auto")
        client.ping()
    except Exception as exc:
        _unavailable(f"no Docker engine ({exc}); run .ci/docker-setup.sh")
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    """The locally bootstrapped base image (Debian bookworm with python3)."""
    import docker.errors

    try:
        docker_client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        _unavailable(f"base image {BASE_IMAGE} is missing; run .ci/docker-setup.sh")
    return BASE_IMAGE

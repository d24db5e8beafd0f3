"""Docker fixtures shared by the provider and CLI tests.

They skip, with the reason, when no engine answers or the base image is missing (run
``.ci/docker-setup.sh`` first). With ``CORRAL_REQUIRE_DOCKER=1`` (set by CI after the
setup script) they fail instead, so that a broken setup cannot pass as skipped tests.
Import them into a ``conftest.py`` to use them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

BASE_IMAGE = os.environ.get("CORRAL_BASE_IMAGE", "corral-base:bookworm")
DEMO_IMAGE_GROUP = "docker:corral-demo_env"
"""The xdist group of the tests that build the pages' scaffold as ``corral-demo_env:0.1.0``
(a fixed tag: they must not run at once), apart from the ``docker`` group, so that the two
longest chains of image builds run on two workers (``tests/conftest.py``)."""


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


def untag(client: Any, tag: str) -> None:
    """Remove the image ``tag`` names, as little as that takes.

    By tag, never by image id: another test session on the same engine (an engineer's
    beside CI's) that built the same Dockerfile holds the same id under its own tag. And
    without pruning the untagged parents: they are the build cache that such a session's
    build may be reading at that moment (pruned, it fails with "No such image").
    """
    import docker.errors

    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(tag, force=True, noprune=True)

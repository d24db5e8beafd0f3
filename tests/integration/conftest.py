"""Fixtures of the integration tests (the Docker ones live in tests/support)."""

from tests.support.docker_fixtures import base_image, docker_client

__all__ = ["base_image", "docker_client"]

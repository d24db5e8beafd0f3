"""Fixtures of the CLI tests."""

from tests.support.docker_fixtures import base_image, docker_client

__all__ = ["base_image", "docker_client"]

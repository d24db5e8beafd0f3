"""The client layer: async client, its sync twin, the local server launcher."""

from corral.client.async_client import AsyncEnvClient
from corral.client.connection import Connection
from corral.client.launcher import LocalServer, ServerStartError
from corral.client.sync_client import SyncEnvClient

__all__ = ["AsyncEnvClient", "Connection", "LocalServer", "ServerStartError", "SyncEnvClient"]

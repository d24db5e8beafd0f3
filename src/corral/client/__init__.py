"""The client layer: async client, its sync twin, the pool, the local server launcher.

``EnvPool`` and friends need numpy (``pip install 'corral[numpy]'``); they are imported
on first use so that the plain clients work without it.
"""

from typing import Any

from corral.client.connection import Connection
from corral.client.env_client import AsyncEnvClient, SyncEnvClient
from corral.client.local_server import LocalServer
from corral.errors import ServerStartError

_POOL_NAMES = frozenset({"AutoresetMode", "EnvPool", "PoolBatch", "PoolError", "SyncEnvPool"})


def __getattr__(name: str) -> Any:
    if name in _POOL_NAMES:
        from corral.client import pool

        return getattr(pool, name)
    raise AttributeError(f"module 'corral.client' has no attribute {name!r}")


__all__ = [
    "AsyncEnvClient",
    "AutoresetMode",
    "Connection",
    "EnvPool",
    "LocalServer",
    "PoolBatch",
    "PoolError",
    "ServerStartError",
    "SyncEnvClient",
    "SyncEnvPool",
]

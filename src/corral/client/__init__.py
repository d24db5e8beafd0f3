"""The client layer: the async client and its sync twin, the pool, their settings.

``EnvPool`` and friends need numpy (``pip install 'corral[numpy]'``); they are imported
on first use so that the plain clients work without it.

The machinery underneath has its own modules: :mod:`~corral.client.connection` (one
WebSocket connection), :mod:`~corral.client.local_server` (a server in a local
subprocess), :mod:`~corral.client.typed`, :mod:`~corral.client.fleet`,
:mod:`~corral.client.batch` and :mod:`~corral.client.health`.
"""

from typing import TYPE_CHECKING, Any

from corral.client.env_client import AsyncEnvClient, SyncEnvClient
from corral.protocol.client import ReconnectPolicy

if TYPE_CHECKING:
    from corral.client.pool import AutoresetMode, EnvPool, PoolBatch, PoolError, SyncEnvPool

_POOL_NAMES = frozenset({"AutoresetMode", "EnvPool", "PoolBatch", "PoolError", "SyncEnvPool"})


def __getattr__(name: str) -> Any:
    if name in _POOL_NAMES:
        from corral.client import pool

        return getattr(pool, name)
    raise AttributeError(f"module 'corral.client' has no attribute {name!r}")


__all__ = [
    "AsyncEnvClient",
    "AutoresetMode",
    "EnvPool",
    "PoolBatch",
    "PoolError",
    "ReconnectPolicy",
    "SyncEnvClient",
    "SyncEnvPool",
]

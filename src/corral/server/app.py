"""``create_app``: an ASGI application serving one environment class."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, WebSocket

from corral.server.config import ServerConfig
from corral.server.http import info_router
from corral.server.service import EnvService
from corral.server.ws import FallbackHandler, ws_endpoint


def create_app(
    env: Any,
    config: ServerConfig | None = None,
    *,
    fallback: FallbackHandler | None = None,
    **overrides: Any,
) -> FastAPI:
    """Build the ASGI app serving ``env`` (an Environment subclass or a factory).

    Args:
        env: the environment class, or a zero-argument factory returning an instance.
        config: limits and timers; keyword ``overrides`` replace single fields.
        fallback: handler for WebSockets that ask for no corral subprotocol.

    The app is run by uvicorn (see :func:`corral.server.serve`); the service it wraps is
    reachable as ``app.state.service``.
    """
    cfg = config or ServerConfig()
    if overrides:
        cfg = ServerConfig(**{**cfg.__dict__, **overrides})
    service = EnvService(env, cfg)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.manager.start()
        try:
            yield
        finally:
            await service.batches.shutdown()
            await service.manager.shutdown()

    app = FastAPI(
        title=f"corral: {service.contract.name}",
        version="1.0.0",
        description=service.env_type.description,
        lifespan=lifespan,
    )
    app.state.service = service
    app.include_router(info_router(service))

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await ws_endpoint(websocket, service, fallback)

    return app

"""``create_app``: an ASGI application serving one environment class."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, WebSocket

from corral.server.auth import auth_router
from corral.server.config import ServerConfig
from corral.server.docs import docs_router
from corral.server.edge import install_edge
from corral.server.http import PROBE_PATHS, info_router
from corral.server.http_limits import HttpLimits
from corral.server.metrics import metrics_router
from corral.server.openenv import openenv_fallback, openenv_router, personality_of
from corral.server.render import render_router
from corral.server.service import EnvService
from corral.server.status import status_router
from corral.server.tasks import tasks_router
from corral.server.webui import is_public, regression_router, web_router
from corral.server.workers import Worker, WorkerPool, env_reference
from corral.server.ws import FallbackHandler, ws_endpoint


def create_app(
    env: Any,
    config: ServerConfig | None = None,
    *,
    fallback: FallbackHandler | None = None,
    openenv: bool = True,
    service: EnvService | None = None,
    **overrides: Any,
) -> FastAPI:
    """Build the ASGI app serving ``env`` (an Environment subclass or a factory).

    Args:
        env: the environment class, or a zero-argument factory returning an instance.
        config: limits and timers; keyword ``overrides`` replace single fields.
        fallback: handler for WebSockets that ask for no corral subprotocol (default:
            OpenEnv's envelope, when ``openenv`` is on).
        openenv: serve OpenEnv clients too: the ``/ws`` envelope for connections
            without a corral subprotocol, and ``/reset`` ``/step`` ``/state`` ``/mcp``
            ``/sessions`` over HTTP (see :mod:`corral.server.openenv`).
        service: the service to serve (default: a new one for ``env`` and the config);
            :mod:`corral.testing` gives the one its in-process sockets already reach.

    The app is run by uvicorn (see :func:`corral.server.serve`); the service it wraps is
    reachable as ``app.state.service``. With ``config.token`` set, every route and the
    WebSocket require ``Authorization: Bearer <token>``. With ``config.web`` the web UI
    is served at ``/web`` (:mod:`corral.server.webui`). With ``config.workers > 0`` the
    environments live in that many worker processes (:mod:`corral.server.workers`),
    started with the app.

    Raises:
        ValueError: workers were asked for and ``env`` cannot be imported by name.
    """
    cfg = config or ServerConfig()
    if overrides:
        cfg = ServerConfig(**{**cfg.__dict__, **overrides})
    service = service if service is not None else EnvService(env, cfg)
    workers = _worker_pool(env, service) if cfg.workers else None
    # The one place that tells a corral environment from an OpenEnv one: every route
    # below that answers differently asks this object.
    personality = personality_of(service)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if workers is not None:
            await workers.start()
        service.manager.start()
        try:
            yield
        finally:
            await service.shutdown()
            await personality.close()
            if workers is not None:
                await workers.shutdown()

    app = FastAPI(
        title=f"corral: {service.contract.name}",
        version="1.0.0",
        description=service.env_type.description,
        lifespan=lifespan,
        # FastAPI's pages load their assets from a CDN: served locally or not at all.
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    app.state.workers = workers
    app.include_router(info_router(service, personality))
    # First of the rest: an environment's own page (its custom /web) is what its users see.
    app.router.routes.extend(personality.own_routes())
    if openenv:
        app.include_router(openenv_router(personality))
        fallback = fallback or openenv_fallback(personality)
    app.include_router(metrics_router(service))
    docs = docs_router(app.title)
    if docs is not None:
        app.include_router(docs)
    if cfg.web:
        app.include_router(web_router())
        app.include_router(render_router(service))
        app.include_router(status_router(service))
        app.include_router(regression_router(cfg.max_frame_bytes))
        if cfg.token is not None:
            app.include_router(auth_router(cfg.token))
    app.include_router(tasks_router(personality.tasks))  # last: /{env}/... shadows nothing
    # Added first, so the access rules (install_edge, after) run before any body is read.
    app.add_middleware(
        HttpLimits, max_body_bytes=cfg.max_frame_bytes, body_timeout_s=cfg.http_body_timeout_s
    )
    web = cfg.web

    def public(path: str) -> bool:
        # The probes' twins answer a status code only (corral.server.http.PROBE_PATHS).
        return path in PROBE_PATHS or (web and is_public(path))

    edge = install_edge(app, service, public=public)

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await ws_endpoint(websocket, edge, fallback)

    return app


def _worker_pool(env: Any, service: EnvService) -> WorkerPool:
    """Worker processes for ``service``'s sessions; their death closes their sessions."""
    config = service.config
    pool = WorkerPool(
        env_reference(env),
        config.workers,
        config,
        service.contract,
        thread_affinity=service.env_type.thread_affinity,
    )
    manager = service.manager
    manager.runner_factory = pool.create_runner

    async def close_sessions(worker: Worker, reason: str) -> None:
        lost = [s for s in manager.sessions.values() if getattr(s.runner, "worker", None) is worker]
        for session in lost:
            await manager.close(session, f"its worker process died: {reason}")

    pool.on_death = close_sessions
    service.readiness_checks.append(lambda: pool.unavailable(manager.active))
    service.workers = pool
    return pool

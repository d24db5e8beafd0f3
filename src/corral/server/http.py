"""Plain HTTP routes: liveness, readiness, schema and metadata.

``/livez`` and ``/readyz`` are the probes' twins of ``/health`` and ``/ready``: the same
status codes with an empty body, served without the bearer token (:data:`PROBE_PATHS`).
A kubelet's ``httpGet`` probe cannot read a token from a Secret, and an ``exec`` probe
that can starts a Python per probe (51-66 ms of CPU each, 12-16 % of a 250m Pod, issue
30.17); an up/ready bit is all these two disclose.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from corral.server.openenv import Personality
from corral.server.service import EnvService

PROBE_PATHS = ("/livez", "/readyz")
"""Served without authentication: a status code and no body."""


def info_router(service: EnvService, personality: Personality) -> APIRouter:
    """``/health``, ``/ready``, ``/schema`` and ``/metadata`` for ``service``; the last two
    are answered by the environment's ``personality`` (corral's or OpenEnv's)."""
    router = APIRouter()

    @router.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness: the process serves requests (``degraded`` while worker processes
        are being restarted, with their state); and the environment's preflight facts
        (the coding environment's sandbox mode)."""
        workers = service.workers
        if workers is None:
            return {"status": "healthy", **service.facts}
        report = workers.report()
        status = "degraded" if report["down"] else "healthy"
        return {"status": status, **service.facts, "workers": report}

    @router.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 while a new session can be accepted now, else 503; while the
        server drains, ``draining`` says how many sessions it still holds and how long
        is left."""
        manager = service.manager
        ready, reason = service.readiness()
        body: dict[str, Any] = {
            "ready": ready,
            "reason": reason,
            "active_sessions": manager.active,
            "max_sessions": service.config.max_sessions,
            "instance": service.instance,
            "server_id": service.server_id,
        }
        drain = service.draining
        if drain.draining:
            body["draining"] = {
                "phase": str(drain.phase),
                "deadline_s": round(drain.remaining(time.monotonic()), 3),
                "sessions": manager.active,
            }
        if service.workers is not None:
            body["workers"] = service.workers.report()
        headers = {} if body["ready"] else {"Retry-After": "1"}
        return JSONResponse(body, status_code=200 if body["ready"] else 503, headers=headers)

    @router.get("/livez", include_in_schema=False)
    async def livez() -> Response:
        """``/health`` for a probe: 200, no body."""
        return Response(status_code=200)

    @router.get("/readyz", include_in_schema=False)
    async def readyz() -> Response:
        """``/ready`` for a probe: 200 or 503, no body."""
        ready, _ = service.readiness()
        return Response(status_code=200 if ready else 503)

    @router.get("/schema")
    async def schema() -> dict[str, Any]:
        """The one contract: the JSON Schemas of Action, Observation and the environment's
        real State, as the corral/1 handshake gives them, with version and fingerprint."""
        return personality.schema()

    @router.get("/metadata")
    async def metadata() -> Response:
        """The environment's name, description, version (and contract, for corral's)."""
        return await personality.metadata()

    return router

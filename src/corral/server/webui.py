"""The web UI: static ES modules under ``/web/``, shipped as package data.

Nothing is built or fetched: the files in ``corral/server/web/`` are read once when the
app is made and served from memory with a strict Content-Security-Policy (scripts from
this origin only, no inline script, connections to this origin only, nothing from a
CDN). ``/`` and ``/web`` redirect to ``/web/``. The UI talks to the server through the
public protocol and routes only (``/ws`` with ``corral/1`` and the JSON codec,
``/schema``, ``/metadata``, ``/mcp``, ``/render``, ``/status``, ``/regression``);
nothing in the server treats it differently from any other client.

``POST /regression`` turns an episode file (``corral.episodes``' format, as the UI
exports it) into a pytest module with :func:`corral.regression.pytest_module`, the one
template ``corral replay --pytest`` also writes. When the served environment can be
imported back by name (:func:`env_target`), the module names it, so that it starts a
server of its own once the one it came from is gone (``$CORRAL_URL`` still wins); the
reply's ``X-Corral-Env-Target`` header says which. Otherwise the module replays against
the ``url`` the UI gives.
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from corral.episodes import EpisodeFormatError, read
from corral.errors import CorralError, FrameTooLarge, InvalidArgument
from corral.regression import pytest_module
from corral.server.target import load_target
from corral.server.workers import env_reference

WEB_DIR = Path(__file__).with_name("web")
"""Where the UI's static files live (package data)."""

PREFIX = "/web/"

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        # Inline styles only: an environment's own view (render_html) is shown in a
        # sandboxed srcdoc frame, which inherits this policy and may style itself.
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "frame-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        # A Hugging Face Space shows its app in a frame on huggingface.co.
        "frame-ancestors 'self' https://huggingface.co",
    ]
)
"""The Content-Security-Policy of every UI file."""

_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Asset:
    """One static file, held in memory."""

    body: bytes
    media_type: str
    etag: str


def load_assets(root: Path = WEB_DIR) -> dict[str, Asset]:
    """The UI's files by name (flat: the UI has no subdirectories)."""
    assets = {}
    for path in sorted(root.iterdir()):
        if not path.is_file() or path.name.startswith("."):
            continue
        body = path.read_bytes()
        media = _TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0]
        etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        assets[path.name] = Asset(body, media or "application/octet-stream", etag)
    return assets


def is_public(path: str) -> bool:
    """Paths served without authentication: the redirects and the static files, which
    hold no data and must load before the UI can ask for a token."""
    return path in ("/", "/web") or path.startswith(PREFIX)


def web_router(assets: dict[str, Asset] | None = None) -> APIRouter:
    """``/``, ``/web`` and ``/web/{file}``."""
    files = assets if assets is not None else load_assets()
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    @router.get("/web")
    async def to_ui(request: Request) -> RedirectResponse:
        # Relative ("/" and "/web" both resolve "web/" to "/web/"), so the redirect stays
        # right behind a proxy that mounts the app on a prefix.
        query = request.url.query
        return RedirectResponse("web/" + (f"?{query}" if query else ""), status_code=307)

    @router.get(PREFIX)
    @router.get(PREFIX + "{name}")
    async def asset(request: Request, name: str = "index.html") -> Response:
        found = files.get(name)
        if found is None:
            return Response(
                f"no such file in the web UI: {name}", status_code=404, media_type="text/plain"
            )
        headers = {
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
            "ETag": found.etag,
        }
        if request.headers.get("if-none-match") == found.etag:
            return Response(status_code=304, headers=headers)
        return Response(found.body, media_type=found.media_type, headers=headers)

    return router


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body, refused as soon as it outgrows ``limit`` bytes.

    Raises:
        FrameTooLarge: the body is larger than ``limit``.
    """
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise FrameTooLarge(
                f"the request is over the {limit}-byte limit", details={"limit": limit}
            )
        chunks.append(chunk)
    return b"".join(chunks)


def error_reply(exc: CorralError) -> JSONResponse:
    """``{code, message, details}`` with the status the UI's routes use for ``exc``."""
    status = (
        413 if isinstance(exc, FrameTooLarge) else 422 if isinstance(exc, InvalidArgument) else 500
    )
    return JSONResponse(exc.to_wire(), status_code=status)


def env_target(factory: Any) -> str | None:
    """The ``module:Name`` that imports ``factory`` (the served class or factory) back,
    or None when nothing does: defined in ``__main__`` or a function, made at run time
    (an adapter's generated class), or a name that now means something else."""
    try:
        reference = env_reference(factory)
        found = load_target(reference)
    except (ValueError, ImportError):
        return None
    return reference if found is factory else None


def regression_router(limit: int) -> APIRouter:
    """``POST /regression``: an episode file in, a pytest module out."""
    router = APIRouter(tags=["web"])

    @router.post(
        "/regression",
        summary="An episode file as a pytest regression test",
        response_class=Response,
        responses={200: {"content": {"text/x-python": {"schema": {"type": "string"}}}}},
    )
    async def regression(
        request: Request,
        url: Annotated[
            str | None,
            Query(
                max_length=2048,
                description="The server the test replays against when $CORRAL_URL is not set.",
            ),
        ] = None,
    ) -> Response:
        service = getattr(request.app.state, "service", None)
        target = env_target(service.manager.factory) if service is not None else None
        try:
            body = await read_limited(request, limit)
            try:
                episodes = read(body)
                source = pytest_module(
                    episodes,
                    url=None if target else url,
                    env=target,
                    source="the web UI",
                )
            except (EpisodeFormatError, ValueError) as exc:
                raise InvalidArgument(f"not an episode file: {exc}") from None
        except CorralError as exc:
            return error_reply(exc)
        headers = {"X-Corral-Env-Target": target} if target else {}
        return Response(source, media_type="text/x-python", headers=headers)

    return router

"""``/docs`` and ``/redoc`` with their assets served locally, or not at all.

FastAPI's default pages load Swagger UI and ReDoc from a CDN, which a firewalled user
cannot reach. When the ``docs`` extra (``fastapi-offline``, which ships the built
assets) is installed, the pages are served with the assets from this server under
``/docs/assets/``; without it they are off rather than broken (``/openapi.json`` stays).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}


def assets_dir() -> Path | None:
    """Where the Swagger UI / ReDoc files are installed, or None without the extra."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        return None
    static = Path(spec.origin).parent / "static"
    return static if all((static / name).is_file() for name in ASSETS) else None


def docs_router(title: str, openapi_url: str = "/openapi.json") -> APIRouter | None:
    """``/docs``, ``/redoc`` and their assets, or None when the assets are not installed."""
    root = assets_dir()
    if root is None:
        return None
    router = APIRouter(include_in_schema=False)
    # Relative URLs (from /docs and /redoc), so a proxy's path prefix is kept.
    spec = openapi_url.lstrip("/")

    @router.get("/docs")
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=spec,
            title=f"{title} - Swagger UI",
            swagger_js_url="docs/assets/swagger-ui-bundle.js",
            swagger_css_url="docs/assets/swagger-ui.css",
            swagger_favicon_url="docs/assets/favicon.png",
        )

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=spec,
            title=f"{title} - ReDoc",
            redoc_js_url="docs/assets/redoc.standalone.js",
            redoc_favicon_url="docs/assets/favicon.png",
            with_google_fonts=False,
        )

    @router.get("/docs/assets/{name}")
    async def asset(name: str) -> Response:
        media = ASSETS.get(name)
        if media is None:
            return Response(status_code=404)
        return FileResponse(
            root / name, media_type=media, headers={"Cache-Control": "max-age=86400"}
        )

    return router

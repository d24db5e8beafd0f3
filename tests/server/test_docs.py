"""``/docs`` and ``/redoc`` load nothing from a CDN: local assets, or off."""

from __future__ import annotations

import re

import httpx
from tests.support.servers import running

from corral.envs.echo import EchoEnv
from corral.server import create_app
from corral.server import docs as docs_module


async def test_docs_pages_use_local_assets_only():
    with running(EchoEnv) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            for page in ("/docs", "/redoc"):
                reply = await http.get(page)
                assert reply.status_code == 200, page
                urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", reply.text)
                urls += re.findall(r"""url: ?['"]([^'"]+)['"]""", reply.text)
                assert urls, page
                for url in urls:
                    assert "://" not in url and not url.startswith("//"), (page, url)
                    if url.startswith("docs/assets/"):
                        asset = await http.get("/" + url)
                        assert asset.status_code == 200 and len(asset.content) > 1000, url
            assert (await http.get("/docs/assets/../../pyproject.toml")).status_code == 404
            assert (await http.get("/openapi.json")).status_code == 200


def test_without_the_assets_the_pages_are_off(monkeypatch):
    monkeypatch.setattr(docs_module, "assets_dir", lambda: None)
    app = create_app(EchoEnv)
    paths = {getattr(route, "path", "") for route in app.routes}
    assert "/docs" not in paths and "/redoc" not in paths
    assert "/openapi.json" in paths

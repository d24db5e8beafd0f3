"""Browser fixtures: Playwright driving Debian's headless Chromium (never a downloaded one).

One browser per test session; each test gets a fresh context (its own cookies) that
records every request it makes, and fails the test if any left 127.0.0.1 or if a page
threw an uncaught error. The tests skip, with the reason, when Chromium or Playwright is
missing (``.ci/setup-browser.sh`` installs Chromium); with ``CORRAL_REQUIRE_BROWSER=1``
(set by CI) they fail instead. ``CORRAL_WEB_SCREENSHOTS=DIR`` saves the screenshots some
tests take (the README's come from there).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

CHROMIUM = os.environ.get("CORRAL_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 20_000
"""How long a UI expectation may take on a loaded machine."""

LOCAL_SCHEMES = {"data", "blob", "about"}


def _unavailable(reason: str) -> None:
    if os.environ.get("CORRAL_REQUIRE_BROWSER") == "1":
        pytest.fail(f"CORRAL_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright, expect
    except ImportError:
        _unavailable("playwright is not installed (pip install 'corral[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"no Chromium at {CHROMIUM}; run .ci/setup-browser.sh")
    expect.set_options(timeout=TIMEOUT_MS)
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        await chromium.close()


@dataclass
class Traffic:
    """What the pages of one context did on the network and got wrong."""

    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def watch(self, page: Any) -> Any:
        page.on("websocket", lambda ws: self.requests.append(ws.url))
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        return page

    def foreign(self) -> list[str]:
        """Requests that went anywhere but 127.0.0.1 (or stayed in the page)."""
        out = []
        for url in self.requests:
            parts = urlsplit(url)
            if parts.scheme in LOCAL_SCHEMES:
                continue
            if parts.hostname != "127.0.0.1":
                out.append(url)
        return out


@pytest_asyncio.fixture(loop_scope="session")
async def context(browser: Any) -> AsyncIterator[tuple[Any, Traffic]]:
    """A fresh browser context and the traffic it records; checked when the test ends."""
    ctx = await browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 900})
    traffic = Traffic()
    ctx.on("request", lambda request: traffic.requests.append(request.url))
    ctx.on("page", traffic.watch)
    yield ctx, traffic
    await ctx.close()
    assert traffic.requests, "the test made no request at all"
    assert traffic.foreign() == [], "requests left 127.0.0.1"
    assert traffic.errors == [], "uncaught errors in the page"
